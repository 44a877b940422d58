"""PaliGemma and PaliGemma 2 (``PaliGemmaForConditionalGeneration``: SigLIP, linear projector, Gemma/Gemma2).

Facts (read in transformers 5.24: ``models/paligemma/processing_paligemma.py``,
``models/paligemma/modeling_paligemma.py``, ``models/paligemma/configuration_paligemma.py``; box
dequantisation from big_vision ``evaluators/proj/paligemma/transfers/segmentation.py``; checked by the
layout experiment in ``tests/families/test_families.py -k paligemma``):

* Language backbone: ``model.language_model.layers[i].self_attn`` (``o_proj``); heads, KV heads and
  head_dim from ``config.text_config``. PaliGemma 2's Gemma2 backbone alternates sliding-window and global
  layers and scales queries by ``query_pre_attn_scalar**-0.5`` with attention-logit soft-capping.
* Attention is NON-CAUSAL over the whole prefix (image tokens, ``<bos>``, the prompt and its ``\\n``):
  tokens with ``token_type_ids == 0`` attend bidirectionally (``use_bidirectional_attention`` defaults to
  True); only generated tokens are causal.
* Layout: the image is stretched to S x S (no crop, no pad) and its (S/patch)^2 SigLIP tokens fill the
  ``<image>`` positions row-major, FIRST in the sequence (224 px, patch 14 -> 16 x 16 = 256).
* Encoding: ``PaliGemmaProcessor`` also returns ``labels`` (prompt positions masked, kept "for BC");
  ``encode`` drops them so forwards and generation compute no loss.
* Prompt: there is no chat template. The processor puts the image tokens first, inserts ``<bos>`` after the
  last ``<image>`` and appends ``\\n``. The grounding prompt is ``<image>detect EXPR``: the detection task
  prefix of the PaliGemma model card (``detect CLASS ; CLASS``) with the referring expression in place of
  a class name.
* Native box format: ``<locY1><locX1><locY2><locX2> label``: four of the ``<loc0000>``..``<loc1023>``
  tokens the processor adds, y before x, bin = round(coordinate / side * 1023) and coordinate =
  bin / 1023 * side (big_vision's evaluator divides by 1023). ``format_box`` writes the four location
  tokens (the label follows them in the model's answer); ``parse_box`` reads the first four in a row.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Mapping, Sequence

from PIL import Image

from vrh_interp.core.description.boxes import Box, BoxParseFailure
from vrh_interp.core.description.families.base import BoxFrame, FamilyAdapter, VisualBlock, VisualLayout
from vrh_interp.core.description.families.coordinates import checked_relative, parse_four_numbers, whole_image

LOCATION_BINS = 1024
LOCATION_SCALE = LOCATION_BINS - 1
LOCATION_BOX = re.compile(r"<loc(\d{4})>\s*<loc(\d{4})>\s*<loc(\d{4})>\s*<loc(\d{4})>")


class PaliGemmaAdapter(FamilyAdapter, family="paligemma"):
    non_causal_image_attention: ClassVar[bool] = True
    answer_token_type_id: ClassVar[int] = 1  # type 0 is the bidirectional prefix: appended answers must be 1

    def grounding_instruction(self, expression: str) -> str:
        return f"detect {expression}"

    def grounding_prompt(self, processor: Any, expression: str) -> str:
        """``<image>detect EXPR``: PaliGemma takes a task prefix, not a chat turn."""
        return f"{processor.image_token}{self.grounding_instruction(expression)}"

    def encode(self, processor: Any, images: Sequence[Image.Image], prompts: Sequence[str]) -> Any:
        """The processor's model inputs without its ``labels`` (a training leftover it always returns)."""
        encoding = processor(images=list(images), text=list(prompts), return_tensors="pt", padding=True)
        encoding.pop("labels", None)
        return encoding

    def visual_layout(self, encoding: Mapping[str, Any], image_size: tuple[int, int], processor: Any,
                      batch_index: int = 0) -> VisualLayout:
        positions = self.image_positions(encoding, processor, batch_index)
        vision = self.config.vision_config
        side = vision.image_size // vision.patch_size
        if len(positions) != side * side:
            raise ValueError(f"expected {side * side} <image> tokens for one image, found {len(positions)}")
        block = VisualBlock("image", positions, side, side, whole_image(image_size))
        return VisualLayout(image_size=image_size, visual_positions=tuple(positions), blocks=(block,),
                            input_size=(vision.image_size, vision.image_size))

    def format_box(self, box: Box, frame: BoxFrame) -> str:
        x1, y1, x2, y2 = checked_relative(box, frame.image_size, LOCATION_SCALE)
        return "".join(f"<loc{v:04d}>" for v in (y1, x1, y2, x2))

    def parse_box(self, text: str, frame: BoxFrame) -> Box | BoxParseFailure:
        return parse_four_numbers(text, LOCATION_BOX, frame.image_size, LOCATION_SCALE,
                                  "no run of four <locNNNN> tokens found", y_first=True)
