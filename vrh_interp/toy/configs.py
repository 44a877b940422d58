"""What loading the shipped toy VLMs needs: their families, visual grid and InternVL processor class.

The builders that made them (model configs, processors, prompts, box formats) are the trainer's
(``toy_training.configs`` at the repository root; not shipped in the wheel). The shipped models:

Both models share ONE tiny Qwen2 language backbone architecture (the paper's same-backbone pairs):

* model ``a``: ``LlavaForConditionalGeneration`` (LLaVA-1.5 class): CLIP vision tower, CLS dropped
  (``vision_feature_select_strategy="default"``), 2-layer GELU MLP projector. 96x96 images, patch 8,
  so 12x12 = 144 visual tokens, row-major; token (r, c) covers pixels x in [8c, 8c+8), y in
  [8r, 8r+8) of the original 96x96 image (the processor's resize/crop are identities at 96 px).
  Native box format: ``[x1, y1, x2, y2]`` with floats in [0, 1] and 2 decimals.
* model ``b``: ``InternVLForConditionalGeneration``: InternViT-type tower (layer scale, mean-pool
  head unused), pixel-shuffle (downsample 0.5) + MLP projector. One 192x192 tile (the processor
  upsamples the 96 px image 2x; ``crop_to_patches`` is off so there is no thumbnail), patch 8 ->
  24x24 patches -> 12x12 = 144 visual tokens after pixel shuffle, row-major, each covering the same
  8x8 original pixels as model a's tokens. Native format:
  ``<ref>EXPR</ref><box>[[x1, y1, x2, y2]]</box>`` with integers 0..1000 quantised to multiples of 10.

Both formats therefore use 101 values per coordinate (v/100 of the image side), so one dense
vision-pretraining target (box bins) serves both towers, and quantisation error is <= 0.5 % of the
side (0.48 px at 96 px), far below what IoU >= 0.5 tolerates.

Head-level study: the language backbone has 4 layers x 8 query heads (head_dim 16, 4 KV heads):
32 heads, i.e. top-1..3 heads are ~3-10 % of all heads, close to the paper's top-20 of ~1,000.
"""

from __future__ import annotations

from transformers import InternVLProcessor

from vrh_interp.data.scenes import IMAGE_SIZE
from vrh_interp.toy.names import FAMILIES as FAMILIES  # re-exported: the toys' names live in the torch-free module
from vrh_interp.toy.names import Family as Family
from vrh_interp.toy.names import ModelName as ModelName
from vrh_interp.toy.names import family as family

PATCH_SIZE = 8
GRID_SIDE = IMAGE_SIZE // PATCH_SIZE  # 12 visual tokens per row for both models


class InternVLImageOnlyProcessor(InternVLProcessor):
    """``InternVLProcessor`` without a video processor (which would need torchvision).

    The processor reads its attribute list from the ``__init__`` signature, so dropping the
    ``video_processor`` argument here is enough; images are processed exactly as upstream.
    """

    def __init__(self, image_processor=None, tokenizer=None, image_seq_length: int = GRID_SIDE * GRID_SIDE,
                 chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, image_seq_length=image_seq_length,
                         chat_template=chat_template, **kwargs)
