"""The contract every VLM family adapter fulfils.

One module per family (``vrh_interp/core/description/families/<family>.py``) declares that family's facts, the way
TransformerLens's ``supported_architectures/`` and pyvene's per-model maps do:

* where the language-backbone attention modules live and which sub-module is the output projection
  (per-head ablation zeroes a head's ``head_dim`` slice of that projection's INPUT);
* the head grid, read from the text config (``head_dim`` from the config, never hidden // heads);
* the image placeholder token(s) and how the processor lays visual tokens out over the ORIGINAL image
  (``visual_layout``): resize, crop, pad and tiling policy, taken from the grid shapes the processor
  returns, never a sqrt(N) square assumption;
* the grounding prompt, built with the model's own chat template;
* the native box format: ``format_box`` (for teacher forcing) and ``parse_box`` (text -> ``Box`` in
  original pixels, or a ``BoxParseFailure``), in a coordinate frame fixed per family, never guessed from
  value ranges.

A visual layout is a list of ``VisualBlock``s: a rows x cols grid of tokens that spans a rectangle of
the original image (a tile, a thumbnail, a base view, a centre crop). Because every supported
processor maps that rectangle linearly onto the grid (stretch, crop or pad, then resize), the pixel
rectangle of token (r, c) follows exactly, and a box selects the tokens whose rectangle overlaps it with
positive area.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import torch
from PIL import Image

from vrh_interp.core._display import card_html, card_text
from vrh_interp.core.description.boxes import Box, BoxParseFailure, InvalidBoxError
from vrh_interp.core.description.families.registry import family_row
from vrh_interp.core.description.heads import HeadGeometry


class UnsupportedModelError(ValueError):
    """The model's architecture has no family adapter."""


EDGE_TOLERANCE = 1e-9  # relative: float rounding of token edges is ~1e-16 of the coordinates' magnitude


def overlapping_spans(start: float, end: float, count: int, low: float, high: float) -> list[int]:
    """Indices of the ``count`` equal spans tiling ``[start, end)`` that overlap ``[low, high)`` by more than
    the rounding tolerance (see ``VisualBlock.overlapping_cells``)."""
    tolerance = min(EDGE_TOLERANCE * max(1.0, abs(start), abs(end), abs(low), abs(high)), (high - low) / 4)
    width = (end - start) / count if count else 0.0
    return [i for i in range(count)
            if min(start + (i + 1) * width, high) - max(start + i * width, low) > tolerance]


@dataclass(frozen=True)
class VisualBlock:
    """A ``rows`` x ``cols`` row-major grid of visual tokens spanning ``region`` of the original image.

    ``region`` is ``(x0, y0, x1, y1)`` in original-image pixels; it may extend beyond the image (padding)
    or cover only part of it (a tile, a centre crop).
    """

    name: str
    positions: Sequence[int]  # stored as a tuple of ints
    rows: int
    cols: int
    region: tuple[float, float, float, float]

    def __post_init__(self) -> None:
        object.__setattr__(self, "positions", tuple(int(p) for p in self.positions))  # tensors' items, lists
        if len(self.positions) != self.rows * self.cols:
            raise ValueError(
                f"block {self.name!r}: {len(self.positions)} positions for a {self.rows}x{self.cols} grid"
            )

    def token_rect(self, row: int, col: int) -> tuple[float, float, float, float]:
        x0, y0, x1, y1 = self.region
        cw, ch = (x1 - x0) / self.cols, (y1 - y0) / self.rows
        return (x0 + col * cw, y0 + row * ch, x0 + (col + 1) * cw, y0 + (row + 1) * ch)

    def overlapping_cells(self, box: Box) -> list[tuple[int, int]]:
        """Grid cells (row, col) whose pixel rectangle overlaps ``box`` with positive area.

        Overlaps are decided per axis, and an overlap no larger than ``EDGE_TOLERANCE`` times the coordinates'
        magnitude counts as none: token edges are computed in floating point (``23.0`` comes out as
        ``22.999999999999996``), and a box whose edge sits exactly on a token edge must not pick up the whole
        neighbouring row or column. The tolerance is capped at a quarter of the box's extent, so a box narrower
        than it still selects the tokens under it.
        """
        x0, y0, x1, y1 = self.region
        cols = overlapping_spans(x0, x1, self.cols, box.x1, box.x2)
        rows = overlapping_spans(y0, y1, self.rows, box.y1, box.y2)
        return [(r, c) for r in rows for c in cols]

    def positions_for_box(self, box: Box) -> list[int]:
        return [self.positions[r * self.cols + c] for r, c in self.overlapping_cells(box)]


@dataclass(frozen=True)
class VisualLayout:
    """Where one image's visual tokens sit in the sequence and which pixels each one covers."""

    image_size: tuple[int, int]  # (width, height) of the original image
    visual_positions: tuple[int, ...]  # every image-placeholder position (separators such as newlines too)
    blocks: tuple[VisualBlock, ...]
    input_size: tuple[int, int] | None = None  # (width, height) the processor resized to, where meaningful

    def positions_for_box(self, box: Box) -> list[int]:
        """Sorted sequence positions of the visual tokens whose patch overlaps ``box`` (original pixels)."""
        box.check_inside(*self.image_size)
        found: set[int] = set()
        for block in self.blocks:
            found.update(block.positions_for_box(box))
        return sorted(found)

    def grid_block(self) -> VisualBlock:
        """The block spatial maps are read on (the spatial-entropy score, attention boxes, overlays): the one
        covering the whole image with the most tokens (a tiled layout's global grid, not a tile)."""
        width, height = self.image_size

        def covers(block: VisualBlock) -> bool:
            x0, y0, x1, y1 = block.region
            return x0 <= 0.5 and y0 <= 0.5 and x1 >= width - 0.5 and y1 >= height - 0.5

        candidates = [b for b in self.blocks if covers(b)] or list(self.blocks)
        return max(candidates, key=lambda b: b.rows * b.cols)


@dataclass(frozen=True)
class BoxFrame:
    """What a family needs to convert between its native box coordinates and original pixels."""

    image_size: tuple[int, int]  # original (width, height)
    input_size: tuple[int, int] | None = None  # resized model input (width, height), for pixel-frame families
    # The part of the original image, in original pixels, that the model's box coordinates are relative to
    # (it may reach beyond the image, e.g. a padded square). None: the family's default frame, the whole
    # image for every family except LLaVA-1.5, whose default is its training frame, the padded square.
    view_region: tuple[float, float, float, float] | None = None


def image_token_positions(input_ids: torch.Tensor, token_id: int) -> list[int]:
    """Positions of ``token_id`` in a 1-D ``input_ids`` row."""
    if input_ids.dim() != 1:
        raise ValueError(f"expected one row of input_ids, got shape {tuple(input_ids.shape)}")
    return (input_ids == token_id).nonzero().flatten().tolist()


@dataclass
class FamilyAdapter(ABC):
    """Base class for one VLM family. Subclasses set the ClassVars and implement the abstract methods."""

    config: Any  # the model's PretrainedConfig
    name: ClassVar[str]  # registry key, e.g. "qwen2_vl"
    display_name: ClassVar[str]
    model_types: ClassVar[tuple[str, ...]]  # config.model_type values this adapter serves
    box_format: ClassVar[str]  # one-line description of the native grounding format
    layers_path: ClassVar[str] = "model.language_model.layers"
    attention_attr: ClassVar[str] = "self_attn"
    output_projection_attr: ClassVar[str] = "o_proj"
    non_causal_image_attention: ClassVar[bool] = False
    # rows that share an image share the prompt up to its last image token: that prefix may be run once per
    # image and its key/value cache reused (``interventions.shared_image_prefix``). Only where positions come from
    # the attention mask (1-D rotary; not Qwen's M-RoPE), attention is causal and the processor's per-image
    # tensors have one row per prompt
    image_prefix_cache: ClassVar[bool] = False
    # ``token_type_ids`` value of answer tokens appended for teacher forcing (PaliGemma: 1 = causal suffix)
    answer_token_type_id: ClassVar[int] = 0

    def __init_subclass__(cls, family: str | None = None, **kwargs: Any) -> None:
        """``class MyAdapter(FamilyAdapter, family=KEY)``: a built-in adapter takes ``name``, ``display_name``,
        ``model_types`` and ``box_format`` from its row of ``vrh_interp.core.description.families.registry``; other
        adapters set them as ClassVars."""
        super().__init_subclass__(**kwargs)
        if family is not None:
            row = family_row(family)
            cls.name, cls.display_name, cls.model_types = row.name, row.display_name, row.model_types
            cls.box_format = row.box_format
        for method in ("__repr__", "_repr_html_"):  # a subclass's @dataclass would write the field-by-field repr,
            if method not in cls.__dict__:            # the whole HF config: it keeps a method its class defines
                setattr(cls, method, getattr(FamilyAdapter, method))

    # ------------------------------------------------------------------ display
    def _card(self) -> tuple[str, list[tuple[str, str]]]:
        config = self.config
        architecture = ", ".join(getattr(config, "architectures", None) or []) or type(config).__name__
        rows = [("model", f"{getattr(config, 'model_type', '?')} ({architecture})")]
        try:
            rows.append(("heads", self.geometry().describe()))
            path = self.attention_path(0)
            path = path.replace(".0.", ".{layer}.", 1) if ".0." in path else f"{path} (layer 0)"
            rows.append(("head outputs", f"input of {path}.{self.output_projection_attr}"))
        except Exception as error:  # noqa: BLE001 - a config the adapter cannot read: say so, do not fail to print
            rows.append(("heads", f"unreadable from the config ({type(error).__name__}: {error})"))
        rows.append(("box format", str(self.box_format)))
        return f"{type(self).__name__}: {self.display_name} (the config: adapter.config)", rows

    def __repr__(self) -> str:
        """A few lines (family, head grid, where head outputs are read, box format), not the HF config."""
        return card_text(*self._card())

    def _repr_html_(self) -> str:
        return card_html(*self._card())

    # ------------------------------------------------------------------ architecture
    def text_config(self) -> Any:
        return self.config.get_text_config()

    def geometry(self) -> HeadGeometry:
        tc = self.text_config()
        heads = tc.num_attention_heads
        head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // heads
        kv = getattr(tc, "num_key_value_heads", None) or heads
        return HeadGeometry(num_layers=tc.num_hidden_layers, num_heads=heads, num_kv_heads=kv, head_dim=head_dim)

    def attention_path(self, layer: int) -> str:
        return f"{self.layers_path}.{layer}.{self.attention_attr}"

    def attention_module(self, model: Any, layer: int) -> Any:
        """The attention module of ``layer`` on a HF model or an nnsight envoy of it (same attribute path)."""
        obj = model
        for part in self.attention_path(layer).split("."):
            obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
        return obj

    def output_projection(self, model: Any, layer: int) -> Any:
        return getattr(self.attention_module(model, layer), self.output_projection_attr)

    # ------------------------------------------------------------------ prompts and images
    def image_token(self, processor: Any) -> str:
        """The placeholder token that stands for visual tokens in ``input_ids`` (default: the processor's)."""
        return processor.image_token

    def image_token_id(self, processor: Any) -> int:
        return int(processor.tokenizer.convert_tokens_to_ids(self.image_token(processor)))

    def image_positions(self, encoding: Mapping[str, Any], processor: Any, batch_index: int) -> list[int]:
        """Positions of the image placeholder in row ``batch_index`` of ``encoding``."""
        return image_token_positions(encoding["input_ids"][batch_index], self.image_token_id(processor))

    def grounding_instruction(self, expression: str) -> str:
        """The user turn asking for a box; families override to match their grounding training."""
        return f"Locate {expression} in the image and output its bounding box."

    def grounding_prompt(self, processor: Any, expression: str) -> str:
        """The full prompt (chat template applied, generation prompt added) for one image + expression."""
        messages = [
            {
                "role": "user",
                "content": [{"type": "image"}, {"type": "text", "text": self.grounding_instruction(expression)}],
            }
        ]
        return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def encode(self, processor: Any, images: Sequence[Image.Image], prompts: Sequence[str]) -> Any:
        """Processor call for a batch of (image, prompt) pairs, one image per prompt."""
        return processor(images=list(images), text=list(prompts), return_tensors="pt", padding=True)

    @abstractmethod
    def visual_layout(self, encoding: Mapping[str, Any], image_size: tuple[int, int], processor: Any,
                      batch_index: int = 0) -> VisualLayout:
        """Layout of the (single) image of row ``batch_index`` of ``encoding``."""

    def box_frame(self, encoding: Mapping[str, Any] | None, image_size: tuple[int, int],
                  batch_index: int = 0, processor: Any = None) -> BoxFrame:
        """The coordinate frame of row ``batch_index``'s answer (``processor`` for crop/pad-dependent frames)."""
        return BoxFrame(image_size=image_size)

    # ------------------------------------------------------------------ native box format
    @abstractmethod
    def format_box(self, box: Box, frame: BoxFrame) -> str:
        """The answer text the model would produce for ``box`` (used for teacher forcing)."""

    @abstractmethod
    def parse_box(self, text: str, frame: BoxFrame) -> Box | BoxParseFailure:
        """Read the first box in ``text`` (the decoded answer) into original pixels."""


def block_count(positions: Sequence[int], rows: int, cols: int, blocks: str) -> int:
    """How many ``rows`` x ``cols`` token blocks (tiles, frames, crops: named by ``blocks``) ``positions`` fill;
    ValueError unless a whole, positive number."""
    per_block = rows * cols
    if not positions or len(positions) % per_block:
        raise ValueError(f"{len(positions)} image tokens are not a whole number of {rows}x{cols}-token {blocks}")
    return len(positions) // per_block


def check_image_box(box: Box, image_size: tuple[int, int]) -> Box:
    """Validate a ground-truth box against its image; raises InvalidBoxError with the reason."""
    width, height = image_size
    if width <= 0 or height <= 0:
        raise InvalidBoxError(f"image size {image_size} is not positive")
    return box.check_inside(width, height)
