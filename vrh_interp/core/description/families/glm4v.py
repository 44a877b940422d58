"""GLM-4V (``Glm4vForConditionalGeneration``: GLM-4.1V-9B-Thinking/Base, GLM-4.6V-Flash; ``Glm46V*``).

Facts (read in transformers 5.24: ``models/glm4v/modeling_glm4v.py``, ``models/glm4v/processing_glm4v.py``,
``models/glm4v/image_processing_pil_glm4v.py``; checked by the layout experiment in
``tests/families/test_families.py -k glm4v``):

* Language backbone: ``model.language_model.layers[i].self_attn`` with ``o_proj``; ``Glm4vTextAttention``
  sets ``head_dim = hidden_size // num_attention_heads`` (the text config has no ``head_dim``), as in
  Qwen2-VL, whose geometry this adapter inherits.
* Placeholder ``processor.image_token`` (``<|image|>``, between ``<|begin_of_image|>`` and
  ``<|end_of_image|>``), expanded to ``image_grid_thw.prod() // merge_size**2`` copies. Layout rule is
  Qwen2-VL's (``Qwen2VLAdapter.visual_layout``): GLM's ``smart_resize`` stretches the whole image to
  multiples of 28 (patch 14 x merge 2; it first upscales images under 28 pixels on a side), and the
  vision tower's 2 x 2 ``downsample`` convolution emits merged tokens row-major.
* Native grounding (zai-org/GLM-V README, "Grounding"): prompt "Help me to locate <expr> in the image and
  give me its bounding boxes."; the answer marks the box with ``<|begin_of_box|>`` ... ``<|end_of_box|>``,
  coordinates ``[x1,y1,x2,y2]`` are integers 0-1000 relative to the ORIGINAL image (x / W * 1000,
  y / H * 1000), and "the bracket style may vary ([], [[]], (), <>)". ``format_box`` writes
  ``<|begin_of_box|>[x1,y1,x2,y2]<|end_of_box|>``; ``parse_box`` reads the first four comma-separated
  numbers after ``<|begin_of_box|>`` (after the last ``</think>`` when the box markers were stripped by
  decoding, so numbers in the reasoning are skipped), with any of those brackets between them.
"""

from __future__ import annotations

import re
from typing import Any

from vrh_interp.core.description.boxes import Box, BoxParseFailure
from vrh_interp.core.description.families.base import BoxFrame, UnsupportedModelError
from vrh_interp.core.description.families.coordinates import NUMBER, checked_relative, parse_four_numbers
from vrh_interp.core.description.families.qwen2_vl import RELATIVE_SCALE, Qwen2VLAdapter

BEGIN_OF_BOX = "<|begin_of_box|>"
END_OF_BOX = "<|end_of_box|>"
END_OF_THINKING = "</think>"
_SEPARATOR = r"[\s()\[\]<>]*,[\s()\[\]<>]*"
GLM_BOX = re.compile(_SEPARATOR.join([f"({NUMBER})"] * 4))


def answer_part(text: str) -> str:
    """The part of a GLM answer that holds the box: after the box marker, else after the reasoning."""
    box_start = text.find(BEGIN_OF_BOX)
    if box_start >= 0:
        return text[box_start + len(BEGIN_OF_BOX):]
    thinking_end = text.rfind(END_OF_THINKING)
    return text[thinking_end + len(END_OF_THINKING):] if thinking_end >= 0 else text


class Glm4vAdapter(Qwen2VLAdapter, family="glm4v"):

    def __init__(self, config: Any) -> None:
        """Refuses a ``glm46v`` model whose language model is not the dense ``glm4v_text`` (GLM-4.6V's MoE backbone
        reads ``head_dim`` from its config, so the inherited Qwen2-VL rule, hidden // heads, would be wrong for it)."""
        super().__init__(config)
        text_type = None if self.config is None else getattr(self.config.get_text_config(), "model_type", None)
        if text_type not in (None, "glm4v_text"):
            raise UnsupportedModelError(
                f"the GLM-4V adapter covers the dense glm4v_text language model (GLM-4.1V, GLM-4.6V-Flash); this "
                f"model's is {text_type!r} (e.g. GLM-4.6V's MoE), whose head grid is not checked here. Describe its "
                "attention with vrh_interp.core.description.families.described.AttentionDescription, or pass an "
                "adapter of your own (adapter=...) that reads its head_dim."
            )

    def grounding_instruction(self, expression: str) -> str:
        return f"Help me to locate {expression} in the image and give me its bounding boxes."

    def format_box(self, box: Box, frame: BoxFrame) -> str:
        x1, y1, x2, y2 = checked_relative(box, frame.image_size, RELATIVE_SCALE)
        return f"{BEGIN_OF_BOX}[{x1},{y1},{x2},{y2}]{END_OF_BOX}"

    def parse_box(self, text: str, frame: BoxFrame) -> Box | BoxParseFailure:
        return parse_four_numbers(text, GLM_BOX, frame.image_size, RELATIVE_SCALE, "no [x1,y1,x2,y2] box found",
                                  within=answer_part(text))
