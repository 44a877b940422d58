"""Aya Vision (``AyaVisionForConditionalGeneration``: SigLIP tower, pixel shuffle, Cohere2 language model).

Facts (read in transformers 5.24: ``models/aya_vision/processing_aya_vision.py``,
``models/aya_vision/modeling_aya_vision.py``, ``models/cohere2/modeling_cohere2.py``; checked by the layout
experiment in ``tests/families/test_families.py -k aya_vision``):

* Language backbone: ``model.language_model.layers[i].self_attn`` (Cohere2, ``o_proj``). The text config
  has no ``head_dim``: it is hidden_size // num_attention_heads, as in ``Cohere2Attention``. Layers follow
  ``text_config.layer_types``: sliding-window layers apply RoPE, full-attention layers use NO position
  encoding.
* Tiling: the GOT-OCR2 image processor with ``crop_to_patches=True`` (forced by the processor), i.e. the
  InternVL rule (``vrh_interp.core.description.families.internvl.tiled_image_blocks``): closest-aspect cols x rows grid,
  image stretched to (cols*T, rows*T), tiles row-major, global thumbnail LAST when there is more than one
  tile. Each tile is (T/patch) x (T/patch) SigLIP patches pixel-shuffled by ``downsample_factor`` (2) to
  G x G tokens, row-major (364 px, patch 14 -> 13 x 13 = 169).
* Prompt: the chat template writes ``<image>``; the processor expands it to ``<|START_OF_IMG|>``, then
  ``TILE_k`` + G*G ``<|IMG_PATCH|>`` per tile, ``TILE_GLOBAL`` + G*G ``<|IMG_PATCH|>``, ``<|END_OF_IMG|>``.
  Only ``<|IMG_PATCH|>`` positions are visual (``config.image_token_index``); the tile markers are text.
* Native box format: Aya Vision has no documented grounding format. This adapter uses plain text
  ``[x1, y1, x2, y2]`` with 0-1 floats (two decimals) relative to the ORIGINAL image and asks for exactly
  that in the grounding instruction (the requested format shared with the Mistral3 and Idefics3 adapters:
  ``vrh_interp.core.description.families.prompts.RequestedRelativeBoxAdapter``).
"""

from __future__ import annotations

from typing import Any, Mapping

from vrh_interp.core.description.families.base import VisualLayout
from vrh_interp.core.description.families.internvl import tiled_visual_layout
from vrh_interp.core.description.families.prompts import RequestedRelativeBoxAdapter


class AyaVisionAdapter(RequestedRelativeBoxAdapter, family="aya_vision"):

    def image_token(self, processor: Any) -> str:
        return processor.img_patch_token

    def tokens_per_tile(self) -> tuple[int, int]:
        vision = self.config.vision_config
        side = vision.image_size // vision.patch_size // self.config.downsample_factor
        return side, side

    def visual_layout(self, encoding: Mapping[str, Any], image_size: tuple[int, int], processor: Any,
                      batch_index: int = 0) -> VisualLayout:
        return tiled_visual_layout(self, encoding, image_size, processor, batch_index)
