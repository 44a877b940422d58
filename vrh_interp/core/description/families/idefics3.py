"""Idefics3 and SmolVLM (``Idefics3ForConditionalGeneration``, ``SmolVLMForConditionalGeneration``).

Facts (read in transformers 5.24: ``models/idefics3/processing_idefics3.py``,
``models/idefics3/image_processing_pil_idefics3.py``, ``models/idefics3/modeling_idefics3.py`` and the
SmolVLM copies in ``models/smolvlm/``, whose image processor and prompt layout are the same; checked by the
layout experiment in ``tests/families/test_families.py -k idefics3``):

* Language backbone: ``model.text_model.layers[i].self_attn`` (Llama, ``o_proj``), not
  ``model.language_model``; heads, KV heads and head_dim from ``config.text_config``.
* Resize policy with ``do_image_splitting`` (the default): the longest edge is resized to
  ``size["longest_edge"]`` = L (small images are UPSCALED; the other side keeps the aspect ratio, rounded
  down and then up to an even number), then each side is stretched up to a multiple of
  ``max_image_size["longest_edge"]`` = M (``resize_for_vision_encoder``). Both steps stretch the whole
  image, so the final (W', H') canvas maps linearly onto the original. If W' or H' exceeds M the canvas
  is cut into (H'/M) x (W'/M) M x M tiles in row-major order and the global image (the canvas stretched to
  M x M) comes LAST; otherwise the canvas itself is the only frame. Without splitting the image is
  stretched to M x M.
* Tokens per frame: (M/patch) x (M/patch) patches, pixel-shuffled by ``scale_factor`` to g x g tokens,
  row-major (``Idefics3Connector.pixel_shuffle``); ``image_seq_len`` = g*g ``<image>`` tokens per frame.
* Prompt: each tile is ``<fake_token_around_image><row_r_col_c>`` + g*g ``<image>``, rows end with
  ``\\n``, then ``\\n<fake_token_around_image><global-img>`` + g*g ``<image>`` +
  ``<fake_token_around_image>``. Only ``<image>`` positions are visual; the markers are ordinary tokens.
  The processor drops its ``rows``/``cols`` outputs, so the grid is recomputed from the image size with
  the image processor's settings and checked against the ``<image>`` count of the encoding.
* Native box format: none is standardised for these models and released SmolVLM/Idefics3 checkpoints
  were not trained to ground. This adapter uses plain text ``[x1, y1, x2, y2]`` with 0-1 floats (two
  decimals) relative to the ORIGINAL image, and the grounding instruction asks for exactly that (the
  requested format shared with the Mistral3 and Aya Vision adapters:
  ``vrh_interp.core.description.families.prompts.RequestedRelativeBoxAdapter``).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Mapping

import numpy as np
from transformers.models.idefics3.image_processing_pil_idefics3 import get_resize_output_image_size

from vrh_interp.core.description.families.base import VisualBlock, VisualLayout, block_count
from vrh_interp.core.description.families.coordinates import whole_image
from vrh_interp.core.description.families.prompts import RequestedRelativeBoxAdapter


def split_canvas_size(image_size: tuple[int, int], longest_edge: int, frame_size: int) -> tuple[int, int]:
    """(width, height) of the canvas ``Idefics3ImageProcessor`` cuts into frames, for an original image.

    Mirrors ``resize`` (longest edge, via transformers' own ``get_resize_output_image_size``) followed by
    ``resize_for_vision_encoder``. The image processor's ``get_number_of_image_patches`` is NOT used: it
    rounds the short side up from the first resize instead of from the widened canvas, which disagrees
    with the real processing when L is not a multiple of M (L=100, M=32, 100x60 image: it says 2x4 tiles,
    the processor makes 3x4).
    """
    width, height = image_size
    resized_height, resized_width = get_resize_output_image_size(
        np.empty((0, height, width)), resolution_max_side=longest_edge
    )
    aspect_ratio = resized_width / resized_height
    if resized_width >= resized_height:
        canvas_width = math.ceil(resized_width / frame_size) * frame_size
        canvas_height = math.ceil(int(canvas_width / aspect_ratio) / frame_size) * frame_size
    else:
        canvas_height = math.ceil(resized_height / frame_size) * frame_size
        canvas_width = math.ceil(int(canvas_height * aspect_ratio) / frame_size) * frame_size
    return canvas_width, canvas_height


def frame_blocks(positions: list[int], image_size: tuple[int, int], num_frames: int, side: int,
                 image_processor: Any) -> tuple[VisualBlock, ...]:
    """Blocks of the tiles (row-major) and the global image (last) of one image."""
    width, height = image_size
    per_frame = side * side
    if num_frames == 1:
        return (VisualBlock("global", positions, side, side, whole_image(image_size)),)
    frame_size = image_processor.max_image_size["longest_edge"]
    canvas_width, canvas_height = split_canvas_size(image_size, image_processor.size["longest_edge"], frame_size)
    rows, cols = canvas_height // frame_size, canvas_width // frame_size
    if rows * cols + 1 != num_frames:
        raise ValueError(
            f"the encoding has {num_frames} frames but the splitting rule gives {rows}x{cols} tiles plus the "
            f"global image for a {width}x{height} image (size {image_processor.size}, max_image_size "
            f"{image_processor.max_image_size}); was the processor called with other sizes?"
        )
    x_scale, y_scale = width / canvas_width, height / canvas_height
    blocks: list[VisualBlock] = []
    for index in range(rows * cols):
        row, col = divmod(index, cols)
        region = (col * frame_size * x_scale, row * frame_size * y_scale,
                  (col + 1) * frame_size * x_scale, (row + 1) * frame_size * y_scale)
        blocks.append(VisualBlock(f"tile_r{row}_c{col}", positions[index * per_frame:(index + 1) * per_frame],
                                  side, side, region))
    blocks.append(VisualBlock("global", positions[-per_frame:], side, side, whole_image(image_size)))
    return tuple(blocks)


class Idefics3Adapter(RequestedRelativeBoxAdapter, family="idefics3"):
    layers_path: ClassVar[str] = "model.text_model.layers"

    def tokens_per_side(self) -> int:
        vision = self.config.vision_config
        return vision.image_size // vision.patch_size // self.config.scale_factor

    def visual_layout(self, encoding: Mapping[str, Any], image_size: tuple[int, int], processor: Any,
                      batch_index: int = 0) -> VisualLayout:
        positions = self.image_positions(encoding, processor, batch_index)
        side = self.tokens_per_side()
        num_frames = block_count(positions, side, side, "frames")
        blocks = frame_blocks(positions, image_size, num_frames, side, processor.image_processor)
        return VisualLayout(image_size=image_size, visual_positions=tuple(positions), blocks=blocks)
