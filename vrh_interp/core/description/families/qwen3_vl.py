"""Qwen3-VL (``Qwen3VLForConditionalGeneration``, e.g. ``Qwen/Qwen3-VL-8B-Instruct``).

Facts (read in transformers 5.24: ``models/qwen3_vl/modeling_qwen3_vl.py``,
``models/qwen3_vl/processing_qwen3_vl.py``; the image processor is Qwen2-VL's with patch 16, see
``models/auto/image_processing_auto.py``; checked by the layout experiment in
``tests/families/test_families.py -k qwen3_vl``):

* Language backbone: ``model.language_model.layers[i].self_attn`` with ``o_proj``; unlike Qwen2/2.5-VL the
  attention reads ``config.head_dim`` (``Qwen3VLTextAttention.__init__``), so the geometry is the
  base one. DeepStack adds vision features to the image positions after the first LM layers, outside the
  layer modules.
* Placeholder ``<|image_pad|>`` and the Qwen2-VL layout rule with factor 32 (patch 16 x merge 2), read from
  ``image_grid_thw`` and ``processor.image_processor`` (``Qwen2VLAdapter.visual_layout``).
* Native grounding format (Qwen3-VL cookbooks): the same JSON as Qwen2.5-VL,
  ``[{"bbox_2d": [x1, y1, x2, y2], "label": ...}]``, but integers 0-1000 RELATIVE to the original image.
"""

from __future__ import annotations


from vrh_interp.core.description.boxes import Box, BoxParseFailure
from vrh_interp.core.description.families.base import BoxFrame, FamilyAdapter
from vrh_interp.core.description.families.coordinates import (checked_relative, from_relative, json_bbox_answer,
                                                              json_bbox_values)
from vrh_interp.core.description.families.prompts import JSON_GROUNDING_INSTRUCTION
from vrh_interp.core.description.families.qwen2_vl import RELATIVE_SCALE, Qwen2VLAdapter
from vrh_interp.core.description.heads import HeadGeometry


class Qwen3VLAdapter(Qwen2VLAdapter, family="qwen3_vl"):

    def geometry(self) -> HeadGeometry:
        return FamilyAdapter.geometry(self)

    def grounding_instruction(self, expression: str) -> str:
        return JSON_GROUNDING_INSTRUCTION.format(expression=expression)

    def format_box(self, box: Box, frame: BoxFrame) -> str:
        return json_bbox_answer(checked_relative(box, frame.image_size, RELATIVE_SCALE))

    def parse_box(self, text: str, frame: BoxFrame) -> Box | BoxParseFailure:
        values = json_bbox_values(text)
        if values is None:
            return BoxParseFailure(text, 'no "bbox_2d": [x1, y1, x2, y2] box found')
        return from_relative(values, frame.image_size, RELATIVE_SCALE, text)
