"""Every built-in family adapter against its tiny fixture: one parametrised test per check, one spec row per family.

The rows (``tests/families/specs.py``) hold the facts: registry and classes, head geometry, the exact layout
experiments (paint a box, see which language-model inputs change: ``tests.layout_probe``), the
grounding prompt, and the native box format (round trips, fuzzing, documented answers). Checks only one family
has follow, as ``test_<family>_*`` tests, so ``-k <family>`` selects all of a family's tests.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from dataclasses import replace
from typing import Any, Callable

import pytest
import torch
from hypothesis import assume, given, settings, strategies as st
from transformers import CLIPImageProcessorPil, SmolVLMForConditionalGeneration, SmolVLMImageProcessorPil
from transformers.models.pixtral.image_processing_pil_pixtral import get_resize_output_image_size
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from tests.conftest import noise_image
from tests.families.checks import (
    assert_fixture_is_registered,
    assert_generates,
    assert_layout_agrees_up_to_sampling,
    assert_parses_to,
    assert_round_trip,
    assert_separators_are_image_newlines,
    boxes_in_images,
    encode_noise_image,
    encode_noise_images,
    noise_image_layout,
    small_boxes_in_images,
    text_config_geometry,
)
from tests.families.specs import (
    GEMMA3_IMAGE,
    GEMMA3_TOKENS_PER_IMAGE,
    IDEFICS3_FRAME,
    IDEFICS3_LONGEST_EDGE,
    IDEFICS3_TOKENS_PER_FRAME,
    INTERNVL_TILE,
    INTERNVL_TOKENS_PER_TILE,
    LLAVA_NEXT_TILE,
    MISTRAL3_LONGEST_EDGE,
    MISTRAL3_MERGE,
    MISTRAL3_PATCH,
    ONEVISION_TILE,
    PALIGEMMA_IMAGE,
    PALIGEMMA_PATCH,
    SPECS,
    FamilySpec,
    llava_view_spacing,
)
from tests.reference import decoder_layers
from vrh_interp.core.description.boxes import Box, BoxParseFailure, InvalidBoxError
from vrh_interp.core.description.families import FamilyAdapter, adapter_for_config
from vrh_interp.core.description.families.base import BoxFrame, VisualLayout
from vrh_interp.core.description.families.gemma3 import Gemma3Adapter
from vrh_interp.core.description.families.idefics3 import Idefics3Adapter, split_canvas_size
from vrh_interp.core.description.families.llava import LlavaAdapter, llava_processed_view
from vrh_interp.core.description.families.llava_onevision import bilinear_sources
from vrh_interp.core.description.families.registry import call, family_row
from tests.layout_probe import check_layout_by_painting, nearest_resampling
from vrh_interp.core.description.tiny import TinyVLM, build_processor, build_recipe, build_tiny


@functools.cache
def tiny_for(name: str) -> TinyVLM:
    """The family's tiny fixture (seed 0), built once per session; NEAREST resampling where its row asks."""
    tiny = build_tiny(name)
    return nearest_resampling(tiny) if SPECS[name].nearest else tiny


@functools.cache
def adapter_for(name: str) -> FamilyAdapter:
    return SPECS[name].adapter(tiny_for(name).model.config)


def rows(field: Callable[[FamilySpec], Any]) -> list[Any]:
    """One ``pytest.param(spec)`` per family whose ``field`` is set, with the family's name as its id."""
    return [pytest.param(spec, id=spec.name) for spec in SPECS.values() if field(spec) is not None]


def cases(field: Callable[[FamilySpec], Any]) -> list[Any]:
    """One ``pytest.param(spec, *case)`` per case in each family's ``field`` (a sequence of tuples)."""
    return [pytest.param(spec, *case, id=f"{spec.name}-{index}")
            for spec in SPECS.values() for index, case in enumerate(field(spec) or ())]


def test_zero_area_boxes_are_refused() -> None:
    for values in [(10, 10, 10, 20), (10, 10, 20, 10), (5, 5, 5, 10)]:
        with pytest.raises(InvalidBoxError, match="zero or negative area"):
            Box(*values)


@pytest.mark.parametrize("spec", rows(lambda spec: spec))
def test_fixture_is_the_real_family_and_registry_picks_the_adapter(spec: FamilySpec) -> None:
    assert_fixture_is_registered(tiny_for(spec.name), spec.model_class, spec.image_processor_class, spec.adapter)


@pytest.mark.parametrize("spec", rows(lambda spec: spec))
def test_geometry_and_attention_path_match_the_model(spec: FamilySpec) -> None:
    model, adapter = tiny_for(spec.name).model, adapter_for(spec.name)
    text_config = model.config.get_text_config()
    layers = operator.attrgetter(spec.layers)(model)
    assert layers is decoder_layers(model)  # transformers' own get_decoder() agrees with the row
    for layer in range(text_config.num_hidden_layers):
        attention = adapter.attention_module(model, layer)
        assert attention is layers[layer].self_attn
        assert adapter.output_projection(model, layer) is attention.o_proj
    if spec.head_dim == "config":
        head_dim = text_config.head_dim
    elif spec.head_dim == "hidden":  # Qwen2-VL-style attention: hidden // heads, whatever the config says
        head_dim = text_config.hidden_size // text_config.num_attention_heads
    else:
        head_dim = attention.head_dim
    assert adapter.geometry() == text_config_geometry(text_config, head_dim)
    assert attention.head_dim == head_dim
    assert adapter.output_projection(model, 1).in_features == text_config.num_attention_heads * head_dim
    if spec.geometry is not None:
        assert adapter.geometry() == spec.geometry
    assert adapter.non_causal_image_attention == spec.non_causal_image_attention


@pytest.mark.parametrize(("spec", "image_size", "box"), cases(lambda spec: spec.layout_cases))
def test_layout_equals_tokens_changed_by_painting_the_box(spec: FamilySpec, image_size: tuple[int, int],
                                                          box: Box) -> None:
    image = noise_image(*image_size, seed=image_size[0] if spec.nearest else 0)
    positions = check_layout_by_painting(tiny_for(spec.name), adapter_for(spec.name), image, box)
    assert bool(positions) == ((image_size, box) not in spec.tokenless)


@pytest.mark.parametrize(("spec", "image_size"),
                         cases(lambda spec: spec.sampling and [(size,) for size in spec.sampling.sizes]))
def test_downscaled_layouts_agree_with_painting_up_to_sampling(spec: FamilySpec, image_size: tuple[int, int]) -> None:
    tiny, adapter = tiny_for(spec.name), adapter_for(spec.name)
    spacing = spec.sampling.spacing(tiny, noise_image_layout(tiny, adapter, image_size), image_size)
    assert_layout_agrees_up_to_sampling(tiny, adapter, image_size, spec.sampling.boxes, spacing)


@pytest.mark.parametrize(("spec", "image_size"),
                         cases(lambda spec: spec.smart_resize and [(size,) for size in spec.smart_resize.sizes]))
def test_layout_grid_follows_smart_resize(spec: FamilySpec, image_size: tuple[int, int]) -> None:
    tiny, adapter, rule = tiny_for(spec.name), adapter_for(spec.name), spec.smart_resize
    width, height = image_size
    encoding = encode_noise_image(tiny, adapter, image_size)
    layout = adapter.visual_layout(encoding, image_size, tiny.processor)
    resized_h, resized_w = rule.resize(height, width)
    (block,) = layout.blocks
    assert (block.rows, block.cols) == (resized_h // rule.token_pixels, resized_w // rule.token_pixels)
    assert layout.input_size == (resized_w, resized_h)
    assert block.region == (0.0, 0.0, float(width), float(height))
    image_token_id = adapter.image_token_id(tiny.processor)
    assert list(layout.visual_positions) == (encoding["input_ids"][0] == image_token_id).nonzero().flatten().tolist()


@pytest.mark.parametrize("spec", rows(lambda spec: spec.batch_blocks))
def test_batched_rows_with_different_block_counts(spec: FamilySpec) -> None:
    tiny, adapter = tiny_for(spec.name), adapter_for(spec.name)
    encoding = encode_noise_images(tiny, adapter, [size for size, _blocks in spec.batch_blocks])
    image_id = adapter.image_token_id(tiny.processor)
    for row, (size, blocks) in enumerate(spec.batch_blocks):
        layout = adapter.visual_layout(encoding, size, tiny.processor, batch_index=row)
        positions = (encoding["input_ids"][row] == image_id).nonzero().flatten().tolist()
        assert list(layout.visual_positions) == positions and len(layout.blocks) == blocks
        assert [p for block in layout.blocks for p in block.positions] == positions


@pytest.mark.parametrize("spec", rows(lambda spec: spec.outside))
def test_boxes_outside_the_image_are_refused(spec: FamilySpec) -> None:
    adapter, outside = adapter_for(spec.name), spec.outside
    if outside.layout_box is not None:
        layout = noise_image_layout(tiny_for(spec.name), adapter, outside.image_size)
        with pytest.raises(InvalidBoxError, match="outside"):
            layout.positions_for_box(outside.layout_box)
    with pytest.raises(InvalidBoxError, match="outside"):
        adapter.format_box(outside.format_box, outside.frame(adapter, outside.image_size))


@pytest.mark.parametrize("spec", rows(lambda spec: spec.prompt))
def test_grounding_prompt_uses_the_chat_template_and_generates(spec: FamilySpec) -> None:
    tiny, adapter, facts = tiny_for(spec.name), adapter_for(spec.name), spec.prompt
    prompt = adapter.grounding_prompt(tiny.processor, facts.expression)
    if facts.equals is not None:
        assert prompt == facts.equals
    assert prompt.startswith(facts.starts)
    assert all(part in prompt for part in facts.contains), prompt
    assert prompt.endswith(facts.ends)
    encoding = adapter.encode(tiny.processor, [noise_image(*facts.image_size)], [prompt])
    if facts.image_tokens is not None:
        expected = facts.image_tokens(encoding) if callable(facts.image_tokens) else facts.image_tokens
        assert int((encoding["input_ids"][0] == adapter.image_token_id(tiny.processor)).sum()) == expected
    assert_generates(tiny, encoding)


@pytest.mark.parametrize("spec", rows(lambda spec: spec.formatted))
def test_format_box_writes_the_native_answer(spec: FamilySpec) -> None:
    box, frame, text = spec.formatted
    assert adapter_for(spec.name).format_box(box, frame) == text


@pytest.mark.parametrize("spec", rows(lambda spec: spec.round_trip))
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_format_then_parse_round_trips_within_one_step(spec: FamilySpec, data: st.DataObject) -> None:
    adapter, round_trip = adapter_for(spec.name), spec.round_trip
    strategy = small_boxes_in_images() if round_trip.small_boxes else boxes_in_images(round_trip.steps)
    box, (width, height) = data.draw(strategy)
    step = round_trip.tolerance / round_trip.steps
    for frame in round_trip.frames:
        text = assert_round_trip(adapter, box, frame(adapter, (width, height)), (width * step, height * step))
        assert round_trip.text is None or re.fullmatch(round_trip.text, text), text


@pytest.mark.parametrize("spec", rows(lambda spec: spec.fuzz))
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_parse_never_raises(spec: FamilySpec, data: st.DataObject) -> None:
    fuzz = spec.fuzz
    texts = [st.text(), st.builds("".join, st.lists(st.sampled_from(fuzz.pieces)))]
    text = data.draw(st.one_of(*texts, *([st.sampled_from(fuzz.near_misses)] if fuzz.near_misses else [])))
    assert isinstance(adapter_for(spec.name).parse_box(text, fuzz.frame), (Box, BoxParseFailure))


@pytest.mark.parametrize(("spec", "answer", "expected"), cases(lambda spec: spec.answers.cases))
def test_parse_native_answers(spec: FamilySpec, answer: str, expected: Box | None) -> None:
    adapter = adapter_for(spec.name)
    assert_parses_to(adapter, answer, spec.answers.frame(adapter, spec.answers.image_size), expected)


# --- Qwen2.5-VL: boxes in pixels of the resized input -------------------------------------------------------------

# Pixel budget of Qwen/Qwen2.5-VL-7B-Instruct's preprocessor_config.json.
HUB_MIN_PIXELS, HUB_MAX_PIXELS = 3136, 12845056


def test_qwen2_5_vl_box_frame_is_the_resized_input_of_each_row() -> None:
    tiny, adapter = tiny_for("qwen2_5_vl"), adapter_for("qwen2_5_vl")
    sizes = [(300, 170), (97, 203)]
    encoding = encode_noise_images(tiny, adapter, sizes)
    for row, size in enumerate(sizes):
        frame = adapter.box_frame(encoding, size, batch_index=row)
        layout = adapter.visual_layout(encoding, size, tiny.processor, batch_index=row)
        _frames, grid_h, grid_w = encoding["image_grid_thw"][row].tolist()
        assert frame.input_size == layout.input_size == (grid_w * 14, grid_h * 14)
        assert frame.image_size == size
    with pytest.raises(ValueError, match="resized model input"):
        adapter.box_frame(None, (300, 170))
    with pytest.raises(ValueError, match="input_size"):
        adapter.parse_box('{"bbox_2d": [1, 2, 3, 4]}', BoxFrame(image_size=(300, 170)))


@st.composite
def boxes_in_resized_frames(draw: st.DrawFn) -> tuple[Box, BoxFrame]:
    """A box at least two resized-pixel steps wide and high, in a frame sized by the hub processor's policy."""
    width, height = draw(st.integers(28, 4000)), draw(st.integers(28, 4000))  # aspect ratio < 200
    resized_h, resized_w = smart_resize(height, width, 28, HUB_MIN_PIXELS, HUB_MAX_PIXELS)
    min_w, min_h = 2 * width / resized_w, 2 * height / resized_h
    x1 = draw(st.floats(0, width - min_w))
    y1 = draw(st.floats(0, height - min_h))
    x2 = draw(st.floats(x1 + min_w, width))
    y2 = draw(st.floats(y1 + min_h, height))
    return Box(x1, y1, x2, y2), BoxFrame(image_size=(width, height), input_size=(resized_w, resized_h))


@settings(max_examples=200, deadline=None)
@given(boxes_in_resized_frames())
def test_qwen2_5_vl_format_then_parse_round_trips_within_one_resized_pixel(case: tuple[Box, BoxFrame]) -> None:
    box, frame = case
    (width, height), (resized_w, resized_h) = frame.image_size, frame.input_size
    assert_round_trip(adapter_for("qwen2_5_vl"), box, frame, (width / resized_w, height / resized_h))


# --- Qwen3-VL ------------------------------------------------------------------------------------------------------

def test_qwen3_vl_fixture_has_patch_16() -> None:
    assert tiny_for("qwen3_vl").processor.image_processor.patch_size == 16


# --- InternVL: tiles, thumbnail last -------------------------------------------------------------------------------

def internvl_encoding(image_size: tuple[int, int], **processor_kwargs: Any) -> Any:
    """The processor's own call (padding on, optional tiling overrides) for a noise image."""
    tiny, adapter = tiny_for("internvl"), adapter_for("internvl")
    prompt = adapter.grounding_prompt(tiny.processor, "the object")
    return tiny.processor(images=[noise_image(*image_size)], text=[prompt], return_tensors="pt", padding=True,
                          **processor_kwargs)


def test_internvl_tokens_per_tile() -> None:
    assert adapter_for("internvl").tokens_per_tile() == (4, 4)


@pytest.mark.parametrize(("image_size", "grid"), [((150, 70), (2, 1)), ((200, 130), (3, 2)), ((70, 150), (1, 2)),
                                                  ((500, 90), (6, 1))])
def test_internvl_tiles_are_row_major_with_the_thumbnail_last(image_size: tuple[int, int],
                                                              grid: tuple[int, int]) -> None:
    tiny, adapter = tiny_for("internvl"), adapter_for("internvl")
    width, height = image_size
    cols, rows_ = grid
    encoding = internvl_encoding(image_size)
    assert encoding["pixel_values"].shape[0] == cols * rows_ + 1
    layout = adapter.visual_layout(encoding, image_size, tiny.processor)
    context_id = adapter.image_token_id(tiny.processor)
    assert list(layout.visual_positions) == (encoding["input_ids"][0] == context_id).nonzero().flatten().tolist()
    assert len(layout.visual_positions) == (cols * rows_ + 1) * INTERNVL_TOKENS_PER_TILE
    expected_regions = [(c * width / cols, r * height / rows_, (c + 1) * width / cols, (r + 1) * height / rows_)
                        for r in range(rows_) for c in range(cols)] + [(0.0, 0.0, float(width), float(height))]
    assert [block.region for block in layout.blocks] == expected_regions
    assert layout.blocks[-1].name == "thumbnail"
    assert [block.positions[0] for block in layout.blocks] == list(layout.visual_positions[::INTERNVL_TOKENS_PER_TILE])


def test_internvl_square_image_is_one_stretched_tile_without_thumbnail() -> None:
    tiny, adapter = tiny_for("internvl"), adapter_for("internvl")
    encoding = internvl_encoding((40, 40))
    layout = adapter.visual_layout(encoding, (40, 40), tiny.processor)
    assert encoding["pixel_values"].shape[-2:] == (INTERNVL_TILE, INTERNVL_TILE)
    assert [(b.name, b.rows, b.cols, b.region) for b in layout.blocks] == [("image", 4, 4, (0.0, 0.0, 40.0, 40.0))]


def test_internvl_tile_count_that_disagrees_with_the_rule_is_refused() -> None:
    encoding = internvl_encoding((200, 130), max_patches=2)
    assert encoding["pixel_values"].shape[0] == 3  # 2x1 tiles + thumbnail, not the image processor's 3x2
    with pytest.raises(ValueError, match="min_patches/max_patches"):
        adapter_for("internvl").visual_layout(encoding, (200, 130), tiny_for("internvl").processor)


def test_internvl_image_tokens_sit_between_the_image_markers() -> None:
    tiny, adapter = tiny_for("internvl"), adapter_for("internvl")
    encoding = encode_noise_image(tiny, adapter, (150, 70), "the red cube")
    tokenizer = tiny.processor.tokenizer
    ids = encoding["input_ids"][0].tolist()
    first, last = ids.index(tokenizer.start_image_token_id), ids.index(tokenizer.end_image_token_id)
    assert set(ids[first + 1:last]) == {adapter.image_token_id(tiny.processor)}
    assert last - first - 1 == 3 * INTERNVL_TOKENS_PER_TILE


# --- LLaVA-1.5: crop and pad modes ---------------------------------------------------------------------------------

@functools.cache
def llava_pad_tiny() -> TinyVLM:
    """The LLaVA fixture's model behind a pad-to-square processor (the fixture's own processor crops)."""
    crop, recipe = tiny_for("llava"), family_row("llava").tiny
    pad_mode = replace(recipe, image_processor=call(recipe.image_processor.target,
                                                    **{**recipe.image_processor.kwargs, "do_pad": True}))
    return TinyVLM(family="llava", model=crop.model, processor=build_processor(pad_mode),
                   vision_attention_modules=crop.vision_attention_modules)


# Sizes the pad-mode processor maps by whole-pixel factors (x1: 44x30; x2: 22x11; x4: 11x22): exact for any box.
LLAVA_PAD_CASES = [
    ((44, 30), Box(0, 0, 44, 30)),  # whole image: every token whose patch holds image pixels
    ((44, 30), Box(40, 0, 44, 30)),  # the 4 columns past the 5 x 8-pixel patch grid: no token
    ((22, 11), Box(3, 2, 19, 9)),
    ((11, 22), Box(0, 21, 11, 22)),  # last image row
]


@pytest.mark.parametrize(("image_size", "box"), LLAVA_PAD_CASES)
def test_llava_pad_mode_layout_equals_tokens_changed_by_painting_the_box(image_size: tuple[int, int],
                                                                         box: Box) -> None:
    check_layout_by_painting(llava_pad_tiny(), adapter_for("llava"), noise_image(*image_size), box)


def test_llava_pad_mode_downscaled_layout_agrees_with_painting_up_to_sampling() -> None:
    tiny, adapter, image_size = llava_pad_tiny(), adapter_for("llava"), (97, 203)
    spacing = llava_view_spacing(tiny, noise_image_layout(tiny, adapter, image_size), image_size)
    assert_layout_agrees_up_to_sampling(tiny, adapter, image_size, 3, spacing)


def test_llava_crop_and_pad_layouts_follow_the_processor_settings() -> None:
    adapter = adapter_for("llava")
    crop = noise_image_layout(tiny_for("llava"), adapter, (70, 44))
    (block,) = crop.blocks
    assert (block.rows, block.cols, block.region) == (5, 5, (13.0, 0.0, 53.0, 40.0))
    assert len(crop.visual_positions) == 25 and crop.input_size == (44, 44)
    (padded,) = noise_image_layout(llava_pad_tiny(), adapter, (44, 30)).blocks
    assert padded.region == (0.0, -7.0, 40.0, 33.0)
    # llava-hf's real configuration: shortest edge 336, centre crop 336 -> the central square.
    hub = CLIPImageProcessorPil(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})
    assert llava_processed_view((640, 480), hub).full_region == (80.0, 0.0, 560.0, 480.0)


def test_llava_box_frames_are_the_square_the_model_sees() -> None:
    adapter = adapter_for("llava")
    assert adapter.box_frame(None, (640, 480), processor=llava_pad_tiny().processor).view_region == (
        0.0, -80.0, 640.0, 560.0)
    assert adapter.box_frame(None, (640, 480)).view_region == (0.0, -80.0, 640.0, 560.0)
    crop = adapter.box_frame(None, (640, 480), processor=tiny_for("llava").processor)
    assert crop.view_region == pytest.approx((7 * 640 / 58, 0.0, 51 * 640 / 58, 480.0))  # 640x480 -> 58x44 -> crop
    assert adapter.format_box(Box(0, 0, 640, 480), crop) == "[0.00, 0.00, 1.00, 1.00]"  # clamped to the view
    assert adapter.format_box(Box(0, 0, 640, 480), adapter.box_frame(None, (640, 480))) == "[0.00, 0.12, 1.00, 0.88]"


@st.composite
def llava_image_and_box(draw: st.DrawFn) -> tuple[tuple[int, int], Box]:
    width, height = draw(st.integers(8, 4000)), draw(st.integers(8, 4000))
    fx1, fy1 = draw(st.floats(0, 0.9)), draw(st.floats(0, 0.9))
    fx2, fy2 = draw(st.floats(fx1 + 0.05, 1.0)), draw(st.floats(fy1 + 0.05, 1.0))
    return (width, height), Box(fx1 * width, fy1 * height, fx2 * width, fy2 * height)


def assert_round_trip_in_view(adapter: LlavaAdapter, box: Box, frame: BoxFrame, side: tuple[float, float]) -> None:
    assume(box.width >= 0.02 * side[0] and box.height >= 0.02 * side[1])  # survives 0.01 quantisation
    assert_round_trip(adapter, box, frame, (0.01 * side[0], 0.01 * side[1]))


@settings(max_examples=200, deadline=None)
@given(llava_image_and_box())
def test_llava_format_then_parse_round_trips_in_the_padded_square(case: tuple[tuple[int, int], Box]) -> None:
    adapter = adapter_for("llava")
    image_size, box = case
    side = float(max(image_size))
    assert_round_trip_in_view(adapter, box, adapter.box_frame(None, image_size), (side, side))
    assert_round_trip_in_view(adapter, box, BoxFrame(image_size=image_size), (side, side))


@settings(max_examples=100, deadline=None)
@given(llava_image_and_box())
def test_llava_format_then_parse_round_trips_in_the_central_crop(case: tuple[tuple[int, int], Box]) -> None:
    adapter = adapter_for("llava")
    image_size, box = case
    frame = adapter.box_frame(None, image_size, processor=tiny_for("llava").processor)
    x0, y0, x1, y1 = frame.view_region
    inside = Box(x0 + box.x1 / image_size[0] * (x1 - x0), y0 + box.y1 / image_size[1] * (y1 - y0),
                 x0 + box.x2 / image_size[0] * (x1 - x0), y0 + box.y2 / image_size[1] * (y1 - y0))
    assert_round_trip_in_view(adapter, inside, frame, (x1 - x0, y1 - y0))


# --- LLaVA-NeXT and LLaVA-OneVision: anyres tiles and newline tokens -----------------------------------------------

def anyres_layout(name: str, image_size: tuple[int, int], tile_size: int) -> tuple[Any, VisualLayout, int]:
    """A noise image's encoding and layout, and the processor's own count of its image features."""
    tiny, adapter = tiny_for(name), adapter_for(name)
    encoding = encode_noise_image(tiny, adapter, image_size)
    features = tiny.processor._get_number_of_features(image_size[1], image_size[0], tile_size, tile_size)
    return encoding, adapter.visual_layout(encoding, image_size, tiny.processor), features


@pytest.mark.parametrize("image_size", [(50, 37), (90, 25), (25, 90), (77, 60), (30, 20), (16, 16)])
def test_llava_next_token_count_base_first_and_newlines(image_size: tuple[int, int]) -> None:
    width, height = image_size
    encoding, layout, features = anyres_layout("llava_next", image_size, LLAVA_NEXT_TILE)
    assert len(layout.visual_positions) == features - 1  # the processor counts the CLS token the model drops
    base = layout.blocks[0]
    assert base.name == "base" and base.positions == layout.visual_positions[:16]
    assert base.region == (0.0, 0.0, float(width), float(height))
    newlines = assert_separators_are_image_newlines(tiny_for("llava_next"), adapter_for("llava_next"), encoding, layout)
    assert newlines[-1] == layout.visual_positions[-1]
    rows_of_tiles: dict[str, set[int]] = {}
    for block in layout.blocks[1:]:  # tiles, row-major over the tile grid
        rows_of_tiles.setdefault(block.name.split()[1].split(",")[0], set()).add(block.rows)
    assert len(newlines) == sum(next(iter(heights)) for heights in rows_of_tiles.values())


def test_llava_next_batched_rows_have_the_layout_of_their_own_image() -> None:
    tiny, adapter = tiny_for("llava_next"), adapter_for("llava_next")
    sizes = [(50, 37), (90, 25)]
    batch = encode_noise_images(tiny, adapter, sizes)
    for row, size in enumerate(sizes):
        batched = adapter.visual_layout(batch, size, tiny.processor, batch_index=row)
        single = noise_image_layout(tiny, adapter, size)
        shift = batched.visual_positions[0] - single.visual_positions[0]  # left padding of the shorter row
        assert [p - shift for p in batched.visual_positions] == list(single.visual_positions)
        assert [b.region for b in batched.blocks] == [b.region for b in single.blocks]


def test_llava_next_unpadding_keeps_the_extra_row_of_an_odd_remainder() -> None:
    # 90x25 -> 1x3 tiles: resized to 96x27 and pasted 2 rows down in 96x32; unpad_image keeps
    # round(25 * 12 / 90) = 3 rows plus the odd remainder, i.e. all 4 token rows.
    tiles = noise_image_layout(tiny_for("llava_next"), adapter_for("llava_next"), (90, 25)).blocks[1:]
    assert [(b.name, b.rows, b.cols) for b in tiles] == [("tile 0,0", 4, 4), ("tile 0,1", 4, 4), ("tile 0,2", 4, 4)]
    assert tiles[0].region == pytest.approx((0.0, -2 * 25 / 27, 30.0, 30 * 25 / 27))


@pytest.mark.parametrize("image_size", [(72, 36), (40, 100), (200, 150), (150, 200), (30, 20)])
def test_llava_onevision_token_count_and_newlines(image_size: tuple[int, int]) -> None:
    encoding, layout, features = anyres_layout("llava_onevision", image_size, ONEVISION_TILE)
    assert len(layout.visual_positions) == features
    assert layout.blocks[0].positions == layout.visual_positions[:16]
    assert_separators_are_image_newlines(tiny_for("llava_onevision"), adapter_for("llava_onevision"), encoding, layout)


def test_llava_onevision_large_grids_are_downsampled_like_pack_image_features() -> None:
    # 200x150 -> 5x6 tiles of 4x4 tokens; unpadding keeps 18 of 20 rows and all 24 columns;
    # ratio = sqrt(18 * 24 / (9 * 16)) = 1.73 > 1.1 -> int(18 // 1.73) x int(24 // 1.73) = 10 x 13.
    adapter = adapter_for("llava_onevision")
    layout = noise_image_layout(tiny_for("llava_onevision"), adapter, (200, 150))
    ratio = math.sqrt(18 * 24 / (9 * 16))
    assert adapter.packed_grid_shape(18, 24, 4) == (int(18 // ratio), int(24 // ratio)) == (10, 13)
    downsampled = {p for block in layout.blocks[1:] for p in block.positions}
    assert len(downsampled) == 10 * 13
    assert len(layout.visual_positions) == 16 + 10 * (13 + 1)
    assert adapter.packed_grid_shape(8, 8, 4) == (8, 8)  # 4 tiles: under anyres_max_9


@pytest.mark.parametrize(("index", "source_size", "target_size", "expected"), [
    (0, 18, 10, [0, 1]),  # source 0.4
    (2, 18, 10, [4]),  # source exactly 4.0: the second weight is zero
    (9, 18, 10, [16, 17]),
    (0, 4, 2, [0, 1]),  # source 0.5
    (0, 2, 4, [0]),  # upsampling clamps at 0
    (3, 2, 4, [1]),  # and at the last row
])
def test_llava_onevision_bilinear_sources_match_torch_interpolate(index: int, source_size: int, target_size: int,
                                                                  expected: list[int]) -> None:
    assert bilinear_sources(index, source_size, target_size) == expected
    for source in range(source_size):
        impulse = torch.zeros(1, 1, source_size, 1)
        impulse[0, 0, source, 0] = 1.0
        out = torch.nn.functional.interpolate(impulse, [target_size, 1], mode="bilinear")[0, 0, index, 0]
        assert (abs(float(out)) > 1e-6) == (source in expected)


# --- PaliGemma: one stretched grid first, a prefix prompt, <loc> tokens ---------------------------------------------

PALIGEMMA_GRID = PALIGEMMA_IMAGE // PALIGEMMA_PATCH  # 56 px / patch 7 = 8


def test_paligemma_vocabulary_has_the_location_tokens_and_attention_is_bidirectional() -> None:
    tiny = tiny_for("paligemma")
    tokenizer = tiny.processor.tokenizer
    assert tokenizer.convert_tokens_to_ids("<loc1023>") < len(tokenizer)
    assert tiny.model.config.get_text_config().use_bidirectional_attention


def test_paligemma_image_tokens_come_first_as_one_stretched_grid() -> None:
    tiny, adapter, grid = tiny_for("paligemma"), adapter_for("paligemma"), PALIGEMMA_GRID
    layout = noise_image_layout(tiny, adapter, (150, 70))
    assert layout.visual_positions == tuple(range(grid * grid))
    (block,) = layout.blocks
    assert (block.rows, block.cols, block.region) == (grid, grid, (0.0, 0.0, 150.0, 70.0))
    assert layout.input_size == (PALIGEMMA_IMAGE, PALIGEMMA_IMAGE)
    assert block.token_rect(1, 2) == (2 * 150 / grid, 70 / grid, 3 * 150 / grid, 2 * 70 / grid)


def test_paligemma_prompt_is_a_bidirectional_prefix_after_the_image() -> None:
    tiny, adapter, grid = tiny_for("paligemma"), adapter_for("paligemma"), PALIGEMMA_GRID
    encoding = encode_noise_image(tiny, adapter, (150, 70), "the red cube")
    tokenizer = tiny.processor.tokenizer
    ids = encoding["input_ids"][0]
    assert (ids[:grid * grid] == adapter.image_token_id(tiny.processor)).all()
    assert int(ids[grid * grid]) == tokenizer.bos_token_id  # the processor inserts <bos> after the image
    assert tokenizer.decode(ids[grid * grid + 1:]) == "detect the red cube\n"
    assert not encoding["token_type_ids"].any()  # the whole prompt is the bidirectional prefix
    assert "labels" not in encoding


@settings(max_examples=200, deadline=None)
@given(boxes_in_images(1023))
def test_paligemma_format_writes_y_first_location_tokens(case: tuple[Box, tuple[int, int]]) -> None:
    box, (width, height) = case
    text = adapter_for("paligemma").format_box(box, BoxFrame(image_size=(width, height)))
    assert text == "".join(f"<loc{round(v / side * 1023):04d}>"
                           for v, side in ((box.y1, height), (box.x1, width), (box.y2, height), (box.x2, width)))


# --- Gemma 3: pooled grid, pan & scan crops -------------------------------------------------------------------------

# Pan & scan (default processor settings: crops >= 256 px, at most 4, aspect >= 1.2): 900x300 -> 3 strips
# of 300 px, 300x1000 -> 3 strips of 334 px (the last 332), 1100x280 -> 4 strips of 275 px.
GEMMA3_PAN_AND_SCAN_CASES = [
    ((900, 300), Box(337, 37, 712, 262), 3),  # spans crops 1 and 2
    ((300, 1000), Box(112, 300, 188, 700), 3),  # spans all three stacked crops
    ((1100, 280), Box(0, 0, 240, 100), 4),  # top-left corner, inside crop 0
]


@functools.cache
def gemma3_pan_and_scan_adapter() -> Gemma3Adapter:
    return Gemma3Adapter(tiny_for("gemma3").model.config, do_pan_and_scan=True)


def test_gemma3_fixture_defaults_and_attention() -> None:
    tiny, adapter = tiny_for("gemma3"), adapter_for("gemma3")
    text_config = tiny.model.config.get_text_config()
    assert not adapter_for_config(tiny.model.config).do_pan_and_scan  # pan & scan is opt-in
    assert tiny.model.model.multi_modal_projector.mm_input_projection_weight.abs().sum() > 0
    assert adapter.attention_module(tiny.model, 1).scaling == text_config.query_pre_attn_scalar ** -0.5
    assert [layer.self_attn.sliding_window for layer in tiny.model.model.language_model.layers] == [
        text_config.sliding_window, None]
    assert adapter.tokens_per_side() ** 2 == tiny.model.config.mm_tokens_per_image


@pytest.mark.parametrize(("image_size", "box", "num_crops"), GEMMA3_PAN_AND_SCAN_CASES)
def test_gemma3_pan_and_scan_layout_equals_tokens_changed_by_painting_the_box(image_size: tuple[int, int], box: Box,
                                                                              num_crops: int) -> None:
    tiny, adapter = tiny_for("gemma3"), gemma3_pan_and_scan_adapter()
    image = noise_image(*image_size, seed=image_size[0])
    encoding = adapter.encode(tiny.processor, [image], [adapter.grounding_prompt(tiny.processor, "the object")])
    assert encoding["pixel_values"].shape[0] == 1 + num_crops
    layout = adapter.visual_layout(encoding, image_size, tiny.processor)
    assert [block.name for block in layout.blocks] == ["image"] + [f"crop_{i}" for i in range(num_crops)]
    check_layout_by_painting(tiny, adapter, image, box)


def test_gemma3_pan_and_scan_crops_split_the_long_side() -> None:
    layout = noise_image_layout(tiny_for("gemma3"), gemma3_pan_and_scan_adapter(), (300, 1000))
    assert [block.region for block in layout.blocks] == [
        (0.0, 0.0, 300.0, 1000.0), (0.0, 0.0, 300.0, 334.0), (0.0, 334.0, 300.0, 668.0), (0.0, 668.0, 300.0, 1000.0)]
    assert len(layout.visual_positions) == 4 * GEMMA3_TOKENS_PER_IMAGE


def test_gemma3_one_pooled_block_between_boi_and_eoi() -> None:
    tiny, adapter, tokens = tiny_for("gemma3"), adapter_for("gemma3"), GEMMA3_TOKENS_PER_IMAGE
    encoding = encode_noise_image(tiny, adapter, (150, 70))
    layout = adapter.visual_layout(encoding, (150, 70), tiny.processor)
    ids = encoding["input_ids"][0].tolist()
    tokenizer = tiny.processor.tokenizer
    first = ids.index(tokenizer.boi_token_id) + 1
    assert layout.visual_positions == tuple(range(first, first + tokens))
    assert ids[first + tokens] == tokenizer.eoi_token_id
    # token_type_ids mark exactly the image block attended bidirectionally.
    assert encoding["token_type_ids"][0].nonzero().flatten().tolist() == list(layout.visual_positions)
    (block,) = layout.blocks
    assert (block.rows, block.cols, block.region) == (4, 4, (0.0, 0.0, 150.0, 70.0))
    assert layout.input_size == (GEMMA3_IMAGE, GEMMA3_IMAGE)


def test_gemma3_batch_encodes_one_image_per_prompt() -> None:
    tiny, adapter = tiny_for("gemma3"), adapter_for("gemma3")
    sizes = [(150, 70), (37, 101)]
    encoding = encode_noise_images(tiny, adapter, sizes, ["x", "a longer x"])
    assert encoding["pixel_values"].shape[0] == 2
    image_id = adapter.image_token_id(tiny.processor)
    for row, size in enumerate(sizes):
        layout = adapter.visual_layout(encoding, size, tiny.processor, batch_index=row)
        assert list(layout.visual_positions) == (encoding["input_ids"][row] == image_id).nonzero().flatten().tolist()
        assert [block.region for block in layout.blocks] == [(0.0, 0.0, float(size[0]), float(size[1]))]


# --- Idefics3 / SmolVLM: split image, frame markers, global image last ----------------------------------------------

def test_idefics3_tokens_per_frame() -> None:
    tiny = tiny_for("idefics3")
    assert adapter_for("idefics3").tokens_per_side() ** 2 == IDEFICS3_TOKENS_PER_FRAME == tiny.processor.image_seq_len


@pytest.mark.parametrize(("image_size", "grid"),
                         [((100, 60), (2, 3)), ((37, 101), (3, 2)), ((20, 20), (3, 3)), ((500, 90), (1, 3)),
                          ((150, 70), (2, 3))])
def test_idefics3_tiles_are_row_major_with_the_global_image_last(image_size: tuple[int, int],
                                                                 grid: tuple[int, int]) -> None:
    tiny, adapter, frame = tiny_for("idefics3"), adapter_for("idefics3"), IDEFICS3_FRAME
    width, height = image_size
    rows_, cols = grid
    assert split_canvas_size(image_size, IDEFICS3_LONGEST_EDGE, frame) == (cols * frame, rows_ * frame)
    encoding = encode_noise_image(tiny, adapter, image_size)
    assert encoding["pixel_values"].shape[1] == rows_ * cols + 1
    layout = adapter.visual_layout(encoding, image_size, tiny.processor)
    image_id = adapter.image_token_id(tiny.processor)
    assert list(layout.visual_positions) == (encoding["input_ids"][0] == image_id).nonzero().flatten().tolist()
    assert [block.region for block in layout.blocks] == [
        (c * frame * width / (cols * frame), r * frame * height / (rows_ * frame),
         (c + 1) * frame * width / (cols * frame), (r + 1) * frame * height / (rows_ * frame))
        for r in range(rows_) for c in range(cols)
    ] + [(0.0, 0.0, float(width), float(height))]
    assert [block.name for block in layout.blocks][-1] == "global"


def test_idefics3_frame_markers_sit_between_blocks_and_are_not_visual() -> None:
    tiny, adapter = tiny_for("idefics3"), adapter_for("idefics3")
    encoding = encode_noise_image(tiny, adapter, (100, 60))
    layout = adapter.visual_layout(encoding, (100, 60), tiny.processor)
    tokenizer = tiny.processor.tokenizer
    ids = encoding["input_ids"][0]
    before = [tokenizer.decode(ids[block.positions[0] - 2:block.positions[0]]) for block in layout.blocks]
    assert before == [f"<fake_token_around_image><row_{r}_col_{c}>" for r in (1, 2) for c in (1, 2, 3)] + [
        "<fake_token_around_image><global-img>"]
    assert all(len(block.positions) == IDEFICS3_TOKENS_PER_FRAME for block in layout.blocks)


def test_idefics3_without_splitting_the_image_is_one_global_frame() -> None:
    tiny, adapter = tiny_for("idefics3"), adapter_for("idefics3")
    prompt = adapter.grounding_prompt(tiny.processor, "x")
    encoding = tiny.processor(images=[noise_image(100, 60)], text=[prompt], return_tensors="pt",
                              do_image_splitting=False)
    layout = adapter.visual_layout(encoding, (100, 60), tiny.processor)
    assert [(b.name, b.rows, b.cols, b.region) for b in layout.blocks] == [("global", 4, 4, (0.0, 0.0, 100.0, 60.0))]


def test_idefics3_smolvlm_variant_uses_the_same_adapter_and_layout() -> None:
    idefics3 = family_row("idefics3").tiny  # SmolVLM's classes behind Idefics3Processor (SmolVLMProcessor needs
    # the optional num2words package), whose image prompt is SmolVLM's (processing_smolvlm._prompt_split_image)
    recipe = replace(idefics3, model="SmolVLMForConditionalGeneration",
                     config=call("SmolVLMConfig", **idefics3.config.kwargs),
                     vision_config=call("SmolVLMVisionConfig", **idefics3.vision_config.kwargs),
                     image_processor=call("SmolVLMImageProcessorPil", **idefics3.image_processor.kwargs))
    smolvlm = nearest_resampling(build_recipe(recipe, seed=0, family="idefics3"))
    adapter = assert_fixture_is_registered(smolvlm, SmolVLMForConditionalGeneration, SmolVLMImageProcessorPil,
                                           Idefics3Adapter)
    assert smolvlm.model.config.model_type == "smolvlm"
    assert adapter.attention_module(smolvlm.model, 0) is smolvlm.model.model.text_model.layers[0].self_attn
    positions = check_layout_by_painting(smolvlm, adapter, noise_image(100, 60, seed=100), Box(21, 19, 46, 41))
    assert len(positions) == 4 * 4 + 2 * 2  # 2x2 tokens in each of the four tiles around the corner, 2x2 global


# --- Mistral3: the Pixtral processor, [IMG_BREAK] / [IMG_END] -------------------------------------------------------

MISTRAL3_TOKEN_PIXELS = MISTRAL3_PATCH * MISTRAL3_MERGE


def test_mistral3_port_matches_the_real_pixtral_processor() -> None:
    processing_pixtral = pytest.importorskip("transformers.models.pixtral.processing_pixtral")  # needs torchvision
    tiny = tiny_for("mistral3")
    real = processing_pixtral.PixtralProcessor(
        image_processor=tiny.processor.image_processor, tokenizer=tiny.processor.tokenizer,
        patch_size=MISTRAL3_PATCH, spatial_merge_size=MISTRAL3_MERGE,
        chat_template=tiny.processor.chat_template,
    )
    for image_size in [(50, 37), (200, 150), (16, 64)]:
        ported = tiny.processor(images=[noise_image(*image_size)], text=["a [IMG] b"], return_tensors="pt")
        expected = real(images=[noise_image(*image_size)], text=["a [IMG] b"], return_tensors="pt")
        assert ported["input_ids"].tolist() == expected["input_ids"].tolist()
        assert ported["image_sizes"].tolist() == expected["image_sizes"].tolist()


@pytest.mark.parametrize("image_size", [(50, 37), (200, 150), (100, 30), (16, 64), (48, 32)])
def test_mistral3_grid_breaks_and_end_follow_the_processor(image_size: tuple[int, int]) -> None:
    tiny, adapter, token_pixels = tiny_for("mistral3"), adapter_for("mistral3"), MISTRAL3_TOKEN_PIXELS
    encoding = encode_noise_image(tiny, adapter, image_size)
    layout = adapter.visual_layout(encoding, image_size, tiny.processor)
    resized_h, resized_w = get_resize_output_image_size(
        noise_image(*image_size), size=(MISTRAL3_LONGEST_EDGE, MISTRAL3_LONGEST_EDGE),
        patch_size=(token_pixels, token_pixels))
    rows_, cols = resized_h // token_pixels, resized_w // token_pixels
    (block,) = layout.blocks
    assert (block.rows, block.cols, layout.input_size) == (rows_, cols, (resized_w, resized_h))
    assert len(layout.visual_positions) == rows_ * (cols + 1)  # PixtralProcessor._get_num_multimodal_tokens
    tokens = tiny.processor.tokenizer.convert_ids_to_tokens(encoding["input_ids"][0, list(layout.visual_positions)])
    expected = (["[IMG]"] * cols + ["[IMG_BREAK]"]) * rows_
    expected[-1] = "[IMG_END]"
    assert tokens == expected
    assert list(layout.visual_positions) == list(range(layout.visual_positions[0], layout.visual_positions[-1] + 1))


# --- Aya Vision: GOT-OCR2 tiles with text markers --------------------------------------------------------------------

def test_aya_vision_tokens_per_tile_and_image_token() -> None:
    tiny, adapter = tiny_for("aya_vision"), adapter_for("aya_vision")
    assert adapter.tokens_per_tile() == (4, 4)
    assert adapter.image_token_id(tiny.processor) == tiny.model.config.image_token_id


def test_aya_vision_tiles_are_row_major_with_the_global_image_last() -> None:
    tiny, adapter = tiny_for("aya_vision"), adapter_for("aya_vision")
    encoding = encode_noise_image(tiny, adapter, (200, 130))
    assert encoding["pixel_values"].shape[0] == 7
    layout = adapter.visual_layout(encoding, (200, 130), tiny.processor)
    patch_id = adapter.image_token_id(tiny.processor)
    assert list(layout.visual_positions) == (encoding["input_ids"][0] == patch_id).nonzero().flatten().tolist()
    assert [block.region for block in layout.blocks] == [
        (c * 200 / 3, r * 130 / 2, (c + 1) * 200 / 3, (r + 1) * 130 / 2) for r in range(2) for c in range(3)
    ] + [(0.0, 0.0, 200.0, 130.0)]
    # A TILE_k / TILE_GLOBAL text marker separates consecutive blocks: positions jump between blocks.
    starts = [block.positions[0] for block in layout.blocks]
    ends = [block.positions[-1] for block in layout.blocks]
    assert all(start > end + 1 for start, end in zip(starts[1:], ends[:-1]))
    assert all(len(block.positions) == 16 for block in layout.blocks)


def test_aya_vision_prompt_marks_each_tile() -> None:
    tiny, adapter = tiny_for("aya_vision"), adapter_for("aya_vision")
    encoding = encode_noise_image(tiny, adapter, (150, 70), "the red cube")
    text = tiny.processor.tokenizer.decode(encoding["input_ids"][0])
    assert "<|START_OF_IMG|>TILE_1" in text and "TILE_2" in text and "TILE_GLOBAL<|IMG_PATCH|>" in text
