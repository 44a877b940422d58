"""Check a family's box -> visual-token rule by experiment, not by reading code.

With every attention module of the vision tower switched off (its output replaced by zeros), each
visual token depends only on its own patch (plus position embeddings, which do not depend on pixels).
Painting a box into the image then changes the language model's layer-0 input exactly at the visual
tokens whose patch overlaps the box, which is what ``FamilyAdapter.visual_layout(...).positions_for_box``
must return. Use NEAREST resampling in the processor so interpolation does not bleed across patch edges.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from PIL import Image, ImageDraw

from vrh_interp.boxes import Box
from vrh_interp.families.base import FamilyAdapter
from vrh_interp.testing.tiny import TinyVLM


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
