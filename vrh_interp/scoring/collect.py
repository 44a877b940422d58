"""One pass per batch collecting everything any scoring design needs.

For each sample the greedy answer is generated once (left-padded batch) with a ``RegionAttentionReadout``
active at every step, so the attention statistics of the answer-token rows are captured DURING the
generation that produces them: no second forward pass, no attention map kept. The readout is layer-stacked
(``stack_layers``): each step computes every layer's scores for the rows it needs and reduces them in one
pass over all layers and heads, inside the nnsight trace (so a remote run executes the same code). The prompt
forward also yields the input-token rows and the last prompt row's map for the spatial-entropy score. With
``output_source="teacher_forced"`` the ground-truth box in the family's native format is appended to the
prompt and one forward pass gives the rows predicting its tokens.

Per sample we keep ``[rows, layers, heads, 4]`` statistics (region mass, visual mass, argmax-in-region, argmax over
the prompt keys but the last in the region) for output and input rows and for the row of the last answer token,
``[layers, heads]`` negative spatial entropies (cell-count and the released LocalizationHeads' mass-weighted one)
and image-attention sums of the last prompt row, which answer tokens occur in the gold answer, and the answer's
graded correctness (OCR Heads). Every design in
``design.py`` is a pure function of these, so the design-space search scores all variants from one pass.

The model runs through its backend (``vrh_interp.core.execution.backends``): ``Backend.generate_region_stats`` (greedy)
or ``Backend.region_stats`` (teacher-forced) returns those statistics; nnsight computes them inside the generation, a
backend that cannot generates first and reads the rows in one forward over prompt + answer
(``backends.base.generate_then_read``). This module slices them per sample and never asks which backend runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch

from vrh_interp.core.execution.backends.base import Backend
from vrh_interp.core.execution.backends.select import backend_for
from vrh_interp.core.description.boxes import Box, BoxParseFailure
from vrh_interp.core.description.families.base import VisualLayout
from vrh_interp.core.description.model import VLM, GroundingBatch
from vrh_interp.data.checks import GroundingSampleLike, as_box
from vrh_interp.core.execution.templates.ablation import HeadAblation


@dataclass
class SampleStats:
    sample_id: str
    output_rows: np.ndarray  # [n_out, L, H, 4] (3 in statistics stored before the prompt-key argmax)
    input_rows: np.ndarray  # [n_in, L, H, 4]
    neg_entropy: np.ndarray  # [L, H]
    region_tokens: int
    answer: str
    iou: float
    parsed: bool
    # added with the released-code presets (None in statistics stored before them: those presets then refuse)
    neg_entropy_mass: np.ndarray | None = None  # [L, H] minus the released LocalizationHeads spatial entropy
    image_mass: np.ndarray | None = None  # [L, H] the last prompt row's attention sum over the image grid
    next_row: np.ndarray | None = None  # [0 or 1, L, H, 4] the row OF the last answer token (it predicts the end)
    gold_tokens: np.ndarray | None = None  # [n_out] bool: the answer token's id occurs in the gold answer's ids
    grade: float | None = None  # longest common run of gold ids in the sequence's ids / gold length (OCR Heads)


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

    Bit-identical to the per-grid loop, vectorised over all grids (``_components``: each component ends labelled
    by its first run in raster order, so components come in the order the loop finds them), and the component
    sizes of each grid enter the same float64 expression as in the loop.
    """
    grids = np.asarray(grids)
    lead, (rows, cols) = grids.shape[:-2], grids.shape[-2:]
    count = int(np.prod(lead, dtype=np.int64))
    out = np.full(count, float("-inf"))
    if count == 0 or rows * cols == 0:
        return out.reshape(lead)
    flat = np.ascontiguousarray(grids.reshape(count, rows * cols))
    mask = (flat > flat.mean(axis=1)[:, None]).reshape(count, rows, cols)
    parts = _components(mask)
    run_cells = np.bincount(parts.run_of[mask], minlength=parts.runs)
    sizes = np.bincount(parts.parent, weights=run_cells, minlength=parts.runs)[parts.roots]  # exact integers
    for which, part in _per_grid(parts, sizes, count):
        p = part / part.sum(axis=1, keepdims=True)
        out[which] = (p * np.log(p)).sum(axis=1)
    return out.reshape(lead)


RELEASED_THRESHOLD = 0.001
"""seilk/LocalizationHeads ``spatial_entropy(threshold=0.001)``: cells of relu(A - mean A) above it form components."""


def released_negative_spatial_entropies(grids: np.ndarray, threshold: float = RELEASED_THRESHOLD) -> np.ndarray:
    """Minus the spatial entropy of every ``[rows, cols]`` grid of ``grids`` ``[..., rows, cols]`` as the released
    code computes it (seilk/LocalizationHeads, ``localization_heads_finder.py``, ``spatial_entropy``):
    ``B = relu(A - mean A)``; 8-connected components of ``B > threshold``; each component weighted by its MASS of
    ``B`` over the total mass of ``B`` (cells at or below the threshold count in the total but in no component, so
    the weights may sum to less than 1); entropy ``-sum p log p`` over components of positive mass, 0 when no cell
    clears the threshold (a head with a faint bump is "perfectly localised"), and ``inf`` (score ``-inf``) when
    ``B`` has no mass at all (a flat map)."""
    grids = np.asarray(grids, dtype=np.float64)
    lead, (rows, cols) = grids.shape[:-2], grids.shape[-2:]
    count = int(np.prod(lead, dtype=np.int64))
    out = np.zeros(count)
    if count == 0 or rows * cols == 0:
        return np.full(lead, float("-inf"))
    flat = grids.reshape(count, rows * cols)
    relu = np.maximum(flat - flat.mean(axis=1)[:, None], 0.0)
    total = relu.sum(axis=1)
    mask = (relu > threshold).reshape(count, rows, cols)
    parts = _components(mask)
    run_mass = np.bincount(parts.run_of[mask], weights=relu.reshape(count, rows, cols)[mask], minlength=parts.runs)
    mass = np.bincount(parts.parent, weights=run_mass, minlength=parts.runs)[parts.roots]
    for which, part in _per_grid(parts, mass, count):
        p = part / total[which][:, None]
        out[which] = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(axis=1)
    out[total <= 0] = float("-inf")
    return out.reshape(lead)


@dataclass
class _Components:
    run_of: np.ndarray  # [count, rows, cols] run index of each masked cell
    parent: np.ndarray  # [runs] the root run of each run's component
    roots: np.ndarray  # root runs, ascending (components in raster order)
    grid_of: np.ndarray  # [components] the grid each component lies in
    runs: int


def _components(mask: np.ndarray) -> _Components:
    """8-connected components of every ``[rows, cols]`` mask of ``mask`` ``[count, rows, cols]`` at once: the masked
    cells are cut into horizontal runs, runs touching across adjacent rows are joined by parallel hooking and
    pointer jumping, and each component ends labelled by its first run in raster order."""
    count, rows, cols = mask.shape
    starts = mask.copy()
    starts[:, :, 1:] &= ~mask[:, :, :-1]  # a run starts where the cell to the left is not masked
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
    roots = np.flatnonzero(parent == np.arange(len(first_cell)))  # ascending: components in raster order
    return _Components(run_of, parent, roots, first_cell[roots] // (rows * cols), len(first_cell))


def _per_grid(parts: _Components, values: np.ndarray, count: int):
    """``(grid indices, [grids, n] values)`` for the grids with n components, for each n present."""
    found = np.bincount(parts.grid_of, minlength=count)  # components per grid
    offsets = np.concatenate([[0], np.cumsum(found)])
    for n in np.unique(found[found > 0]):  # grids with n components: one [grids, n] array, rows summed alike
        which = np.flatnonzero(found == n)
        yield which, values[offsets[which][:, None] + np.arange(n)]


@dataclass
class GridScores:
    """Per sample ``[L, H]`` values of the last prompt row's attention over the image grid
    (``VisualLayout.grid_block``)."""

    neg_entropy: np.ndarray  # minus the cell-count spatial entropy (``negative_spatial_entropies``)
    neg_entropy_mass: np.ndarray  # minus the released code's mass-weighted one (``released_negative_...``)
    image_mass: np.ndarray  # the attention sum over the grid (LocalizationHeads' criterion 1, the elbow)


def _entropies(last_rows: torch.Tensor, layouts: Sequence[VisualLayout]) -> list[GridScores]:
    """last_rows [L, b, H, keys] -> per sample the ``GridScores`` (samples whose grids have one shape in one
    gather and one vectorised call)."""
    by_shape: dict[tuple[int, int], list[tuple[int, tuple[int, ...]]]] = {}
    for i, layout in enumerate(layouts):
        block = layout.grid_block()
        by_shape.setdefault((block.rows, block.cols), []).append((i, block.positions))
    out: list[GridScores] = [GridScores(np.empty(0), np.empty(0), np.empty(0))] * len(layouts)
    for (rows, cols), items in by_shape.items():
        which = torch.tensor([i for i, _ in items])
        positions = torch.tensor([list(pos) for _, pos in items])  # [n, rows * cols]
        chosen = last_rows[:, which]  # [L, n, H, keys]
        index = positions[None, :, None, :].expand(chosen.shape[0], -1, chosen.shape[2], -1)
        maps = torch.gather(chosen, 3, index).permute(1, 0, 2, 3)  # [n, L, H, rows * cols]
        grids = maps.reshape(*maps.shape[:3], rows, cols).numpy()
        masses = maps.double().sum(-1).numpy()
        for (i, _), cells, released, mass in zip(items, negative_spatial_entropies(grids),
                                                 released_negative_spatial_entropies(grids), masses):
            out[i] = GridScores(cells, released, mass)
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
    s = batch.prompt_length
    stats = []
    for i, sample in enumerate(samples):
        n = lengths[i]
        output_rows = read.output_rows[:, i, :, :n].permute(2, 0, 1, 3)
        input_rows = read.input_rows[:, i][:, :, in_valid[i]].permute(2, 0, 1, 3)
        ended = s + n < read.ids.shape[1]  # a stop token follows the answer: the last answer token was fed back
        next_row = read.output_rows[:, i, :, n: n + 1 if ended else n].permute(2, 0, 1, 3)
        gold = vlm.tokenizer(vlm.adapter.format_box(boxes[i], batch.frames[i]), add_special_tokens=False)["input_ids"]
        answer_ids = read.ids[i, s: s + n].tolist()
        prompt_ids = read.ids[i, :s][batch.encoding["attention_mask"][i].bool().cpu()].tolist()
        sequence = prompt_ids + read.ids[i, s: s + n + 1 if ended else s + n].tolist()
        stats.append(_sample_stats(vlm, sample, boxes[i], batch, i, answers[i], output_rows, input_rows,
                                   entropies[i], counts[i], next_row=next_row,
                                   gold_tokens=np.isin(answer_ids, gold), grade=graded_correctness(gold, sequence)))
    return stats


def graded_correctness(gold: Sequence[int], sequence: Sequence[int]) -> float:
    """OCR Heads' graded correctness (baekingeol/OCR_Head ``utils/metrics.py`` ``compute_score``, called with the
    gold answer's ids and ``outputs.sequences``, the prompt's ids followed by the generated ones): the length of the
    longest common CONTIGUOUS run of ids between ``gold`` and ``sequence``, over ``len(gold)``; 0 for an empty gold."""
    if not len(gold):
        return 0.0
    seq = np.asarray(sequence, dtype=np.int64)
    previous = np.zeros(len(seq) + 1, dtype=np.int64)
    longest = 0
    for token in gold:
        current = np.zeros_like(previous)
        current[1:] = np.where(seq == token, previous[:-1] + 1, 0)
        longest = max(longest, int(current.max(initial=0)))
        previous = current
    return longest / len(gold)


def _rows_array(rows: torch.Tensor) -> np.ndarray:
    """float32, C-contiguous: the layout a run folder stores, so in-memory and reloaded statistics aggregate
    to the same bits (numpy's summation order follows the memory layout)."""
    return np.ascontiguousarray(rows.float().numpy())


def _sample_stats(vlm: VLM, sample: GroundingSampleLike, box: Box, batch: GroundingBatch, index: int, answer: str,
                  output_rows: torch.Tensor, input_rows: torch.Tensor, grid: GridScores,
                  region_tokens: int, *, next_row: torch.Tensor, gold_tokens: np.ndarray,
                  grade: float) -> SampleStats:
    parsed = vlm.adapter.parse_box(answer, batch.frames[index])
    ok = not isinstance(parsed, BoxParseFailure)
    return SampleStats(
        sample_id=sample.sample_id,
        output_rows=_rows_array(output_rows),
        input_rows=_rows_array(input_rows),
        neg_entropy=grid.neg_entropy,
        region_tokens=region_tokens,
        answer=answer,
        iou=parsed.iou(box) if ok else 0.0,
        parsed=ok,
        neg_entropy_mass=grid.neg_entropy_mass,
        image_mass=grid.image_mass,
        next_row=_rows_array(next_row),
        gold_tokens=np.asarray(gold_tokens, dtype=bool),
        grade=float(grade),
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
    # masks over the prompt only (their width is the prompt length the readout's prompt-key argmax needs): the
    # readout extends them over the answer's keys as not region, not visual
    region, visual, counts = _region_and_visual_masks(batch, boxes)
    in_index, in_valid = _input_rows(batch)
    out_index = torch.arange(s - 1, s - 1 + width).unsqueeze(0).expand(b, -1)
    rows = torch.cat([in_index, out_index], dim=1)
    stats_all = runner.region_stats(enc, rows, region, visual)  # [L, b, H, r, 4]
    r_in = in_index.shape[1]
    stats = []
    for i, sample in enumerate(samples):
        n_out = len(answer_ids[i])
        output_rows = stats_all[:, i, :, r_in: r_in + n_out].permute(2, 0, 1, 3)
        input_rows = stats_all[:, i, :, :r_in][:, :, in_valid[i]].permute(2, 0, 1, 3)
        nan_entropy = np.full(output_rows.shape[1:3], np.nan)
        # the answer is the gold one: every token is a gold token, graded 1; no row of the last token is read
        stats.append(SampleStats(sample.sample_id, _rows_array(output_rows), _rows_array(input_rows),
                                 nan_entropy, counts[i], answers[i], 1.0, True, neg_entropy_mass=nan_entropy,
                                 image_mass=nan_entropy, next_row=_rows_array(output_rows[:0]),
                                 gold_tokens=np.ones(n_out, dtype=bool), grade=1.0))
    return stats


def collect_stats(vlm: VLM, samples: Sequence[GroundingSampleLike], *, batch_size: int = 8, max_new_tokens: int = 24,
                  output_source: str = "greedy") -> Iterator[list[SampleStats]]:
    """Yield the statistics batch by batch (callers persist them as they come); one model run per batch."""
    runner = backend_for(vlm)
    for start in range(0, len(samples), batch_size):
        yield batch_stats(runner, samples[start: start + batch_size], max_new_tokens=max_new_tokens,
                          output_source=output_source)
