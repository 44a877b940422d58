"""One pass per batch collecting everything any scoring design needs.

For each sample the greedy answer is generated once (left-padded batch) with a ``RegionAttentionReadout``
active at every step, so the attention statistics of the answer-token rows are captured DURING the
generation that produces them: no second forward pass, no attention map kept. The prompt forward also
yields the input-token rows and the last prompt row's map for the spatial-entropy score. With
``output_source="teacher_forced"`` the ground-truth box in the family's native format is appended to the
prompt and one forward pass gives the rows predicting its tokens.

Per sample we keep ``[rows, layers, heads, 3]`` statistics (region mass, visual mass, argmax-in-region)
for output and input rows, plus ``[layers, heads]`` negative spatial entropies. Every design in
``design.py`` is a pure function of these, so the design-space search scores all variants from one pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from vrh_interp import interventions as iv
from vrh_interp.boxes import Box, BoxParseFailure
from vrh_interp.families.base import VisualBlock, VisualLayout
from vrh_interp.model import VLM, GroundingBatch
from vrh_interp.samples import GroundingSampleLike, as_box
from vrh_interp.templates.ablation import HeadAblation
from vrh_interp.templates.readout import RegionAttentionReadout


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


def _region_and_visual_masks(batch: GroundingBatch, boxes: Sequence[Box]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    b, s = batch.batch_size, batch.prompt_length
    region = torch.zeros(b, s, dtype=torch.bool)
    visual = torch.zeros(b, s, dtype=torch.bool)
    counts = []
    for i, (layout, box) in enumerate(zip(batch.layouts, boxes)):
        positions = layout.positions_for_box(box)
        counts.append(len(positions))
        region[i, positions] = True
        visual[i, list(layout.visual_positions)] = True
    return region, visual, counts


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


def _entropies(last_rows: torch.Tensor, layouts: Sequence[VisualLayout]) -> list[np.ndarray]:
    """last_rows [L, b, H, keys] -> per sample [L, H] negative spatial entropies."""
    out = []
    for i, layout in enumerate(layouts):
        block = grid_block(layout)
        pos = torch.tensor(block.positions)
        maps = last_rows[:, i][:, :, pos].reshape(last_rows.shape[0], last_rows.shape[2], block.rows, block.cols)
        arr = maps.numpy()
        out.append(np.array([[negative_spatial_entropy(arr[l, h]) for h in range(arr.shape[1])]
                             for l in range(arr.shape[0])]))
    return out


def collect_batch(vlm: VLM, samples: Sequence[GroundingSampleLike], *, max_new_tokens: int,
                  output_source: str = "greedy", ablation: HeadAblation | None = None,
                  remote: bool | str = False) -> list[SampleStats]:
    """The statistics of one batch from ONE run of the model (a generation, or a forward when teacher-forced).

    ``remote`` is passed to ``run_generate`` / ``run_forward``: the whole batch is one request, and only the
    reduced per-row statistics (not attention maps) come back.
    """
    boxes = [as_box(s.box) for s in samples]
    batch = vlm.encode_grounding([s.image for s in samples], [s.expression for s in samples])
    if output_source == "teacher_forced":
        return _collect_teacher_forced(vlm, samples, boxes, batch, remote=remote)
    region, visual, counts = _region_and_visual_masks(batch, boxes)
    in_index, in_valid = _input_rows(batch)
    prefill_rows = torch.cat([in_index, torch.full((batch.batch_size, 1), batch.prompt_length - 1)], dim=1)
    readout = iv.attention_readout(vlm, prefill_rows)
    region_readout = RegionAttentionReadout(readout, region, visual, last_row_map=True)
    templates: list[Any] = [region_readout] + ([ablation] if ablation is not None else [])
    result = iv.run_generate(vlm, batch.encoding, templates, max_new_tokens=max_new_tokens, remote=remote)
    layers = sorted(result.steps[0][0])
    # to the host before stacking: with a device_map the layers' values live on different devices
    first = [result.steps[0][0][layer] for layer in layers]
    prefill_stats = torch.stack([f[0].cpu() for f in first])  # [L, b, H, r+1, 3]
    last_rows = torch.stack([f[1].cpu() for f in first])  # [L, b, H, keys]
    decode_stats = [torch.stack([step[0][layer].cpu() for layer in layers])
                    for step in result.steps[1:]]  # [L, b, H, 1, 3]
    answers = vlm.decode_answers(result.ids, batch.prompt_length)
    lengths = vlm.answer_lengths(result.ids, batch.prompt_length)
    entropies = _entropies(last_rows, batch.layouts)
    stats = []
    for i, sample in enumerate(samples):
        n_out = lengths[i]
        rows = [prefill_stats[:, i, :, -1]] + [d[:, i, :, 0] for d in decode_stats[: max(n_out - 1, 0)]]
        output_rows = torch.stack(rows[:n_out]) if n_out else torch.zeros(0, *prefill_stats.shape[0:1], prefill_stats.shape[2], 3)
        input_rows = prefill_stats[:, i, :, : in_index.shape[1]][:, :, in_valid[i]].permute(2, 0, 1, 3)
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


def _collect_teacher_forced(vlm: VLM, samples: Sequence[GroundingSampleLike], boxes: Sequence[Box],
                            batch: GroundingBatch, *, remote: bool | str = False) -> list[SampleStats]:
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
    readout = RegionAttentionReadout(iv.attention_readout(vlm, rows), region, visual)
    result = iv.run_forward(vlm, enc, [readout], remote=remote)
    stats_all = torch.stack([result.values[0][layer] for layer in sorted(result.values[0])])  # [L,b,H,r,3]
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
                  output_source: str = "greedy", remote: bool | str = False) -> Iterator[list[SampleStats]]:
    """Yield the statistics batch by batch (callers persist them as they come); one model run per batch."""
    for start in range(0, len(samples), batch_size):
        yield collect_batch(vlm, samples[start: start + batch_size], max_new_tokens=max_new_tokens,
                            output_source=output_source, remote=remote)
