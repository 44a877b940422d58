"""Grounding instructions shared by several families, and the requested box format of families without one.

* ``REFERRING_INSTRUCTION``: LLaVA-1.5's REC prompt (llava_v1_5_mix665k), which InternVL's RefCOCO
  evaluation also uses (with the expression between ``<ref>`` and ``</ref>``).
* ``JSON_GROUNDING_INSTRUCTION``: the Qwen2.5-VL / Qwen3-VL cookbooks' request for a JSON ``bbox_2d`` answer.
* ``GROUNDING_INSTRUCTION`` and ``RequestedRelativeBoxAdapter``: for families that document no grounding
  format (Mistral3, Idefics3 / SmolVLM, Aya Vision), the instruction asks for LLaVA-style ``[x1, y1, x2, y2]``
  with 0-1 coordinates (two decimals) relative to the whole original image, and ``format_box``/``parse_box``
  write and read exactly that (``vrh_interp.core.description.families.coordinates``).
"""

from __future__ import annotations

from vrh_interp.core.description.boxes import Box, BoxParseFailure
from vrh_interp.core.description.families.base import BoxFrame, FamilyAdapter, check_image_box
from vrh_interp.core.description.families.coordinates import format_relative_box, parse_relative_box, whole_image

REFERRING_INSTRUCTION = "Please provide the bounding box coordinate of the region this sentence describes: {}"

JSON_GROUNDING_INSTRUCTION = "Locate {expression}, output its bbox coordinates using JSON format."

GROUNDING_INSTRUCTION = (
    "Locate {} in the image. Answer with its bounding box as [x1, y1, x2, y2]: coordinates between 0 and 1, "
    "relative to the image width and height, with two decimals."
)


class RequestedRelativeBoxAdapter(FamilyAdapter):
    """An adapter whose grounding instruction requests ``[x1, y1, x2, y2]``, 0-1 relative to the whole image."""

    def grounding_instruction(self, expression: str) -> str:
        return GROUNDING_INSTRUCTION.format(expression)

    def format_box(self, box: Box, frame: BoxFrame) -> str:
        check_image_box(box, frame.image_size)
        return format_relative_box(box, whole_image(frame.image_size))

    def parse_box(self, text: str, frame: BoxFrame) -> Box | BoxParseFailure:
        return parse_relative_box(text, whole_image(frame.image_size))
