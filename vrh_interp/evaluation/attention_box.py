"""Attention boxes: a head set's attention over the image, read from query ROWS, turned into a box.

Localization Heads (Kang et al., CVPR 2025; seilk/LocalizationHeads) locate a referent without training: a few
heads' attention from the last input token over the image tokens, Gaussian-smoothed, summed over the heads,
binarised at its mean, and the rectangle enclosing the result is the box. Here the same recipe runs on any
family's visual layout, not only a square grid:

1. **Rows.** ``query="last_input"``: the last prompt row (the row that predicts the first answer token; the
   paper's); ``query="output"``: the mean over the rows that predicted each answer token of the model's own greedy
   answer (teacher-forced in one forward, as in scoring). Only those rows are computed (``Backend.attention_rows``,
   reduced per layer to the chosen heads' sum over prompt keys): no full attention map is materialised.
2. **Canvas.** Each visual token covers a rectangle of the original image (``VisualLayout``; tiles, thumbnails,
   non-square grids, padding). The canvas is the rectangle enclosing the blocks read (``blocks="all"``: every
   block, e.g. LLaVA-NeXT's base view and its tiles; ``blocks="grid"``: the layout's whole-image block,
   ``VisualLayout.grid_block``, the one the spatial-entropy score reads), cut into equal cells no coarser than
   the finest token pitch among them. A token's attention is spread over the canvas cells its rectangle overlaps,
   in proportion to the overlap (attention as a density over pixels), so blocks of different pitch add up; on a
   single-block layout the canvas IS the token grid (rows x cols, square or not) and nothing is spread.
3. **Box.** ``sigma`` (canvas cells): Gaussian smoothing (truncated at 4 sigma, borders mirrored: scipy's
   ``gaussian_filter`` defaults; 0 = none); ``threshold``: cells strictly above the map's ``"mean"``
   (LocalizationHeads) or above its quantile ``q`` (a float in (0, 1)); ``component``: the cells kept are the
   ``"largest"`` 8-connected component (ties: more attention, then first in raster order), the component holding
   the ``"peak"`` cell, or ``"full"``: every cell above the threshold. The box is the rectangle enclosing the kept
   cells, clipped to the image, in original-image pixels (``Box``). A constant map has nothing above its threshold:
   no box (scored as a miss).

The heads' maps are summed before smoothing (smoothing is linear, so this equals summing smoothed maps, as
LocalizationHeads do).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np
import torch

from vrh_interp.core.execution.backends.select import backend_for
from vrh_interp.core.description.boxes import Box, InvalidBoxError
from vrh_interp.core.description.families.base import VisualBlock, VisualLayout
from vrh_interp.core.description.heads import HeadsLike
from vrh_interp.core.description.model import VLM, GroundingBatch

QUERIES: tuple[str, ...] = ("last_input", "output")
COMPONENTS: tuple[str, ...] = ("largest", "peak", "full")
BLOCK_CHOICES: tuple[str, ...] = ("all", "grid")
TRUNCATE = 4.0  # Gaussian kernel radius in sigmas (scipy.ndimage.gaussian_filter's default)


def parse_threshold(value: Any) -> str | float:
    """``"mean"`` or a quantile in (0, 1) (a float, or its text); ValueError otherwise."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "mean":
            return "mean"
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"threshold {value[:40]!r} is neither 'mean' nor a quantile in (0, 1), e.g. 0.9") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) < 1.0:
        raise ValueError(f"threshold {value!r} is neither 'mean' nor a quantile strictly between 0 and 1, e.g. 0.9")
    return float(value)


@dataclass(frozen=True)
class BoxReadout:
    """How attention becomes a box (module doc): query rows, layout blocks, smoothing, threshold, component."""

    sigma: float = 1.0
    threshold: str | float = "mean"
    component: str = "largest"
    blocks: str = "all"
    query: str = "last_input"

    def __post_init__(self) -> None:
        if isinstance(self.sigma, bool) or not isinstance(self.sigma, (int, float)) or not (
                math.isfinite(self.sigma) and 0 <= self.sigma <= 100):
            raise ValueError(f"sigma={self.sigma!r}: a smoothing width in canvas cells, between 0 (none) and 100")
        object.__setattr__(self, "threshold", parse_threshold(self.threshold))
        for value, allowed, name in ((self.component, COMPONENTS, "component"), (self.blocks, BLOCK_CHOICES, "blocks"),
                                     (self.query, QUERIES, "query")):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not one of {', '.join(allowed)}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------ the canvas: attention painted on the image
@dataclass(frozen=True)
class Canvas:
    """A ``rows`` x ``cols`` grid of equal cells spanning ``region`` (original-image pixels, may reach past the image
    where the processor pads)."""

    region: tuple[float, float, float, float]
    rows: int
    cols: int

    def cell_rect(self, row: int, col: int) -> tuple[float, float, float, float]:
        x0, y0, x1, y1 = self.region
        cw, ch = (x1 - x0) / self.cols, (y1 - y0) / self.rows
        return (x0 + col * cw, y0 + row * ch, x0 + (col + 1) * cw, y0 + (row + 1) * ch)

    def cells_box(self, mask: np.ndarray, image_size: tuple[int, int]) -> Box | None:
        """The rectangle enclosing the True cells of ``mask``, clipped to the image; None when nothing is left."""
        rows, cols = np.nonzero(mask)
        if rows.size == 0:
            return None
        x0, y0, _, _ = self.cell_rect(int(rows.min()), int(cols.min()))
        _, _, x1, y1 = self.cell_rect(int(rows.max()), int(cols.max()))
        width, height = image_size
        try:
            return Box(max(x0, 0.0), max(y0, 0.0), min(x1, float(width)), min(y1, float(height)))
        except InvalidBoxError:  # the kept cells lie in the padding outside the image
            return None


def _spans(start: float, end: float, count: int) -> np.ndarray:
    edges = start + (end - start) * np.arange(count + 1) / count
    return np.stack([edges[:-1], edges[1:]], axis=1)


def _spread(canvas_spans: np.ndarray, block_spans: np.ndarray) -> np.ndarray:
    """``[canvas cells, block cells]``: the share of each block cell's extent (one axis) inside each canvas cell."""
    low = np.maximum(canvas_spans[:, None, 0], block_spans[None, :, 0])
    high = np.minimum(canvas_spans[:, None, 1], block_spans[None, :, 1])
    return np.clip(high - low, 0.0, None) / (block_spans[None, :, 1] - block_spans[None, :, 0])


def canvas_for(blocks: Sequence[VisualBlock]) -> Canvas:
    """The canvas of ``blocks``: the rectangle enclosing their regions, cut into equal cells no coarser than the
    finest token pitch among them (per axis); a single block's canvas is its own token grid."""
    def pitch(block: VisualBlock) -> tuple[float, float]:
        x0, y0, x1, y1 = block.region
        return (y1 - y0) / block.rows, (x1 - x0) / block.cols

    x0 = min(b.region[0] for b in blocks)
    y0 = min(b.region[1] for b in blocks)
    x1 = max(b.region[2] for b in blocks)
    y1 = max(b.region[3] for b in blocks)
    rows = max(1, math.ceil((y1 - y0) / min(pitch(b)[0] for b in blocks) - 1e-6))
    cols = max(1, math.ceil((x1 - x0) / min(pitch(b)[1] for b in blocks) - 1e-6))
    return Canvas((float(x0), float(y0), float(x1), float(y1)), rows, cols)


def paint(layout: VisualLayout, weights: np.ndarray, blocks: str = "all") -> tuple[Canvas, np.ndarray]:
    """``weights`` over the prompt positions (``[prompt]``) painted on the canvas of the layout's blocks (module
    doc, step 2): ``(canvas, grid [rows, cols])``; every block's tokens add their weight, spread by area over the
    cells their rectangles overlap."""
    if blocks not in BLOCK_CHOICES:
        raise ValueError(f"blocks={blocks!r} is not one of {', '.join(BLOCK_CHOICES)}")
    chosen = list(layout.blocks) if blocks == "all" else [layout.grid_block()]
    canvas = canvas_for(chosen)
    cx0, cy0, cx1, cy1 = canvas.region
    canvas_x, canvas_y = _spans(cx0, cx1, canvas.cols), _spans(cy0, cy1, canvas.rows)
    grid = np.zeros((canvas.rows, canvas.cols), dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    for block in chosen:
        x0, y0, x1, y1 = block.region
        values = weights[list(block.positions)].reshape(block.rows, block.cols)
        grid += _spread(canvas_y, _spans(y0, y1, block.rows)) @ values @ _spread(canvas_x, _spans(x0, x1, block.cols)).T
    return canvas, grid


# ------------------------------------------------------------------ smoothing, threshold, components
def gaussian_kernel(sigma: float) -> np.ndarray:
    """The normalised 1-D Gaussian of ``sigma`` cells, radius ``int(4 sigma + 0.5)`` (scipy's)."""
    radius = int(TRUNCATE * sigma + 0.5)
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    kernel = np.exp(-0.5 * (x / sigma) ** 2)
    return kernel / kernel.sum()


def gaussian_smooth(grid: np.ndarray, sigma: float) -> np.ndarray:
    """``grid`` smoothed by a separable Gaussian of ``sigma`` cells, borders mirrored (``d c b a | a b c d``:
    scipy.ndimage's ``reflect``); ``sigma=0`` returns a copy."""
    grid = np.asarray(grid, dtype=np.float64)
    if sigma == 0:
        return grid.copy()
    kernel = gaussian_kernel(sigma)
    radius = len(kernel) // 2
    out = grid
    for axis in (0, 1):
        pad = [(0, 0), (0, 0)]
        pad[axis] = (radius, radius)
        padded = np.pad(out, pad, mode="symmetric")
        n = out.shape[axis]
        out = sum(w * np.take(padded, np.arange(i, i + n), axis=axis) for i, w in enumerate(kernel))
    return np.asarray(out, dtype=np.float64)


def components_8(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """8-connected components of ``mask``: ``(labels, count)``, labels 1..count in raster order of their first
    cell, 0 outside the mask."""
    mask = np.asarray(mask, dtype=bool)
    labels = np.zeros(mask.shape, dtype=np.int64)
    rows, cols = mask.shape
    count = 0
    for r, c in zip(*np.nonzero(mask)):
        if labels[r, c]:
            continue
        count += 1
        labels[r, c] = count
        stack = [(int(r), int(c))]
        while stack:
            y, x = stack.pop()
            for ny in range(max(0, y - 1), min(rows, y + 2)):
                for nx in range(max(0, x - 1), min(cols, x + 2)):
                    if mask[ny, nx] and not labels[ny, nx]:
                        labels[ny, nx] = count
                        stack.append((ny, nx))
    return labels, count


def binarise(smoothed: np.ndarray, threshold: str | float) -> np.ndarray:
    """Cells strictly above the map's mean (``"mean"``) or its ``threshold`` quantile."""
    cut = smoothed.mean() if threshold == "mean" else np.quantile(smoothed, float(threshold))
    return smoothed > cut


def kept_cells(smoothed: np.ndarray, threshold: str | float, component: str) -> tuple[np.ndarray, int]:
    """``(kept mask, components above the threshold)`` of a smoothed map (module doc, step 3)."""
    mask = binarise(smoothed, threshold)
    labels, count = components_8(mask)
    if component == "full" or count == 0:
        return mask, count
    if component == "peak":
        peak = np.unravel_index(int(np.argmax(smoothed)), smoothed.shape)
        return labels == labels[peak], count
    if component != "largest":
        raise ValueError(f"component={component!r} is not one of {', '.join(COMPONENTS)}")
    sizes = np.bincount(labels.ravel(), minlength=count + 1)[1:]
    masses = np.bincount(labels.ravel(), weights=smoothed.ravel(), minlength=count + 1)[1:]
    best = max(range(count), key=lambda i: (sizes[i], masses[i], -i))
    return labels == best + 1, count


@dataclass(frozen=True)
class AttentionBox:
    """One sample's attention box: ``box`` (original pixels, None when nothing is above the threshold), the painted
    ``grid`` and its ``canvas``, the ``kept`` cells and how many ``components`` were above the threshold."""

    box: Box | None
    grid: np.ndarray
    canvas: Canvas
    kept: np.ndarray
    components: int

    def iou(self, truth: Box) -> float:
        return 0.0 if self.box is None else self.box.iou(truth)


def box_from_grid(grid: np.ndarray, canvas: Canvas, image_size: tuple[int, int],
                  readout: BoxReadout = BoxReadout()) -> AttentionBox:
    """The attention box of a painted map (smoothing, threshold, component, enclosing rectangle)."""
    smoothed = gaussian_smooth(grid, readout.sigma)
    kept, count = kept_cells(smoothed, readout.threshold, readout.component)
    return AttentionBox(canvas.cells_box(kept, image_size), np.asarray(grid), canvas, kept, count)


def box_from_weights(layout: VisualLayout, weights: np.ndarray, readout: BoxReadout = BoxReadout()) -> AttentionBox:
    """The attention box of ``weights`` over one sample's prompt positions (its ``layout``)."""
    canvas, grid = paint(layout, weights, readout.blocks)
    return box_from_grid(grid, canvas, layout.image_size, readout)


# ------------------------------------------------------------------ the readout from the model
def _answer_rows(vlm: VLM, batch: GroundingBatch, answer_ids: Sequence[Sequence[int]]) -> tuple[Any, torch.Tensor,
                                                                                                   torch.Tensor]:
    """The teacher-forced encoding of the answers, the query rows ``[b, r]`` that predicted each answer token and
    their validity ``[b, r]`` (an empty answer keeps its one row, the last prompt row)."""
    s = batch.prompt_length
    lengths = [max(1, len(a)) for a in answer_ids]
    width = max(lengths)
    encoding = vlm.teacher_forced(batch, [list(a) for a in answer_ids])
    rows = (s - 1 + torch.arange(width))[None].expand(batch.batch_size, -1).clone()
    valid = torch.arange(width)[None] < torch.tensor(lengths)[:, None]
    return encoding, torch.where(valid, rows, torch.full_like(rows, s - 1)), valid


def head_attention(vlm: VLM, batch: GroundingBatch, heads: HeadsLike, *, query: str = "last_input",
                   answer_ids: Sequence[Sequence[int]] | None = None) -> np.ndarray:
    """``[batch, prompt]``: the attention of ``heads`` (summed over the heads) from the query rows to every prompt
    position: the last prompt row (``last_input``), or the mean over the rows predicting each token of
    ``answer_ids`` (``output``, the answers without EOS). Reads the rows only, through the handle's backend, at the
    heads' layers (each layer's value reduced to ``[batch, prompt]`` as it comes)."""
    head_set = vlm.geometry.validate(heads, "heads")
    if not len(head_set):
        raise ValueError("an attention box needs at least one head")
    if query not in QUERIES:
        raise ValueError(f"query={query!r} is not one of {', '.join(QUERIES)}")
    s, b = batch.prompt_length, batch.batch_size
    if query == "last_input":
        encoding, rows, valid = batch.encoding, torch.full((b, 1), s - 1), torch.ones(b, 1, dtype=torch.bool)
    else:
        if answer_ids is None or len(answer_ids) != b:
            raise ValueError("query='output' reads the rows of the model's answer: pass answer_ids, one per row")
        encoding, rows, valid = _answer_rows(vlm, batch, answer_ids)
    by_layer = head_set.by_layer()
    weight = valid.float() / valid.sum(1, keepdim=True)  # the mean over each sample's valid rows

    def reduce(layer: int, probs: torch.Tensor) -> torch.Tensor:  # [b, H, r, k] -> [b, s]
        chosen = probs[:, list(by_layer[layer])].float().sum(1)[..., :s]
        return (chosen * weight.to(chosen.device)[..., None]).sum(1).cpu()

    values = backend_for(vlm).attention_rows(encoding, rows, layers=sorted(by_layer), reduce=reduce)
    return torch.stack([values[layer] for layer in sorted(values)]).sum(0).double().numpy()


def attention_boxes(vlm: VLM, batch: GroundingBatch, heads: HeadsLike, readout: BoxReadout = BoxReadout(), *,
                    answer_ids: Sequence[Sequence[int]] | None = None) -> list[AttentionBox]:
    """The attention box of ``heads`` for every row of ``batch`` (module doc), in original-image pixels."""
    weights = head_attention(vlm, batch, heads, query=readout.query, answer_ids=answer_ids)
    return [box_from_weights(layout, w, readout) for layout, w in zip(batch.layouts, weights)]
