"""Mistral3 (``Mistral3ForConditionalGeneration``, e.g. ``mistralai/Mistral-Small-3.1-24B-Instruct-2503``).

Facts (read in transformers 5.24: ``models/mistral3/modeling_mistral3.py`` (``Mistral3PatchMerger``,
``Mistral3Model.get_placeholder_mask``), ``models/pixtral/processing_pixtral.py``
(``replace_image_token``, ``_get_num_multimodal_tokens``), ``models/pixtral/image_processing_pil_pixtral.py``
(``get_resize_output_image_size``); checked by the layout experiment in ``tests/families/test_families.py -k mistral3``):

* Language backbone: Mistral, ``model.language_model.layers[i].self_attn`` with ``o_proj``; ``head_dim``
  from the text config (128 with hidden 5120 / 32 heads in Mistral-Small-3.1 [GK]: never hidden // heads).
* Placeholders: ``processor.image_token`` (``[IMG]``) carries the image features; the processor writes
  ``[IMG]`` x cols + ``[IMG_BREAK]`` per row, the last ``[IMG_BREAK]`` replaced by ``[IMG_END]``
  (rows * (cols + 1) tokens). Break/end tokens are ordinary embeddings: visual positions in no block.
* Layout: the image is downscaled to fit ``longest_edge`` (each side ``floor``-ed) and then each side is
  rounded UP to a multiple of P = vision patch x ``spatial_merge_size`` (14 x 2 = 28 for Mistral-Small-3.1 [GK],
  ``image_sizes`` holds the result), in ONE resize from the original size: both axes are stretched
  independently, nothing is cropped or padded. The patch merger groups merge x merge patches row-major, so
  token (r, c) of the (h' / P) x (w' / P) grid covers x in [c W / cols, (c + 1) W / cols) of the ORIGINAL
  image, y likewise.
* Grounding format: Mistral documents none, so the instruction asks for the LLaVA-style
  ``[x1, y1, x2, y2]`` with 0-1 coordinates (two decimals) relative to the whole image, and ``parse_box``
  reads the first such box (``vrh_interp.core.description.families.prompts.RequestedRelativeBoxAdapter``).
"""  # noqa: E501

from __future__ import annotations

from typing import Any, Mapping

from vrh_interp.core.description.families.base import VisualBlock, VisualLayout, image_token_positions
from vrh_interp.core.description.families.coordinates import whole_image
from vrh_interp.core.description.families.prompts import RequestedRelativeBoxAdapter


class Mistral3Adapter(RequestedRelativeBoxAdapter, family="mistral3"):

    def token_pixels(self) -> int:
        """Side of one merged token in resized-input pixels (vision patch x spatial merge)."""
        return int(self.config.vision_config.patch_size) * int(self.config.spatial_merge_size)

    def visual_layout(self, encoding: Mapping[str, Any], image_size: tuple[int, int], processor: Any,
                      batch_index: int = 0) -> VisualLayout:
        width, height = image_size
        if width <= 0 or height <= 0:
            raise ValueError(f"image size {image_size} is not positive")
        resized_h, resized_w = (int(v) for v in encoding["image_sizes"][batch_index])
        rows, cols = resized_h // self.token_pixels(), resized_w // self.token_pixels()
        input_ids = encoding["input_ids"][batch_index]
        image = image_token_positions(input_ids, self.image_token_id(processor))
        ids = processor.tokenizer.convert_tokens_to_ids
        breaks = image_token_positions(input_ids, ids(processor.image_break_token))
        ends = image_token_positions(input_ids, ids(processor.image_end_token))
        if len(image) != rows * cols or len(breaks) != rows - 1 or len(ends) != 1:
            raise ValueError(
                f"row {batch_index} has {len(image)} [IMG], {len(breaks)} [IMG_BREAK], {len(ends)} [IMG_END] tokens "
                f"but image_sizes {[resized_h, resized_w]} describes {rows} x {cols} tokens; expected one image "
                "per prompt"
            )
        block = VisualBlock("image", image, rows, cols, whole_image(image_size))
        return VisualLayout(image_size=image_size, visual_positions=tuple(sorted(image + breaks + ends)),
                            blocks=(block,), input_size=(resized_w, resized_h))
