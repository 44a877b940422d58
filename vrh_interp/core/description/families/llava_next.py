"""LLaVA-NeXT / LLaVA-1.6 (``LlavaNextForConditionalGeneration``, e.g. ``llava-hf/llava-v1.6-mistral-7b-hf``).

Facts (read in transformers 5.24: ``models/llava_next/modeling_llava_next.py`` (``get_anyres_image_grid_shape``,
``unpad_image``, ``LlavaNextModel.pack_image_features``), ``models/llava_next/processing_llava_next.py``
(``_get_number_of_features``), ``models/llava_next/image_processing_pil_llava_next.py``,
``image_processing_utils.py`` (``select_best_resolution``, ``get_patch_output_size``); checked by the layout
experiment in ``tests/families/test_families.py -k llava_next``):

* Language backbone and placeholder as LLaVA-1.5 (``model.language_model.layers[i].self_attn.o_proj``,
  ``<image>``).
* Base view FIRST: the whole image stretched to the tile size T x T (``vision_config.image_size``), a
  g x g row-major grid (g = T // patch; the CLS token dropped with the ``"default"`` strategy).
* Then the tiles: the best resolution (bh, bw) of ``image_grid_pinpoints`` for the original (h, w); the image
  is resized keeping its aspect ratio to ``get_patch_output_size`` (the long side fills, the other side
  ``ceil``-ed), pasted centred (``(b - new) // 2`` before) on a zero canvas and cut into (bh/T) x (bw/T) tiles
  of T x T, row-major. The model reassembles the tile features into one (bh/T * g) x (bw/T * g) grid,
  removes the padded rows or columns with ``unpad_image`` (computed on the TOKEN grid: ``round(h * cur_w /
  w, 7)`` rows kept, ``(cur - new) // 2`` dropped on each side, so an odd remainder keeps one extra row),
  and appends one ``image_newline`` token after each kept row. Newline positions are visual positions but
  belong to no block. At extreme aspect ratios (e.g. 2000x40, 1x40) ``unpad_image`` keeps 0 rows (no tile
  token, no newline) or 0 columns (a newline per row and nothing else); the layout is then the base view
  alone. Inside one tile the g x g tokens cover the first g * patch pixels of the tile (exactly T when patch
  divides T, as in the released 336 / 14 checkpoints; SigLIP's 384 / 14 leaves a gap of
  6 pixels per tile, see ``llava_onevision``), so the layout has one block per tile: the kept part of that
  tile's token grid, mapped back to the original image.
* Native grounding format: as LLaVA-1.5 (``[x1, y1, x2, y2]``, 0-1 floats, 2 decimals), relative to the
  whole ORIGINAL image, which is what the model sees (the base view is stretched, the tiles unpadded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch
from transformers.image_processing_utils import get_patch_output_size, select_best_resolution
from transformers.image_utils import ChannelDimension
from transformers.models.llava_next.modeling_llava_next import get_anyres_image_grid_shape, unpad_image

from vrh_interp.core.description.families.base import BoxFrame, VisualBlock, VisualLayout
from vrh_interp.core.description.families.coordinates import Region, whole_image
from vrh_interp.core.description.families.llava import LlavaAdapter, split_class_token


@dataclass(frozen=True)
class TiledCanvas:
    """The best-resolution canvas: the image resized to ``resized`` (h, w) and pasted at ``paste`` (y, x)."""

    image_hw: tuple[int, int]
    resized: tuple[int, int]
    paste: tuple[int, int]

    def region(self, u0: float, v0: float, u1: float, v1: float) -> Region:
        """Canvas pixel rectangle [u0, u1) x [v0, v1) in original-image pixels."""
        (height, width), (new_h, new_w), (paste_y, paste_x) = self.image_hw, self.resized, self.paste
        sx, sy = width / new_w, height / new_h
        return ((u0 - paste_x) * sx, (v0 - paste_y) * sy, (u1 - paste_x) * sx, (v1 - paste_y) * sy)


@dataclass(frozen=True)
class KeptGrid:
    """The unpadded token grid: rows [row0, row0 + rows) and columns [col0, col0 + cols) of the full grid."""

    row0: int
    col0: int
    rows: int
    cols: int


def tiled_canvas(image_hw: tuple[int, int], best_resolution: tuple[int, int]) -> TiledCanvas:
    """Aspect-preserving resize + centred pad of ``LlavaNextImageProcessor._pad_for_patching``."""
    height, width = image_hw
    new_h, new_w = get_patch_output_size(np.empty((1, height, width)), best_resolution, ChannelDimension.FIRST)
    best_h, best_w = best_resolution
    return TiledCanvas(image_hw=image_hw, resized=(new_h, new_w), paste=((best_h - new_h) // 2, (best_w - new_w) // 2))


def kept_token_grid(full_rows: int, full_cols: int, image_hw: tuple[int, int]) -> KeptGrid:
    """Which rows/columns of the reassembled tile grid survive the model's own ``unpad_image``."""
    index = torch.arange(full_rows * full_cols).view(1, full_rows, full_cols)
    kept = unpad_image(index, list(image_hw))
    rows, cols = int(kept.shape[1]), int(kept.shape[2])
    if rows == 0 or cols == 0:  # extreme aspect ratios: no tile token survives (the rows' newlines still do)
        return KeptGrid(row0=0, col0=0, rows=rows, cols=cols)
    first = int(kept[0, 0, 0])
    return KeptGrid(row0=first // full_cols, col0=first % full_cols, rows=rows, cols=cols)


def tile_blocks(grid_positions: list[list[int]], kept: KeptGrid, canvas: TiledCanvas, tile_size: int,
                tile_tokens: int, patch: int) -> list[VisualBlock]:
    """One block per tile: the kept part of its token grid, spanning ``tile_tokens * patch`` pixels per tile."""
    blocks = []
    tiles_down = -(-(kept.row0 + kept.rows) // tile_tokens)
    tiles_across = -(-(kept.col0 + kept.cols) // tile_tokens)
    for tile_row in range(kept.row0 // tile_tokens, tiles_down):
        rows = range(max(kept.row0, tile_row * tile_tokens), min(kept.row0 + kept.rows, (tile_row + 1) * tile_tokens))
        for tile_col in range(kept.col0 // tile_tokens, tiles_across):
            cols = range(max(kept.col0, tile_col * tile_tokens),
                         min(kept.col0 + kept.cols, (tile_col + 1) * tile_tokens))
            positions = [grid_positions[r - kept.row0][c - kept.col0] for r in rows for c in cols]
            u0 = tile_col * tile_size + (cols.start - tile_col * tile_tokens) * patch
            v0 = tile_row * tile_size + (rows.start - tile_row * tile_tokens) * patch
            region = canvas.region(u0, v0, u0 + len(cols) * patch, v0 + len(rows) * patch)
            blocks.append(VisualBlock(f"tile {tile_row},{tile_col}", positions, len(rows), len(cols), region))
    return blocks


class LlavaNextAdapter(LlavaAdapter, family="llava_next"):

    def packed_grid_shape(self, rows: int, cols: int, tile_tokens: int) -> tuple[int, int]:
        """Shape of the unpadded tile grid as packed into the sequence (LLaVA-NeXT keeps it as is)."""
        return rows, cols

    def visual_layout(self, encoding: Mapping[str, Any], image_size: tuple[int, int], processor: Any,
                      batch_index: int = 0) -> VisualLayout:
        width, height = image_size
        image_hw = tuple(int(v) for v in encoding["image_sizes"][batch_index])
        if image_hw != (height, width):
            raise ValueError(
                f"image_sizes row {batch_index} is {image_hw} (h, w) but image_size is {image_size} (w, h)"
            )
        tile_size, patch = int(self.config.vision_config.image_size), self.patch_size()
        tile_tokens = tile_size // patch
        self.check_tile_processing(encoding, processor, tile_size, batch_index)

        tiles_down, tiles_across = get_anyres_image_grid_shape(list(image_hw), self.config.image_grid_pinpoints,
                                                               tile_size)
        kept = kept_token_grid(tiles_down * tile_tokens, tiles_across * tile_tokens, image_hw)
        packed_rows, packed_cols = self.packed_grid_shape(kept.rows, kept.cols, tile_tokens)

        positions = self.image_positions(encoding, processor, batch_index)
        row_stride = packed_cols + 1  # one image_newline after each row
        grid_start = len(positions) - packed_rows * row_stride
        base = split_class_token(positions[:grid_start], tile_tokens * tile_tokens,
                                 self.config.vision_feature_select_strategy)
        row_starts = [grid_start + r * row_stride for r in range(packed_rows)]
        grid_rows = [positions[start:start + packed_cols] for start in row_starts]
        base_extent = tile_tokens * patch / tile_size  # share of the stretched base view the tokens cover
        blocks = [VisualBlock("base", base, tile_tokens, tile_tokens,
                              (0.0, 0.0, width * base_extent, height * base_extent))]
        canvas = tiled_canvas(image_hw, select_best_resolution(image_hw, self.config.image_grid_pinpoints))
        blocks += self.grid_blocks(grid_rows, kept, canvas, tile_size, tile_tokens, patch)
        return VisualLayout(image_size=image_size, visual_positions=tuple(positions), blocks=tuple(blocks))

    def grid_blocks(self, grid_rows: list[list[int]], kept: KeptGrid, canvas: TiledCanvas, tile_size: int,
                    tile_tokens: int, patch: int) -> list[VisualBlock]:
        """Blocks of the packed tile grid (``grid_rows``: its positions, row by row, newlines left out)."""
        return tile_blocks(grid_rows, kept, canvas, tile_size, tile_tokens, patch)

    def check_tile_processing(self, encoding: Mapping[str, Any], processor: Any, tile_size: int,
                              batch_index: int) -> None:
        """The layout assumes the processor's base view and tiles are T x T with no further resize or crop."""
        image_processor = processor.image_processor
        size, crop = image_processor.size, image_processor.crop_size
        base_hw = (size.height, size.width) if size.height and size.width else (size.shortest_edge,) * 2
        tile = crop.height if crop is not None and crop.height else size.height or size.shortest_edge
        pixel_hw = tuple(int(v) for v in encoding["pixel_values"][batch_index].shape[-2:])
        if base_hw != (tile_size, tile_size) or tile != tile_size or pixel_hw != (tile_size, tile_size):
            raise ValueError(
                f"{self.display_name} layout expects base view, tiles and pixel_values of the vision tower's "
                f"{tile_size}x{tile_size}; the processor gives base {base_hw}, tile {tile}, pixel_values {pixel_hw}"
            )
        if image_processor.image_grid_pinpoints != self.config.image_grid_pinpoints:
            raise ValueError("the processor's image_grid_pinpoints differ from the model config's")

    def box_frame(self, encoding: Mapping[str, Any] | None, image_size: tuple[int, int], batch_index: int = 0,
                  processor: Any = None) -> BoxFrame:
        """The whole original image (the model sees all of it); ``processor`` is not needed."""
        return BoxFrame(image_size=image_size, view_region=whole_image(image_size))

    def default_view_region(self, image_size: tuple[int, int]) -> Region:
        """The frame of a ``BoxFrame`` without ``view_region``: the whole image."""
        return whole_image(image_size)
