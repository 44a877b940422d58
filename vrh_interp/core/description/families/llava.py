"""LLaVA-1.5 (``LlavaForConditionalGeneration``, e.g. ``llava-hf/llava-1.5-7b-hf``).

Facts (read in transformers 5.24: ``models/llava/modeling_llava.py``, ``models/llava/processing_llava.py``,
``models/llava/image_processing_pil_llava.py``, ``image_transforms.py``; checked by the layout experiment in
``tests/families/test_families.py -k llava``):

* Language backbone: ``model.language_model.layers[i].self_attn`` with ``o_proj`` (Llama/Vicuna); head grid
  from the text config.
* Image placeholder: ``processor.image_token`` (``<image>``), expanded by ``LlavaProcessor`` to
  ``(H // patch) * (W // patch) + num_additional_image_tokens`` copies, minus one with the ``"default"``
  feature-selection strategy (CLS dropped, ``LlavaModel.get_image_features``); with ``"full"`` and a CLS
  tower the first copy is the CLS token, which covers no region.
* Layout: the image processor runs pad-to-square (``do_pad``; centred, ``(max - side) // 2`` before),
  resize (``size``: ``shortest_edge`` keeps the aspect ratio with ``int(S * long / short)``, or
  ``height``/``width``), then centre crop (``do_center_crop``; offset ``(resized - crop) // 2``), in that
  order. The llava-hf checkpoints ship ``CLIPImageProcessor`` with shortest edge 336 + centre crop 336
  ("crop mode": the parts of a non-square image outside the central square reach no token, so a box there
  has NO visual positions and ``positions_for_box`` returns ``[]``); the original LLaVA-1.5 code pads to
  square first ("pad mode", ``do_pad=True``). The adapter reads which one from the processor's own settings.
  The (H // patch) x (W // patch) patch grid covers the first ``rows * patch`` x ``cols * patch`` pixels of
  the processed image, row-major.
* Native grounding format (LLaVA-1.5 REC data, llava_v1_5_mix665k): the prompt "Please provide the bounding
  box coordinate of the region this sentence describes: <expression>" (no final period, as quoted in
  haotian-liu/LLaVA#623) and the answer ``[x1, y1, x2, y2]``, floats in [0, 1] with two decimals, relative
  to the square the model sees: the padded square in pad mode, the centre-cropped square in crop mode (for
  a square image both are the whole image). ``box_frame`` records that square as ``BoxFrame.view_region``
  in original pixels (a frame without one means the padded square); ``parse_box`` maps the values back
  through it (a predicted box may extend into the padding, i.e. beyond the image edges).
  Caveat: LLaVA issue threads (haotian-liu/LLaVA #606, #623, #822) report that the Visual Genome boxes of
  the training mix are padded-square relative while the RefCOCO boxes look relative to the unpadded image.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import numpy as np
from transformers.image_transforms import get_resize_output_image_size
from transformers.image_utils import ChannelDimension

from vrh_interp.core.description.boxes import Box, BoxParseFailure
from vrh_interp.core.description.families.base import (BoxFrame, FamilyAdapter, VisualBlock, VisualLayout,
                                                       check_image_box)
from vrh_interp.core.description.families.coordinates import (Region, format_relative_box, parse_relative_box,
                                                              whole_image)
from vrh_interp.core.description.families.prompts import REFERRING_INSTRUCTION


def padded_square(image_size: tuple[int, int]) -> Region:
    """The square LLaVA's pad-to-square produces, in original pixels (the image pasted centred)."""
    width, height = image_size
    side = max(width, height)
    left, top = (side - width) // 2, (side - height) // 2
    return (float(-left), float(-top), float(side - left), float(side - top))


@dataclass(frozen=True)
class ProcessedView:
    """How a processed image of ``width`` x ``height`` pixels maps onto the original image (linearly).

    Processed pixel coordinate (u, v) lies at original (origin_x + u * scale_x, origin_y + v * scale_y).
    """

    width: int
    height: int
    origin: tuple[float, float]
    scale: tuple[float, float]

    def region(self, u0: float, v0: float, u1: float, v1: float) -> Region:
        (ox, oy), (sx, sy) = self.origin, self.scale
        return (ox + u0 * sx, oy + v0 * sy, ox + u1 * sx, oy + v1 * sy)

    @property
    def full_region(self) -> Region:
        return self.region(0, 0, self.width, self.height)


def resized_height_width(height: int, width: int, size: Any) -> tuple[int, int]:
    """Output (height, width) of the image processor's ``resize`` for the ``size`` policies LLaVA uses."""
    if size.shortest_edge and not size.longest_edge:
        return tuple(get_resize_output_image_size(np.empty((1, height, width)), size=size.shortest_edge,
                                                  default_to_square=False,
                                                  input_data_format=ChannelDimension.FIRST))
    if size.height and size.width:
        return size.height, size.width
    raise ValueError(f"unsupported LLaVA image-processor size {size}: expected shortest_edge or height/width")


def llava_processed_view(image_size: tuple[int, int], image_processor: Any) -> ProcessedView:
    """The pad -> resize -> centre-crop chain of ``LlavaImageProcessor``/``CLIPImageProcessor`` as a view."""
    width, height = image_size
    if width <= 0 or height <= 0:
        raise ValueError(f"image size {image_size} is not positive")
    canvas_x0, canvas_y0, canvas_x1, canvas_y1 = (
        padded_square(image_size) if getattr(image_processor, "do_pad", False) else whole_image(image_size)
    )
    canvas_w, canvas_h = int(canvas_x1 - canvas_x0), int(canvas_y1 - canvas_y0)
    resized_h, resized_w = (
        resized_height_width(canvas_h, canvas_w, image_processor.size)
        if image_processor.do_resize else (canvas_h, canvas_w)
    )
    if image_processor.do_center_crop:
        out_h, out_w = image_processor.crop_size.height, image_processor.crop_size.width
        top, left = (resized_h - out_h) // 2, (resized_w - out_w) // 2
    else:
        out_h, out_w, top, left = resized_h, resized_w, 0, 0
    scale_x, scale_y = canvas_w / resized_w, canvas_h / resized_h
    return ProcessedView(
        width=out_w,
        height=out_h,
        origin=(canvas_x0 + left * scale_x, canvas_y0 + top * scale_y),
        scale=(scale_x, scale_y),
    )


def split_class_token(positions: list[int], grid_tokens: int, strategy: str) -> list[int]:
    """The grid positions of one image's placeholders: all of them, or all but a leading CLS token."""
    if len(positions) == grid_tokens:
        return positions
    if len(positions) == grid_tokens + 1 and strategy == "full":
        return positions[1:]
    raise ValueError(
        f"found {len(positions)} image tokens for a {grid_tokens}-token patch grid "
        f"(vision_feature_select_strategy={strategy!r}); expected one image per prompt, processed with the "
        "processor's own settings"
    )


class LlavaAdapter(FamilyAdapter, family="llava"):
    image_prefix_cache: ClassVar[bool] = True

    def grounding_instruction(self, expression: str) -> str:
        return REFERRING_INSTRUCTION.format(expression)

    def patch_size(self) -> int:
        return int(self.config.vision_config.patch_size)

    def visual_layout(self, encoding: Mapping[str, Any], image_size: tuple[int, int], processor: Any,
                      batch_index: int = 0) -> VisualLayout:
        view = llava_processed_view(image_size, processor.image_processor)
        processed_h, processed_w = (int(v) for v in encoding["pixel_values"][batch_index].shape[-2:])
        if (processed_w, processed_h) != (view.width, view.height):
            raise ValueError(
                f"pixel_values are {processed_w}x{processed_h} but the image processor's settings give "
                f"{view.width}x{view.height} for a {image_size[0]}x{image_size[1]} image: encode with the "
                "processor's own settings (no per-call size/crop/pad overrides)"
            )
        patch = self.patch_size()
        rows, cols = view.height // patch, view.width // patch
        positions = self.image_positions(encoding, processor, batch_index)
        grid = split_class_token(positions, rows * cols, self.config.vision_feature_select_strategy)
        block = VisualBlock("image", grid, rows, cols, view.region(0, 0, cols * patch, rows * patch))
        return VisualLayout(image_size=image_size, visual_positions=tuple(positions), blocks=(block,),
                            input_size=(view.width, view.height))

    def box_frame(self, encoding: Mapping[str, Any] | None, image_size: tuple[int, int], batch_index: int = 0,
                  processor: Any = None) -> BoxFrame:
        """The square the model sees, from ``processor``'s pad/crop settings; without one, the padded square.

        The padded square is LLaVA-1.5's training frame (``image_aspect_ratio: pad``); pass the processor
        for llava-hf's crop-mode processors, whose frame for a non-square image is the central square.
        """
        if processor is None:
            return BoxFrame(image_size=image_size, view_region=self.default_view_region(image_size))
        view = llava_processed_view(image_size, processor.image_processor)
        return BoxFrame(image_size=image_size, input_size=(view.width, view.height), view_region=view.full_region)

    def format_box(self, box: Box, frame: BoxFrame) -> str:
        check_image_box(box, frame.image_size)
        return format_relative_box(box, self.relative_region(frame))

    def parse_box(self, text: str, frame: BoxFrame) -> Box | BoxParseFailure:
        return parse_relative_box(text, self.relative_region(frame))

    def default_view_region(self, image_size: tuple[int, int]) -> Region:
        """The frame of a ``BoxFrame`` without ``view_region``: LLaVA-1.5's padded square."""
        return padded_square(image_size)

    def relative_region(self, frame: BoxFrame) -> Region:
        """The rectangle native boxes are relative to: ``frame.view_region``, else ``default_view_region``."""
        if frame.view_region is not None:
            return frame.view_region
        return self.default_view_region(frame.image_size)
