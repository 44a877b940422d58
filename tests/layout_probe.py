"""Check a family's box -> visual-token rule by experiment, not by reading code.

With every attention module of the vision tower switched off (its output replaced by zeros), each
visual token depends only on its own patch (plus position embeddings, which do not depend on pixels).
Painting a box into the image then changes the language model's layer-0 input exactly at the visual
tokens whose patch overlaps the box, which is what ``FamilyAdapter.visual_layout(...).positions_for_box``
must return. Use NEAREST resampling in the processor so interpolation does not bleed across patch edges.

Where the processor DOWNSCALES the image (global thumbnails, base views, pixel budgets), NEAREST reads one
source pixel per resized pixel, so a token whose patch overlaps the box only by a sliver narrower than
one resized pixel may not change. For an exact comparison keep the box edges more than one resized pixel
away from token edges; for arbitrary boxes (``random_boxes``) use ``assert_changed_within_sampling``, which
checks that the changed positions lie between the rule on the box shrunk by that sampling step and the
rule on the box itself.
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from PIL import Image, ImageDraw
from transformers.image_utils import PILImageResampling

from vrh_interp.core.description.boxes import Box
from vrh_interp.core.description.families.base import FamilyAdapter, VisualLayout
from vrh_interp.core.description.tiny import TinyVLM


@contextmanager
def vision_attention_off(modules: list[torch.nn.Module]) -> Iterator[None]:
    def zero_output(_module: torch.nn.Module, _inputs: Any, output: Any) -> Any:
        if isinstance(output, tuple):
            return (torch.zeros_like(output[0]), *output[1:])
        return torch.zeros_like(output)

    handles = [m.register_forward_hook(zero_output) for m in modules]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def language_model_input(tiny: TinyVLM, adapter: FamilyAdapter, encoding: Any) -> torch.Tensor:
    """The hidden states entering the first language-backbone layer, ``[batch, seq, hidden]``."""
    layer0 = adapter.attention_module(tiny.model, 0)
    captured: list[torch.Tensor] = []

    def grab(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        captured.append((args[0] if args else kwargs["hidden_states"]).detach().clone())

    handle = layer0.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.no_grad(), vision_attention_off(tiny.vision_attention_modules(tiny.model)):
            tiny.model(**encoding)
    finally:
        handle.remove()
    return captured[0]


def paint_box(image: Image.Image, box: Box, colour: tuple[int, int, int] = (255, 0, 255)) -> Image.Image:
    """A copy of ``image`` with the integer-pixel box [x1, x2) x [y1, y2) filled."""
    painted = image.copy()
    ImageDraw.Draw(painted).rectangle([int(box.x1), int(box.y1), int(box.x2) - 1, int(box.y2) - 1], fill=colour)
    return painted


def changed_positions(tiny: TinyVLM, adapter: FamilyAdapter, image: Image.Image, box: Box,
                      expression: str = "the object", tolerance: float = 1e-6) -> list[int]:
    """Sequence positions whose layer-0 LM input changes when ``box`` is painted into ``image``."""
    prompt = adapter.grounding_prompt(tiny.processor, expression)
    plain = adapter.encode(tiny.processor, [image], [prompt])
    painted = adapter.encode(tiny.processor, [paint_box(image, box)], [prompt])
    if not torch.equal(plain["input_ids"], painted["input_ids"]):
        raise AssertionError("painting the image changed the token sequence; the probe needs equal layouts")
    before = language_model_input(tiny, adapter, plain)[0]
    after = language_model_input(tiny, adapter, painted)[0]
    delta = (after - before).abs().amax(dim=-1)
    return (delta > tolerance).nonzero().flatten().tolist()


def nearest_resampling(tiny: TinyVLM) -> TinyVLM:
    """``tiny`` with its image processor switched to NEAREST resampling (for the layout experiment)."""
    tiny.processor.image_processor.resample = PILImageResampling.NEAREST
    return tiny


def check_layout_by_painting(tiny: TinyVLM, adapter: FamilyAdapter, image: Image.Image, box: Box,
                             expression: str = "the object") -> list[int]:
    """The exact layout experiment for one box: the layout's positions for ``box``, checked by painting it.

    Raises AssertionError when the positions whose layer-0 input changes differ from
    ``adapter.visual_layout(...).positions_for_box(box)``; returns those positions (empty when the box
    reaches no visual token).
    """
    prompt = adapter.grounding_prompt(tiny.processor, expression)
    encoding = adapter.encode(tiny.processor, [image], [prompt])
    expected = adapter.visual_layout(encoding, image.size, tiny.processor).positions_for_box(box)
    changed = changed_positions(tiny, adapter, image, box, expression)
    if changed != expected:
        raise AssertionError(f"{box} in a {image.size[0]}x{image.size[1]} image: the layout gives {expected}, "
                             f"painting changed {changed}")
    return expected


def random_boxes(image_size: tuple[int, int], count: int, seed: int) -> list[Box]:
    """Integer-pixel boxes inside the image (the probe paints whole pixels)."""
    width, height = image_size
    rng = random.Random(seed)
    boxes = []
    for _ in range(count):
        x1, y1 = rng.randrange(width - 1), rng.randrange(height - 1)
        boxes.append(Box(x1, y1, rng.randint(x1 + 1, width), rng.randint(y1 + 1, height)))
    return boxes


def assert_changed_within_sampling(layout: VisualLayout, box: Box, changed: list[int], spacing: float) -> None:
    """Layout experiment on an image the processor DOWNSCALES, where exact equality cannot hold.

    NEAREST resampling reads one source pixel per processed pixel, ``spacing`` source pixels apart, so a token
    whose patch overlaps the box only by a sliver narrower than that may keep its value. The changed
    positions must then lie between the rule for the box shrunk by ``spacing`` and the rule for the box.
    """
    upper = layout.positions_for_box(box)
    if not set(changed) <= set(upper):
        raise AssertionError(f"{box}: positions {sorted(set(changed) - set(upper))} changed but the layout does not "
                             "give them")
    if box.width > 2 * spacing and box.height > 2 * spacing:
        inner = Box(box.x1 + spacing, box.y1 + spacing, box.x2 - spacing, box.y2 - spacing)
        lower = layout.positions_for_box(inner)
        if not lower:
            raise AssertionError(f"{box}: the layout gives no positions for the box shrunk by {spacing}")
        if not set(lower) <= set(changed):
            raise AssertionError(f"{box}: positions {sorted(set(lower) - set(changed))} of the box shrunk by "
                                 f"{spacing} did not change")
