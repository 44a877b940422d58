"""One pass per batch collecting everything any scoring design needs.

For each sample the greedy answer is generated once (left-padded batch) with a ``RegionAttentionReadout``
active at every step, so the attention statistics of the answer-token rows are captured DURING the
generation that produces them: no second forward pass, no attention map kept. The readout is layer-stacked
(``stack_layers``): each step computes every layer's scores for the rows it needs and reduces them in one
pass over all layers and heads, inside the nnsight trace (so a remote run executes the same code). The prompt
forward also yields the input-token rows and the last prompt row's map for the spatial-entropy score. With
``output_source="teacher_forced"`` the ground-truth box in the family's native format is appended to the
prompt and one forward pass gives the rows predicting its tokens.

Per sample we keep ``[rows, layers, heads, 3]`` statistics (region mass, visual mass, argmax-in-region)
for output and input rows, plus ``[layers, heads]`` negative spatial entropies. Every design in
``design.py`` is a pure function of these, so the design-space search scores all variants from one pass.

The model runs through its backend (``vrh_interp.core.backends``): ``Backend.generate_region_stats`` (greedy) or
``Backend.region_stats`` (teacher-forced) returns those statistics; nnsight computes them inside the generation, a
backend that cannot generates first and reads the rows in one forward over prompt + answer
(``backends.base.generate_then_read``). This module slices them per sample and never asks which backend runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch

from vrh_interp.core.backends.base import Backend
from vrh_interp.core.backends.select import backend_for
from vrh_interp.core.boxes import Box, BoxParseFailure
from vrh_interp.core.families.base import VisualBlock, VisualLayout
from vrh_interp.core.model import VLM, GroundingBatch
from vrh_interp.data.checks import GroundingSampleLike, as_box
from vrh_interp.core.templates.ablation import HeadAblation


@dataclass
class SampleStats:
    sample_id: str
    output_rows: np.ndarray  # [n_out, L, H, 3]
    input_rows: np.ndarray  # [n_in, L, H, 3]
    neg_entropy: np.ndarray  # [L, H]
    region_tokens: int
    answer: str
    iou: float
    parsed: bool


def _region_and_visual_masks(batch: GroundingBatch,
                             boxes: Sequence[Box]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    b, s = batch.batch_size, batch.prompt_length
    region = np.zeros((b, s), dtype=bool)
    visual = np.zeros((b, s), dtype=bool)
    counts = []
    for i, (layout, box) in enumerate(zip(batch.layouts, boxes)):
        positions = layout.positions_for_box(box)
        counts.append(len(positions))
        region[i, positions] = True
        visual[i, layout.visual_positions] = True
    return torch.from_numpy(region), torch.from_numpy(visual), counts


def _input_rows(batch: GroundingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt text rows after the image (left-padded batch): indices [b, r] and validity [b, r]."""
    s = batch.prompt_length
    starts = [max(layout.visual_positions) + 1 for layout in batch.layouts]
    width = max(s - start for start in starts)
    index = torch.full((batch.batch_size, width), s - 1, dtype=torch.long)
    valid = torch.zeros(batch.batch_size, width, dtype=torch.bool)
    for i, start in enumerate(starts):
        count = s - start
        index[i, :count] = torch.arange(start, s)
        valid[i, :count] = True
    return index, valid


def grid_block(layout: VisualLayout) -> VisualBlock:
    """The block used for spatial maps: the one covering the whole image with the most tokens."""
    width, height = layout.image_size

    def covers(block: VisualBlock) -> bool:
        x0, y0, x1, y1 = block.region
        return x0 <= 0.5 and y0 <= 0.5 and x1 >= width - 0.5 and y1 >= height - 0.5

    candidates = [b for b in layout.blocks if covers(b)] or list(layout.blocks)
    return max(candidates, key=lambda b: b.rows * b.cols)


def negative_spatial_entropy(grid: np.ndarray) -> float:
    """-(entropy of connected-component sizes of relu(A - mean A) > 0), 8-connectivity (LocalizationHeads)."""
    mask = grid > grid.mean()
    rows, cols = mask.shape
    seen = np.zeros_like(mask)
    sizes = []
    for r in range(rows):
        for c in range(cols):
            if mask[r, c] and not seen[r, c]:
                stack, size = [(r, c)], 0
                seen[r, c] = True
                while stack:
                    y, x = stack.pop()
                    size += 1
                    for dy in (-1, 0, 1):
                        for dx in (-1, 0, 1):
                            ny, nx = y + dy, x + dx
                            if 0 <= ny < rows and 0 <= nx < cols and mask[ny, nx] and not seen[ny, nx]:
                                seen[ny, nx] = True
                                stack.append((ny, nx))
                sizes.append(size)
    if not sizes:
        return float("-inf")
    p = np.asarray(sizes, dtype=np.float64) / sum(sizes)
    return float((p * np.log(p)).sum())


def negative_spatial_entropies(grids: np.ndarray) -> np.ndarray:
    """``negative_spatial_entropy`` of every ``[rows, cols]`` grid of ``grids`` ``[..., rows, cols]`` at once.

    Bit-identical to the per-grid loop, vectorised over all grids: the above-mean cells are cut into horizontal
    runs, runs touching across adjacent rows (8-connectivity) are joined by parallel hooking and pointer jumping
    (each component ends labelled by its first run in raster order, so components come in the order the loop
    finds them), and the component sizes of each grid enter the same float64 expression as in the loop.
    """
    grids = np.asarray(grids)
    lead, (rows, cols) = grids.shape[:-2], grids.shape[-2:]
    count = int(np.prod(lead, dtype=np.int64))
    out = np.full(count, float("-inf"))
    if count == 0 or rows * cols == 0:
        return out.reshape(lead)
    flat = np.ascontiguousarray(grids.reshape(count, rows * cols))
    mask = (flat > flat.mean(axis=1)[:, None]).reshape(count, rows, cols)
    starts = mask.copy()
    starts[:, :, 1:] &= ~mask[:, :, :-1]  # a run starts where the cell to the left is not above the mean
    run_of = np.cumsum(starts.reshape(-1)).reshape(count, rows, cols) - 1  # run index of each masked cell
    first_cell = np.flatnonzero(starts.reshape(-1))  # raster order: runs are numbered in raster order
    parent = np.arange(len(first_cell))
    pairs = []  # runs touching across rows r, r + 1 (columns c and c + d)
    for d in (-1, 0, 1):
        top = mask[:, :-1, max(0, -d): cols - max(0, d)]
        bottom = mask[:, 1:, max(0, d): cols - max(0, -d)]
        both = top & bottom
        pairs.append((run_of[:, :-1, max(0, -d): cols - max(0, d)][both],
                      run_of[:, 1:, max(0, d): cols - max(0, -d)][both]))
    left = np.concatenate([p[0] for p in pairs])
    right = np.concatenate([p[1] for p in pairs])
    while True:
        a, b = parent[left], parent[right]
        differ = a != b
        if not differ.any():
            break
        low, high = np.minimum(a[differ], b[differ]), np.maximum(a[differ], b[differ])
        np.minimum.at(parent, high, low)  # hook the larger label under the smaller
        while True:  # pointer jumping until every run points at its root
            jumped = parent[parent]
            if np.array_equal(jumped, parent):
                break
            parent = jumped
        left, right = left[differ], right[differ]
    run_cells = np.bincount(run_of[mask], minlength=len(first_cell))
    roots = np.flatnonzero(parent == np.arange(len(first_cell)))  # ascending: components in raster order
    sizes = np.bincount(parent, weights=run_cells, minlength=len(first_cell))[roots]  # exact integers
    grid_of = first_cell[roots] // (rows * cols)
    found = np.bincount(grid_of, minlength=count)  # components per grid
    offsets = np.concatenate([[0], np.cumsum(found)])
    for n in np.unique(found[found > 0]):  # grids with n components: one [grids, n] array, rows summed alike
        which = np.flatnonzero(found == n)
        part = sizes[offsets[which][:, None] + np.arange(n)]
        p = part / part.sum(axis=1, keepdims=True)
        out[which] = (p * np.log(p)).sum(axis=1)
    return out.reshape(lead)


def _entropies(last_rows: torch.Tensor, layouts: Sequence[VisualLayout]) -> list[np.ndarray]:
    """last_rows [L, b, H, keys] -> per sample [L, H] negative spatial entropies (samples whose grids have one
    shape in one gather and one vectorised call)."""
    by_shape: dict[tuple[int, int], list[tuple[int, tuple[int, ...]]]] = {}
    for i, layout in enumerate(layouts):
        block = grid_block(layout)
        by_shape.setdefault((block.rows, block.cols), []).append((i, block.positions))
    out: list[np.ndarray] = [np.empty(0)] * len(layouts)
    for (rows, cols), items in by_shape.items():
        which = torch.tensor([i for i, _ in items])
        positions = torch.tensor([list(pos) for _, pos in items])  # [n, rows * cols]
        chosen = last_rows[:, which]  # [L, n, H, keys]
        index = positions[None, :, None, :].expand(chosen.shape[0], -1, chosen.shape[2], -1)
        maps = torch.gather(chosen, 3, index).permute(1, 0, 2, 3)  # [n, L, H, rows * cols]
        grids = maps.reshape(*maps.shape[:3], rows, cols).numpy()
        for (i, _), value in zip(items, negative_spatial_entropies(grids)):
            out[i] = value
    return out


def collect_batch(vlm: VLM, samples: Sequence[GroundingSampleLike], *, max_new_tokens: int,
                  output_source: str = "greedy", ablation: HeadAblation | None = None,
                  batch: GroundingBatch | None = None) -> list[SampleStats]:
    """The statistics of one batch from ONE run of the model (a generation, or a forward when teacher-forced).

    On a remote handle (NDIF, nnsight only; ``vlm.on(remote=...)``) the whole batch is one request, and only the
    reduced per-row statistics (not attention maps) come back. ``batch``: the samples already encoded
    (``vlm.encode_grounding`` of their images and expressions, in order), else they are encoded here. The model
    runs on the handle's backend (module doc). ``ablation``: an nnsight template run during the generation.
    """
    return batch_stats(backend_for(vlm), samples, max_new_tokens=max_new_tokens,
                       output_source=output_source, ablation=ablation, batch=batch)


def batch_stats(runner: Backend, samples: Sequence[GroundingSampleLike], *, max_new_tokens: int,
                output_source: str = "greedy", ablation: HeadAblation | None = None,
                batch: GroundingBatch | None = None) -> list[SampleStats]:
    """``collect_batch`` on a backend already built (the pipelines resolve theirs once and pass it down)."""
    vlm = runner.vlm
    boxes = [as_box(s.box) for s in samples]
    if batch is None:
        batch = vlm.encode_grounding([s.image for s in samples], [s.expression for s in samples])
    elif batch.batch_size != len(samples):
        raise ValueError(f"batch holds {batch.batch_size} rows for {len(samples)} samples")
    if output_source == "teacher_forced":
        return _collect_teacher_forced(runner, samples, boxes, batch)
    region, visual, counts = _region_and_visual_masks(batch, boxes)
    in_index, in_valid = _input_rows(batch)
    read = runner.generate_region_stats(batch.encoding, in_index, region, visual, max_new_tokens=max_new_tokens,
                                        templates=[ablation] if ablation is not None else [])
    answers = vlm.decode_answers(read.ids, batch.prompt_length)
    lengths = vlm.answer_lengths(read.ids, batch.prompt_length)
    entropies = _entropies(read.last_row, batch.layouts)
    stats = []
    for i, sample in enumerate(samples):
        output_rows = read.output_rows[:, i, :, : lengths[i]].permute(2, 0, 1, 3)
        input_rows = read.input_rows[:, i][:, :, in_valid[i]].permute(2, 0, 1, 3)
        stats.append(_sample_stats(vlm, sample, boxes[i], batch, i, answers[i], output_rows, input_rows,
                                   entropies[i], counts[i]))
    return stats


def _rows_array(rows: torch.Tensor) -> np.ndarray:
    """float32, C-contiguous: the layout a run folder stores, so in-memory and reloaded statistics aggregate
    to the same bits (numpy's summation order follows the memory layout)."""
    return np.ascontiguousarray(rows.float().numpy())


def _sample_stats(vlm: VLM, sample: GroundingSampleLike, box: Box, batch: GroundingBatch, index: int, answer: str,
                  output_rows: torch.Tensor, input_rows: torch.Tensor, neg_entropy: np.ndarray,
                  region_tokens: int) -> SampleStats:
    parsed = vlm.adapter.parse_box(answer, batch.frames[index])
    ok = not isinstance(parsed, BoxParseFailure)
    return SampleStats(
        sample_id=sample.sample_id,
        output_rows=_rows_array(output_rows),
        input_rows=_rows_array(input_rows),
        neg_entropy=neg_entropy,
        region_tokens=region_tokens,
        answer=answer,
        iou=parsed.iou(box) if ok else 0.0,
        parsed=ok,
    )


def _collect_teacher_forced(runner: Backend, samples: Sequence[GroundingSampleLike], boxes: Sequence[Box],
                            batch: GroundingBatch) -> list[SampleStats]:
    vlm = runner.vlm
    answers = [vlm.adapter.format_box(box, frame) for box, frame in zip(boxes, batch.frames)]
    answer_ids = [vlm.tokenizer(a, add_special_tokens=False)["input_ids"] for a in answers]
    width = max(len(a) for a in answer_ids)
    # shorter answers are right-padded (masked) after the shared prompt end; their extra rows are ignored
    enc = vlm.teacher_forced(batch, answer_ids)
    b, s = batch.batch_size, batch.prompt_length
    region, visual, counts = _region_and_visual_masks(batch, boxes)
    region = torch.cat([region, torch.zeros(b, width, dtype=torch.bool)], dim=1)
    visual = torch.cat([visual, torch.zeros(b, width, dtype=torch.bool)], dim=1)
    in_index, in_valid = _input_rows(batch)
    out_index = torch.arange(s - 1, s - 1 + width).unsqueeze(0).expand(b, -1)
    rows = torch.cat([in_index, out_index], dim=1)
    stats_all = runner.region_stats(enc, rows, region, visual)  # [L, b, H, r, 3]
    r_in = in_index.shape[1]
    stats = []
    for i, sample in enumerate(samples):
        n_out = len(answer_ids[i])
        output_rows = stats_all[:, i, :, r_in: r_in + n_out].permute(2, 0, 1, 3)
        input_rows = stats_all[:, i, :, :r_in][:, :, in_valid[i]].permute(2, 0, 1, 3)
        nan_entropy = np.full(output_rows.shape[1:3], np.nan)
        stats.append(SampleStats(sample.sample_id, _rows_array(output_rows), _rows_array(input_rows),
                                 nan_entropy, counts[i], answers[i], 1.0, True))
    return stats


def collect_stats(vlm: VLM, samples: Sequence[GroundingSampleLike], *, batch_size: int = 8, max_new_tokens: int = 24,
                  output_source: str = "greedy") -> Iterator[list[SampleStats]]:
    """Yield the statistics batch by batch (callers persist them as they come); one model run per batch."""
    runner = backend_for(vlm)
    for start in range(0, len(samples), batch_size):
        yield batch_stats(runner, samples[start: start + batch_size], max_new_tokens=max_new_tokens,
                          output_source=output_source)
