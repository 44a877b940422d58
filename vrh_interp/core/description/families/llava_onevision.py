"""LLaVA-OneVision (``LlavaOnevisionForConditionalGeneration``, e.g. ``llava-hf/llava-onevision-qwen2-7b-ov-hf``).

Facts (read in transformers 5.24: ``models/llava_onevision/modeling_llava_onevision.py``
(``LlavaOnevisionModel.pack_image_features``), ``models/llava_onevision/processing_llava_onevision.py``
(``_get_unpadded_features``), ``models/llava_onevision/image_processing_pil_llava_onevision.py``; checked by
the layout experiment in ``tests/families/test_families.py -k llava_onevision``):

* Language backbone: Qwen2, ``model.language_model.layers[i].self_attn.o_proj``; placeholder ``<image>``.
* Layout: LLaVA-NeXT's rule (base view first, best-resolution tiles, ``unpad_image`` on the token grid, one
  ``image_newline`` after each row; ``get_anyres_image_grid_shape`` and ``unpad_image`` are the same code
  as LLaVA-NeXT's), with SigLIP's CLS-free ``"full"`` strategy. Released checkpoints use SigLIP 384 / 14:
  27 tokens cover the first 378 of each tile's 384 pixels, so tiles leave 6-pixel gaps and the grid is laid
  out per tile (as ``llava_next`` does).
* Downsampling: when the unpadded grid (rows x cols) holds more than ``anyres_max_K`` tiles' worth of tokens
  (``ratio = sqrt(rows * cols / (K * g^2)) > 1.1``), it is resized with ``interpolate(mode="bilinear")``
  (``align_corners=False``, no antialiasing) to ``(int(rows // ratio), int(cols // ratio))`` before the
  newlines. Output row i reads source rows ``floor(s)`` and ``floor(s) + 1`` with
  ``s = max((i + 0.5) * rows / out_rows - 0.5, 0)`` (the second only with non-zero weight, clamped at the
  last row); columns likewise. A downsampled token therefore covers its source tokens' pixels, and the
  rectangles of neighbouring tokens overlap: each downsampled token is one 1 x 1 block per contiguous
  rectangle of source pixels (several when its sources straddle a tile gap), all with its position.
* Native grounding format: as LLaVA-NeXT (``[x1, y1, x2, y2]``, 0-1 floats relative to the whole image).
"""

from __future__ import annotations

import math

from vrh_interp.core.description.families.base import VisualBlock
from vrh_interp.core.description.families.llava_next import KeptGrid, LlavaNextAdapter, TiledCanvas


def bilinear_sources(index: int, source_size: int, target_size: int) -> list[int]:
    """Source indices with non-zero weight for output ``index`` of a bilinear resize (align_corners=False)."""
    source = max((index + 0.5) * source_size / target_size - 0.5, 0.0)
    low = int(source)
    high = min(low + 1, source_size - 1)
    return [low] if high == low or source - low < 1e-9 else [low, high]


def token_span(index: int, tile_size: int, tile_tokens: int, patch: int) -> tuple[int, int]:
    """Canvas pixels [start, end) of token ``index`` of a reassembled tile grid (tiles may leave gaps)."""
    start = (index // tile_tokens) * tile_size + (index % tile_tokens) * patch
    return start, start + patch


class LlavaOnevisionAdapter(LlavaNextAdapter, family="llava_onevision"):

    def packed_grid_shape(self, rows: int, cols: int, tile_tokens: int) -> tuple[int, int]:
        """``pack_image_features``: bilinear downsampling of grids above ``anyres_max_K`` tiles."""
        max_tiles = int(self.config.vision_aspect_ratio.removeprefix("anyres_max_"))
        ratio = math.sqrt(rows * cols / (max_tiles * tile_tokens**2))
        if ratio > 1.1:
            return int(rows // ratio), int(cols // ratio)
        return rows, cols

    def grid_blocks(self, grid_rows: list[list[int]], kept: KeptGrid, canvas: TiledCanvas, tile_size: int,
                    tile_tokens: int, patch: int) -> list[VisualBlock]:
        out_rows, out_cols = len(grid_rows), len(grid_rows[0]) if grid_rows else 0
        if (out_rows, out_cols) == (kept.rows, kept.cols) or not out_rows * out_cols:
            return super().grid_blocks(grid_rows, kept, canvas, tile_size, tile_tokens, patch)

        def source_spans(out_index: int, kept_start: int, kept_size: int, out_size: int) -> list[tuple[int, int]]:
            """Canvas pixel spans of the source tokens, adjacent ones merged (a tile gap splits them)."""
            spans: list[tuple[int, int]] = []
            for i in bilinear_sources(out_index, kept_size, out_size):
                start, end = token_span(kept_start + i, tile_size, tile_tokens, patch)
                if spans and spans[-1][1] == start:
                    spans[-1] = (spans[-1][0], end)
                else:
                    spans.append((start, end))
            return spans

        row_spans = [source_spans(r, kept.row0, kept.rows, out_rows) for r in range(out_rows)]
        col_spans = [source_spans(c, kept.col0, kept.cols, out_cols) for c in range(out_cols)]
        return [
            VisualBlock(f"downsampled {r},{c}", [grid_rows[r][c]], 1, 1, canvas.region(u0, v0, u1, v1))
            for r in range(out_rows)
            for c in range(out_cols)
            for v0, v1 in row_spans[r]
            for u0, u1 in col_spans[c]
        ]
