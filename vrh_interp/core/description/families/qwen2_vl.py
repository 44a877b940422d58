"""Qwen2-VL (``Qwen2VLForConditionalGeneration``, e.g. ``Qwen/Qwen2-VL-7B-Instruct``).

Facts (read in transformers 5.24: ``models/qwen2_vl/modeling_qwen2_vl.py``,
``models/qwen2_vl/processing_qwen2_vl.py``, ``models/qwen2_vl/image_processing_pil_qwen2_vl.py``; checked by
the layout experiment in ``tests/families/test_families.py -k qwen2_vl``):

* Language backbone: ``model.language_model.layers[i].self_attn`` with ``o_proj``. The attention module sets
  ``head_dim = hidden_size // num_attention_heads`` whatever the config says (``Qwen2VLAttention.__init__``),
  so the geometry does the same.
* Image placeholder: ``processor.image_token`` (``<|image_pad|>``); the processor expands it to
  ``image_grid_thw.prod() // merge_size**2`` copies between ``<|vision_start|>`` and ``<|vision_end|>``.
* Layout: ``smart_resize`` stretches the whole image (axes scaled independently, no crop, no pad) to H' x W'
  multiples of patch x merge (14 x 2 = 28), patches are grouped merge x merge and emitted row-major over the
  merged grid (``patchify``), so token (r, c) of the (grid_h/merge) x (grid_w/merge) grid covers
  x in [c W / cols, (c+1) W / cols) of the ORIGINAL image, y likewise. Grid shapes are read from
  ``image_grid_thw`` and ``merge_size`` from ``processor.image_processor``, so a real processor loaded with
  ``AutoProcessor`` (any ``min_pixels``/``max_pixels``) gives the right layout.
* Native grounding format (Qwen2-VL technical report; answers quoted in QwenLM issue threads, e.g.
  ``<|object_ref_start|>击掌<|object_ref_end|><|box_start|>(531,516),(581,596)<|box_end|>``):
  ``<|box_start|>(x1,y1),(x2,y2)<|box_end|>``, integers 0-1000 relative to the ORIGINAL image. The prompt puts
  the expression between ``<|object_ref_start|>``/``<|object_ref_end|>`` (ms-swift's Qwen2-VL grounding
  format), so ``format_box`` writes the box part only. ``parse_box`` reads the first ``(x1,y1),(x2,y2)`` pair
  whether or not the special tokens survived decoding, whitespace allowed between tokens.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Mapping

from vrh_interp.core.description.boxes import Box, BoxParseFailure
from vrh_interp.core.description.families.base import (BoxFrame, FamilyAdapter, VisualBlock, VisualLayout,
                                                       image_token_positions)
from vrh_interp.core.description.families.coordinates import NUMBER, checked_relative, parse_four_numbers, whole_image
from vrh_interp.core.description.heads import HeadGeometry

RELATIVE_SCALE = 1000
QWEN2_VL_BOX = re.compile(
    rf"\(\s*({NUMBER})\s*,\s*({NUMBER})\s*\)\s*,\s*\(\s*({NUMBER})\s*,\s*({NUMBER})\s*\)"
)


def merged_grid_layout(encoding: Mapping[str, Any], image_size: tuple[int, int], image_token_id: int,
                       patch_size: int, merge_size: int, batch_index: int) -> VisualLayout:
    """Layout of row ``batch_index``'s image for processors that stretch the whole image to a patch grid.

    ``image_grid_thw[batch_index]`` is (frames, patch rows, patch columns); merged tokens form a
    (rows / merge) x (cols / merge) row-major grid over the whole original image. Assumes one image per
    row (``FamilyAdapter.encode``), so image ``batch_index`` belongs to row ``batch_index``.
    """
    width, height = image_size
    if width <= 0 or height <= 0:
        raise ValueError(f"image size {image_size} is not positive")
    positions = image_token_positions(encoding["input_ids"][batch_index], image_token_id)
    frames, grid_h, grid_w = (int(v) for v in encoding["image_grid_thw"][batch_index])
    rows, cols = grid_h // merge_size, grid_w // merge_size
    if frames != 1 or len(positions) != rows * cols:
        raise ValueError(
            f"row {batch_index} has {len(positions)} image tokens but image_grid_thw {[frames, grid_h, grid_w]} "
            f"with merge size {merge_size} describes {frames} x {rows} x {cols}; expected one image per row"
        )
    block = VisualBlock("image", positions, rows, cols, whole_image(image_size))
    return VisualLayout(
        image_size=image_size,
        visual_positions=tuple(positions),
        blocks=(block,),
        input_size=(grid_w * patch_size, grid_h * patch_size),
    )


class Qwen2VLAdapter(FamilyAdapter, family="qwen2_vl"):

    def geometry(self) -> HeadGeometry:
        text_config = self.text_config()
        return replace(super().geometry(), head_dim=text_config.hidden_size // text_config.num_attention_heads)

    def grounding_instruction(self, expression: str) -> str:
        return f"Find <|object_ref_start|>{expression}<|object_ref_end|>"

    def visual_layout(self, encoding: Mapping[str, Any], image_size: tuple[int, int], processor: Any,
                      batch_index: int = 0) -> VisualLayout:
        image_processor = processor.image_processor
        return merged_grid_layout(encoding, image_size, self.image_token_id(processor),
                                  image_processor.patch_size, image_processor.merge_size, batch_index)

    def format_box(self, box: Box, frame: BoxFrame) -> str:
        x1, y1, x2, y2 = checked_relative(box, frame.image_size, RELATIVE_SCALE)
        return f"<|box_start|>({x1},{y1}),({x2},{y2})<|box_end|>"

    def parse_box(self, text: str, frame: BoxFrame) -> Box | BoxParseFailure:
        return parse_four_numbers(text, QWEN2_VL_BOX, frame.image_size, RELATIVE_SCALE, "no (x1,y1),(x2,y2) box found")
