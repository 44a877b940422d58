"""Gemma 3 (``Gemma3ForConditionalGeneration``: SigLIP tower, average-pooled projector, Gemma3 LM).

Facts (read in transformers 5.24: ``models/gemma3/processing_gemma3.py``,
``models/gemma3/image_processing_pil_gemma3.py``, ``models/gemma3/modeling_gemma3.py``,
``models/gemma3/configuration_gemma3.py``; checked by the layout experiment in
``tests/families/test_families.py -k gemma3``):

* Language backbone: ``model.language_model.layers[i].self_attn`` (``o_proj``, with ``q_norm``/``k_norm``
  RMS norms on queries and keys before RoPE); heads, KV heads and head_dim from ``config.text_config``.
* Readout caveats: attention scores are scaled by ``query_pre_attn_scalar**-0.5`` (not head_dim**-0.5);
  ``text_config.layer_types`` interleaves ``sliding_attention`` layers (window ``sliding_window``, RoPE from
  ``rope_parameters["sliding_attention"]``) with ``full_attention`` layers (5:1 in released checkpoints);
  the window also bounds the bidirectional image block, so on long prompts a sliding layer's answer tokens
  cannot see early visual tokens at all.
* Attention is NON-CAUSAL inside each image block: tokens with ``token_type_ids == 1`` (the
  ``<image_soft_token>`` run of one image) attend to each other bidirectionally; text stays causal.
* Layout: the chat template writes ``<start_of_image>``; the processor expands it to
  ``\\n\\n<start_of_image>`` + ``mm_tokens_per_image`` x ``<image_soft_token>`` + ``<end_of_image>\\n\\n``.
  The image is stretched to S x S (no crop, no pad), the (S/patch)^2 SigLIP patches are average-pooled to
  a square sqrt(mm_tokens_per_image)-sided grid (``Gemma3MultiModalProjector``; 896 px, patch 14, 256
  tokens -> 64 x 64 patches pooled 4 x 4 -> 16 x 16), row-major. Only ``<image_soft_token>`` positions
  (``config.image_token_index``) are visual; ``<start_of_image>``/``<end_of_image>`` are ordinary tokens.
* Pan & scan (only when the processor is called with ``do_pan_and_scan=True``; set
  ``Gemma3Adapter(config, do_pan_and_scan=True)`` to encode that way): the whole image block comes first,
  then one block per crop, in order, with the processor's "Here is the original image ... and here are
  some crops ..." text between them (not visual). Crops split only the long side into n equal strips of
  ceil(side / n) pixels (the last one clipped at the image edge), each stretched to S x S. The number of
  crops is read from the encoding (soft-token count / tokens per image - 1).
* Native box format: Gemma 3 has no documented grounding format. This adapter uses the convention of
  Google's Gemini API docs (Gemma 3 shares Gemini's lineage; that it was trained on it is NOT documented):
  JSON ``{"box_2d": [y_min, x_min, y_max, x_max]}`` with integers 0-1000 relative to the ORIGINAL image,
  y first, and asks for exactly that in the grounding instruction.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

from PIL import Image

from vrh_interp.core.description.boxes import Box, BoxParseFailure
from vrh_interp.core.description.families.base import BoxFrame, FamilyAdapter, VisualBlock, VisualLayout, block_count
from vrh_interp.core.description.families.coordinates import (FOUR_NUMBERS, Region, checked_relative,
                                                              parse_four_numbers, whole_image)

BOX_2D_SCALE = 1000
BOX_2D = re.compile(rf"\"?box_2d\"?\s*:\s*\[\s*{FOUR_NUMBERS.pattern}\s*\]")


def pan_and_scan_crops(image_size: tuple[int, int], num_crops: int) -> list[Region]:
    """Regions (original pixels) of the ``num_crops`` pan & scan crops, in the processor's order."""
    width, height = image_size
    if width >= height:
        crop_width = math.ceil(width / num_crops)
        return [(float(i * crop_width), 0.0, float(min((i + 1) * crop_width, width)), float(height))
                for i in range(num_crops)]
    crop_height = math.ceil(height / num_crops)
    return [(0.0, float(i * crop_height), float(width), float(min((i + 1) * crop_height, height)))
            for i in range(num_crops)]


@dataclass
class Gemma3Adapter(FamilyAdapter, family="gemma3"):
    non_causal_image_attention: ClassVar[bool] = True

    do_pan_and_scan: bool = False

    def image_token(self, processor: Any) -> str:
        return processor.tokenizer.image_token

    def grounding_instruction(self, expression: str) -> str:
        return (
            f"Detect {expression}. Output its bounding box as JSON {{\"box_2d\": [y_min, x_min, y_max, x_max]}} "
            "with coordinates normalized to 0-1000."
        )

    def encode(self, processor: Any, images: Sequence[Image.Image], prompts: Sequence[str]) -> Any:
        """One image per prompt: ``Gemma3Processor`` reads a flat image list as ONE sample's images."""
        return processor(images=[[image] for image in images], text=list(prompts), return_tensors="pt",
                         padding=True, do_pan_and_scan=self.do_pan_and_scan)

    def tokens_per_side(self) -> int:
        """Side of the pooled token grid, as ``Gemma3MultiModalProjector.tokens_per_side`` computes it."""
        return int(self.config.mm_tokens_per_image ** 0.5)

    def visual_layout(self, encoding: Mapping[str, Any], image_size: tuple[int, int], processor: Any,
                      batch_index: int = 0) -> VisualLayout:
        positions = self.image_positions(encoding, processor, batch_index)
        side = self.tokens_per_side()
        per_block = side * side
        num_crops = block_count(positions, side, side, "image blocks") - 1
        regions = [whole_image(image_size)]
        if num_crops:
            regions += pan_and_scan_crops(image_size, num_crops)
        blocks: list[VisualBlock] = [
            VisualBlock("image" if index == 0 else f"crop_{index - 1}",
                        positions[index * per_block:(index + 1) * per_block], side, side, region)
            for index, region in enumerate(regions)
        ]
        vision = self.config.vision_config
        return VisualLayout(image_size=image_size, visual_positions=tuple(positions), blocks=tuple(blocks),
                            input_size=(vision.image_size, vision.image_size))

    def format_box(self, box: Box, frame: BoxFrame) -> str:
        x1, y1, x2, y2 = checked_relative(box, frame.image_size, BOX_2D_SCALE)
        return f'{{"box_2d": [{y1}, {x1}, {y2}, {x2}]}}'

    def parse_box(self, text: str, frame: BoxFrame) -> Box | BoxParseFailure:
        return parse_four_numbers(text, BOX_2D, frame.image_size, BOX_2D_SCALE,
                                  'no "box_2d": [y_min, x_min, y_max, x_max] found', y_first=True)
