"""InternVL, HF-native (``InternVLForConditionalGeneration``, e.g. ``OpenGVLab/InternVL3-1B-hf``).

Facts (read in transformers 5.24: ``models/internvl/processing_internvl.py``,
``models/internvl/modeling_internvl.py``, ``models/got_ocr2/image_processing_pil_got_ocr2.py``;
checked by the layout experiment in ``tests/families/test_families.py -k internvl``):

* Language backbone: ``model.language_model.layers[i].self_attn`` (Qwen2/Llama style, ``o_proj``);
  heads, KV heads and head_dim from ``config.text_config``.
* Image placeholder: the chat template writes ``<IMG_CONTEXT>``; the processor expands it to
  ``<img>`` + ``image_seq_length * num_tiles`` x ``<IMG_CONTEXT>`` + ``</img>``. Only ``<IMG_CONTEXT>``
  positions carry visual features; ``<img>``/``</img>`` are ordinary embeddings.
* Tiling (``GotOcr2ImageProcessor.crop_image_to_patches``; the processor forces ``crop_to_patches=True``):
  ``get_optimal_tiled_canvas`` picks the cols x rows grid (min_patches <= cols*rows <= max_patches) whose
  aspect ratio is closest to the image's (ties go to more tiles while the image area exceeds half the
  canvas), the image is STRETCHED to (cols*T, rows*T) and cut into T x T tiles in row-major order, and a
  thumbnail (the whole image stretched to T x T) comes LAST when there is more than one tile. One tile =
  the whole image stretched to T x T, no thumbnail.
* Tokens per tile: the vision tower's (T/patch) x (T/patch) patch grid, pixel-shuffled by
  ``downsample_ratio`` (0.5) to G x G tokens, row-major (448 px, patch 14 -> 16 x 16 = 256).
* The number of tiles is read from the encoding (``<IMG_CONTEXT>`` count / tokens per tile) and the
  tile size from ``pixel_values``; the grid shape is recomputed with the processor's own
  ``get_optimal_tiled_canvas`` from the image processor's ``min_patches``/``max_patches`` and checked
  against that count (a call-time override of those two values raises instead of giving wrong tokens).
* Native grounding format (InternVL's RefCOCO evaluation prompt and answers):
  ``<ref>EXPR</ref><box>[[x1, y1, x2, y2]]</box>`` with integers 0-1000 relative to the ORIGINAL image.
  ``format_box`` writes the ``<box>`` part (the expression is echoed by the model before it);
  ``parse_box`` reads the first ``[[x1, y1, x2, y2`` group, whitespace allowed between tokens (the toy
  model's word-level tokenizer decodes ``<box> [ [ 120 , 340 , 560 , 780 ] ] </box>``).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Mapping, Sequence

from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import get_optimal_tiled_canvas

from vrh_interp.core.description.boxes import Box, BoxParseFailure
from vrh_interp.core.description.families.base import BoxFrame, FamilyAdapter, VisualBlock, VisualLayout, block_count
from vrh_interp.core.description.families.coordinates import NUMBER, checked_relative, parse_four_numbers, whole_image
from vrh_interp.core.description.families.prompts import REFERRING_INSTRUCTION

INTERNVL_SCALE = 1000
INTERNVL_BOX = re.compile(
    rf"\[\s*\[\s*({NUMBER})\s*,\s*({NUMBER})\s*,\s*({NUMBER})\s*,\s*({NUMBER})\s*\]"
)


def tiled_image_blocks(
    positions: Sequence[int],
    image_size: tuple[int, int],
    tile_size: tuple[int, int],
    tokens_per_tile: tuple[int, int],
    min_tiles: int,
    max_tiles: int,
) -> tuple[VisualBlock, ...]:
    """Blocks of one image tiled the GOT-OCR2 / InternVL / Aya Vision way.

    ``positions`` are the image's visual-token positions in sequence order, ``tile_size`` is the tile's
    (height, width) in resized pixels, ``tokens_per_tile`` its (rows, cols) token grid; the number of
    tiles is ``len(positions)`` divided by the tokens per tile.
    """
    grid_rows, grid_cols = tokens_per_tile
    per_tile = grid_rows * grid_cols
    num_tiles = block_count(positions, grid_rows, grid_cols, "tiles")
    width, height = image_size
    if num_tiles == 1:
        return (VisualBlock("image", positions, grid_rows, grid_cols, whole_image(image_size)),)
    cols, rows = get_optimal_tiled_canvas((height, width), tile_size, min_tiles, max_tiles)
    if cols * rows + 1 != num_tiles:
        raise ValueError(
            f"the encoding has {num_tiles} tiles but the tiling rule (min {min_tiles}, max {max_tiles} tiles, "
            f"tile {tile_size}) gives a {cols}x{rows} grid plus a thumbnail for a {width}x{height} image; "
            "was the processor called with other min_patches/max_patches than its image processor's?"
        )
    blocks = []
    for index in range(cols * rows):
        row, col = divmod(index, cols)
        region = (col * width / cols, row * height / rows, (col + 1) * width / cols, (row + 1) * height / rows)
        tile_positions = positions[index * per_tile:(index + 1) * per_tile]
        blocks.append(VisualBlock(f"tile_r{row}_c{col}", tile_positions, grid_rows, grid_cols, region))
    blocks.append(VisualBlock("thumbnail", positions[-per_tile:], grid_rows, grid_cols, whole_image(image_size)))
    return tuple(blocks)


def tile_size_of(encoding: Mapping[str, Any]) -> tuple[int, int]:
    """(height, width) of the tiles in ``pixel_values`` (tiles of all images are stacked on dim 0)."""
    pixel_values = encoding.get("pixel_values")
    if pixel_values is None:
        raise ValueError("the encoding has no pixel_values: encode the image with the processor first")
    height, width = pixel_values.shape[-2:]
    return int(height), int(width)


def tiled_visual_layout(adapter: Any, encoding: Mapping[str, Any], image_size: tuple[int, int], processor: Any,
                        batch_index: int = 0) -> VisualLayout:
    """Layout of row ``batch_index``'s image for GOT-OCR2-tiling processors (InternVL, Aya Vision).

    The token grid per tile comes from ``adapter.tokens_per_tile()``, the tile size from ``pixel_values`` and the
    tile-count bounds from the processor's image processor (``min_patches``/``max_patches``); see
    ``tiled_image_blocks``.
    """
    positions = adapter.image_positions(encoding, processor, batch_index)
    image_processor = processor.image_processor
    blocks = tiled_image_blocks(positions, image_size, tile_size_of(encoding), adapter.tokens_per_tile(),
                                image_processor.min_patches, image_processor.max_patches)
    return VisualLayout(image_size=image_size, visual_positions=tuple(positions), blocks=blocks)


class InternVLAdapter(FamilyAdapter, family="internvl"):
    image_prefix_cache: ClassVar[bool] = True

    def grounding_instruction(self, expression: str) -> str:
        return REFERRING_INSTRUCTION.format(f"<ref>{expression}</ref>")

    def tokens_per_tile(self) -> tuple[int, int]:
        vision = self.config.vision_config
        ratio = self.config.downsample_ratio
        return (int(vision.image_size[0] // vision.patch_size[0] * ratio),
                int(vision.image_size[1] // vision.patch_size[1] * ratio))

    def visual_layout(self, encoding: Mapping[str, Any], image_size: tuple[int, int], processor: Any,
                      batch_index: int = 0) -> VisualLayout:
        return tiled_visual_layout(self, encoding, image_size, processor, batch_index)

    def format_box(self, box: Box, frame: BoxFrame) -> str:
        values = checked_relative(box, frame.image_size, INTERNVL_SCALE)
        return "<box>[[" + ", ".join(str(v) for v in values) + "]]</box>"

    def parse_box(self, text: str, frame: BoxFrame) -> Box | BoxParseFailure:
        return parse_four_numbers(text, INTERNVL_BOX, frame.image_size, INTERNVL_SCALE,
                                  "no [[x1, y1, x2, y2]] box found")
