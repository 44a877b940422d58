"""Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``, e.g. ``Qwen/Qwen2.5-VL-7B-Instruct``).

Facts (read in transformers 5.24: ``models/qwen2_5_vl/modeling_qwen2_5_vl.py``,
``models/qwen2_5_vl/processing_qwen2_5_vl.py``; the image processor is Qwen2-VL's, see
``models/auto/image_processing_auto.py``; checked by the layout experiment in
``tests/families/test_families.py -k qwen2_5_vl``):

* Backbone, head geometry (``head_dim = hidden_size // num_attention_heads`` in ``Qwen2_5_VLAttention``),
  ``<|image_pad|>`` placeholder and layout rule are Qwen2-VL's (``Qwen2VLAdapter``): patch 14 x merge 2,
  whole image stretched by ``smart_resize``, merged tokens row-major. The vision tower's windowed attention
  permutes patches internally but the merger restores the row-major order.
* Native grounding format (Qwen2.5-VL cookbook "spatial understanding"; the paper's evaluation parses
  ``"bbox_2d": [x1, y1, x2, y2]``): a JSON list such as
  ``[{"bbox_2d": [x1, y1, x2, y2], "label": "..."}]``, usually inside a ```` ```json ```` fence, in ABSOLUTE
  integer pixels of the RESIZED model input (W' x H' = ``image_grid_thw[2] * patch`` x
  ``image_grid_thw[1] * patch``), not of the original image. Original pixels are x * W / W', y * H / H'.
  The frame therefore needs the encoding (``box_frame``); tools that guess the frame from value ranges
  misread these boxes.
* ``format_box`` writes the cookbook answer without the label (``format_box`` does not know the
  expression), so the answer's prefix up to the coordinates matches the model's own output. ``parse_box``
  reads the first ``[x1, y1, x2, y2]`` after ``bbox_2d`` (or the first such list when the key is absent).
"""

from __future__ import annotations

from typing import Any, Mapping

from vrh_interp.core.description.boxes import Box, BoxParseFailure
from vrh_interp.core.description.families.base import BoxFrame
from vrh_interp.core.description.families.coordinates import (checked_relative, from_relative, json_bbox_answer,
                                                              json_bbox_values)
from vrh_interp.core.description.families.prompts import JSON_GROUNDING_INSTRUCTION
from vrh_interp.core.description.families.qwen2_vl import Qwen2VLAdapter


class Qwen25VLAdapter(Qwen2VLAdapter, family="qwen2_5_vl"):

    def grounding_instruction(self, expression: str) -> str:
        return JSON_GROUNDING_INSTRUCTION.format(expression=expression)

    def box_frame(self, encoding: Mapping[str, Any] | None, image_size: tuple[int, int],
                  batch_index: int = 0, processor: Any = None) -> BoxFrame:
        if encoding is None or "image_grid_thw" not in encoding:
            raise ValueError(
                "Qwen2.5-VL boxes are in pixels of the resized model input: pass the processor encoding "
                "(with image_grid_thw) of this image to box_frame"
            )
        _frames, grid_h, grid_w = (int(v) for v in encoding["image_grid_thw"][batch_index])
        patch_size = int(self.config.vision_config.patch_size)
        return BoxFrame(image_size=image_size, input_size=(grid_w * patch_size, grid_h * patch_size))

    def format_box(self, box: Box, frame: BoxFrame) -> str:
        return json_bbox_answer(checked_relative(box, frame.image_size, resized_input_size(frame)))

    def parse_box(self, text: str, frame: BoxFrame) -> Box | BoxParseFailure:
        input_width, input_height = resized_input_size(frame)
        values = json_bbox_values(text)
        if values is None:
            return BoxParseFailure(text, 'no "bbox_2d": [x1, y1, x2, y2] box found')
        x1, y1, x2, y2 = values
        if min(values) < 0 or max(x1, x2) > input_width or max(y1, y2) > input_height:
            return BoxParseFailure(text, f"coordinates {values} outside the {input_width}x{input_height} resized input")
        relative = [x1 / input_width, y1 / input_height, x2 / input_width, y2 / input_height]
        return from_relative(relative, frame.image_size, 1.0, text)


def resized_input_size(frame: BoxFrame) -> tuple[int, int]:
    if frame.input_size is None:
        raise ValueError("this Qwen2.5-VL BoxFrame has no input_size: build it with adapter.box_frame(encoding, ...)")
    return frame.input_size
