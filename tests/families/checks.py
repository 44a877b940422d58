"""Checks the family adapter tests share: fixture and registry, head geometry, layouts, generation, box formats.

The layout experiment itself is library code (``tests.layout_probe``); what is here needs pytest or
hypothesis, which are test dependencies only.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import strategies as st
from transformers.image_processing_utils import select_best_resolution

from tests.conftest import noise_image
from vrh_interp.core.description.boxes import Box, BoxParseFailure
from vrh_interp.core.description.families import adapter_for_config
from vrh_interp.core.description.families.base import BoxFrame, FamilyAdapter, VisualLayout
from vrh_interp.core.description.families.llava_next import tiled_canvas
from vrh_interp.core.description.heads import Head, HeadGeometry, HeadSet
from tests.layout_probe import (
    assert_changed_within_sampling,
    changed_positions,
    language_model_input,
    random_boxes,
)
from vrh_interp.core.description.tiny import TinyVLM


def assert_fixture_is_registered(tiny: TinyVLM, model_class: type, image_processor_class: type,
                                 adapter_class: type[FamilyAdapter]) -> FamilyAdapter:
    """The fixture is the real family, its vocabulary fits the tokenizer and the registry picks ``adapter_class``."""
    assert isinstance(tiny.model, model_class)
    assert isinstance(tiny.processor.image_processor, image_processor_class)
    assert tiny.model.config.get_text_config().vocab_size == len(tiny.processor.tokenizer)
    registered = adapter_for_config(tiny.model.config)
    assert type(registered) is adapter_class
    return registered


def text_config_geometry(text_config: Any, head_dim: int) -> HeadGeometry:
    """The head grid of ``text_config`` with the given ``head_dim`` (which families read differently)."""
    return HeadGeometry(
        num_layers=text_config.num_hidden_layers,
        num_heads=text_config.num_attention_heads,
        num_kv_heads=text_config.num_key_value_heads,
        head_dim=head_dim,
    )


def encode_noise_images(tiny: TinyVLM, adapter: FamilyAdapter, sizes: list[tuple[int, int]],
                        expressions: list[str] | None = None) -> Any:
    """One batch: row i is ``noise_image(*sizes[i])`` with the grounding prompt for ``expressions[i]`` ("x")."""
    prompts = [adapter.grounding_prompt(tiny.processor, expression) for expression in expressions or ["x"] * len(sizes)]
    return adapter.encode(tiny.processor, [noise_image(*size) for size in sizes], prompts)


def encode_noise_image(tiny: TinyVLM, adapter: FamilyAdapter, image_size: tuple[int, int],
                       expression: str = "x") -> Any:
    """The adapter's encoding of ``noise_image(*image_size)`` with the grounding prompt for ``expression``."""
    return encode_noise_images(tiny, adapter, [image_size], [expression])


def noise_image_layout(tiny: TinyVLM, adapter: FamilyAdapter, image_size: tuple[int, int]) -> VisualLayout:
    """The visual layout of ``encode_noise_image(tiny, adapter, image_size)``."""
    return adapter.visual_layout(encode_noise_image(tiny, adapter, image_size), image_size, tiny.processor)


def anyres_sample_spacing(image_size: tuple[int, int], grid_pinpoints: list[list[int]], tile_size: int) -> float:
    """LLaVA-NeXT-style anyres: the largest source-pixel step of NEAREST over the base view and the tile canvas."""
    width, height = image_size
    canvas = tiled_canvas((height, width), select_best_resolution((height, width), grid_pinpoints))
    new_h, new_w = canvas.resized
    return max(width / tile_size, height / tile_size, width / new_w, height / new_h)


def assert_layout_agrees_up_to_sampling(tiny: TinyVLM, adapter: FamilyAdapter, image_size: tuple[int, int],
                                        boxes: int, spacing: float) -> None:
    """The layout experiment on an image the processor downscales, for ``boxes`` random boxes: exact up to
    ``spacing``, the largest source-pixel step of the resampling (``assert_changed_within_sampling``)."""
    layout = noise_image_layout(tiny, adapter, image_size)
    for box in random_boxes(image_size, count=boxes, seed=image_size[0]):
        changed = changed_positions(tiny, adapter, noise_image(*image_size), box)
        assert_changed_within_sampling(layout, box, changed, spacing)


def assert_separators_are_image_newlines(tiny: TinyVLM, adapter: FamilyAdapter, encoding: Any,
                                         layout: VisualLayout) -> list[int]:
    """LLaVA-NeXT-style layouts: the visual positions in no block carry the model's ``image_newline`` (their
    layer-0 input is its RMS-normalised value: layer 0's RMSNorm has unit weight); returns those positions."""
    in_blocks = {p for block in layout.blocks for p in block.positions}
    newlines = [p for p in layout.visual_positions if p not in in_blocks]
    hidden = language_model_input(tiny, adapter, encoding)[0]
    newline = tiny.model.model.image_newline.detach()
    normalised = newline * torch.rsqrt(newline.pow(2).mean() + tiny.model.config.text_config.rms_norm_eps)
    assert torch.allclose(hidden[newlines], normalised.expand(len(newlines), -1), atol=1e-5)
    return newlines


def assert_generates(tiny: TinyVLM, encoding: Any, new_tokens: int = 3) -> None:
    """Greedy generation from ``encoding`` (one row) adds ``new_tokens`` tokens."""
    with torch.no_grad():
        generated = tiny.model.generate(**encoding, max_new_tokens=new_tokens, do_sample=False)
    assert generated.shape == (1, encoding["input_ids"].shape[1] + new_tokens)


@st.composite
def boxes_in_images(draw: st.DrawFn, divisions: int) -> tuple[Box, tuple[int, int]]:
    """A box at least two quantisation steps (side / ``divisions``) wide and high inside a random image."""
    width, height = draw(st.integers(8, 4000)), draw(st.integers(8, 4000))
    min_w, min_h = 2 * width / divisions, 2 * height / divisions
    x1 = draw(st.floats(0, width - min_w))
    y1 = draw(st.floats(0, height - min_h))
    x2 = draw(st.floats(x1 + min_w, width))
    y2 = draw(st.floats(y1 + min_h, height))
    return Box(x1, y1, x2, y2), (width, height)


@st.composite
def small_boxes_in_images(draw: st.DrawFn) -> tuple[Box, tuple[int, int]]:
    """A box 2-10 % of a random image's width and height (at least two 0.01 steps), anywhere inside it."""
    width, height = draw(st.integers(8, 4000)), draw(st.integers(8, 4000))
    fx, fy = draw(st.floats(0, 0.9)), draw(st.floats(0, 0.9))
    fw, fh = draw(st.floats(0.02, 0.1)), draw(st.floats(0.02, 0.1))
    return Box(fx * width, fy * height, (fx + fw) * width, (fy + fh) * height), (width, height)


def assert_round_trip(adapter: FamilyAdapter, box: Box, frame: BoxFrame, tolerance: tuple[float, float]) -> str:
    """``parse_box(format_box(box))`` is ``box`` within ``tolerance`` (x, y) per coordinate; returns the text."""
    text = adapter.format_box(box, frame)
    parsed = adapter.parse_box(text, frame)
    assert isinstance(parsed, Box), parsed
    tolerances = tolerance * 2
    assert all(abs(a - b) <= t + 1e-9 for a, b, t in zip(parsed.as_tuple(), box.as_tuple(), tolerances))
    return text


def assert_parses_to(adapter: FamilyAdapter, answer: str, frame: BoxFrame, expected: Box | None) -> None:
    """``answer`` parses to ``expected`` (approximately), or to a failure that keeps the answer when None."""
    parsed = adapter.parse_box(answer, frame)
    if expected is None:
        assert isinstance(parsed, BoxParseFailure) and parsed.text == answer
    else:
        assert isinstance(parsed, Box)
        assert parsed.as_tuple() == pytest.approx(expected.as_tuple())


def two_prompt_batch(vlm: Any) -> Any:
    """Two prompts of different lengths (left padding) on non-square images of both orientations: the batch the
    per-head readout and intervention references run on every family."""
    return vlm.encode_grounding([noise_image(83, 61, seed=1), noise_image(64, 96, seed=2)],
                                ["the red circle", "the cat left of the dog"])


def edge_heads(vlm: Any) -> HeadSet:
    """Heads at the grid's edges: layer 0, and the last layer's first and last head."""
    g = vlm.geometry
    return HeadSet([Head(0, 1), Head(g.num_layers - 1, 0), Head(g.num_layers - 1, g.num_heads - 1)])
