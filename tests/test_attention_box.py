"""The attention box (``evaluation.attention_box``) against an independent plain-PyTorch computation on the tiny model
of every family (eager attention maps, loops over tokens and cells, a direct convolution, a set-based flood fill),
and its smoothing / threshold / component steps against hand-computed examples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.conftest import tiny_vlm
from tests.families.checks import edge_heads, two_prompt_batch
from tests.reference import eager_attention_maps
from vrh_interp.core.description.boxes import Box
from vrh_interp.core.description.heads import HeadSet
from vrh_interp.evaluation.attention_box import (
    BoxReadout,
    Canvas,
    attention_boxes,
    box_from_grid,
    gaussian_smooth,
    head_attention,
    kept_cells,
    parse_threshold,
)


# ------------------------------------------------------------------ the independent reference
def _reference_canvas(blocks) -> tuple[tuple[float, float, float, float], int, int]:
    """The enclosing rectangle of the blocks, cut at the finest token pitch (a cell may be finer, never coarser)."""
    x0 = min(b.region[0] for b in blocks)
    y0 = min(b.region[1] for b in blocks)
    x1 = max(b.region[2] for b in blocks)
    y1 = max(b.region[3] for b in blocks)
    pitch_y = min((b.region[3] - b.region[1]) / b.rows for b in blocks)
    pitch_x = min((b.region[2] - b.region[0]) / b.cols for b in blocks)
    rows, cols = math.ceil((y1 - y0) / pitch_y - 1e-6), math.ceil((x1 - x0) / pitch_x - 1e-6)
    return (x0, y0, x1, y1), max(1, rows), max(1, cols)


def _overlap(a, b) -> float:
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


def _reference_grid(blocks, weights):
    region, rows, cols = _reference_canvas(blocks)
    cw, ch = (region[2] - region[0]) / cols, (region[3] - region[1]) / rows
    cells = {(r, c): (region[0] + c * cw, region[1] + r * ch, region[0] + (c + 1) * cw, region[1] + (r + 1) * ch)
             for r in range(rows) for c in range(cols)}
    grid = np.zeros((rows, cols))
    for block in blocks:
        for r in range(block.rows):
            for c in range(block.cols):
                token = block.token_rect(r, c)
                area = (token[2] - token[0]) * (token[3] - token[1])
                for (i, j), cell in cells.items():
                    grid[i, j] += weights[block.positions[r * block.cols + c]] * _overlap(token, cell) / area
    return region, grid, cells


def _reflect(index: int, n: int) -> int:
    """scipy.ndimage's 'reflect' border: d c b a | a b c d | d c b a (period 2n)."""
    index %= 2 * n
    return index if index < n else 2 * n - 1 - index


def _reference_smooth(grid: np.ndarray, sigma: float) -> np.ndarray:
    if sigma == 0:
        return grid.copy()
    radius = int(4 * sigma + 0.5)
    weights = {d: math.exp(-d * d / (2 * sigma * sigma)) for d in range(-radius, radius + 1)}
    total = sum(weights.values())
    rows, cols = grid.shape
    out = np.zeros_like(grid)
    for r in range(rows):
        for c in range(cols):
            out[r, c] = sum(weights[dy] * weights[dx] * grid[_reflect(r + dy, rows), _reflect(c + dx, cols)]
                            for dy in weights for dx in weights) / total ** 2
    return out


def _reference_box(blocks, weights, image_size, *, sigma=1.0, component="largest") -> Box | None:
    region, grid, cells = _reference_grid(blocks, weights)
    smooth = _reference_smooth(grid, sigma)
    above = {cell for cell in cells if smooth[cell] > smooth.mean()}
    parts, seen = [], set()
    for start in sorted(above):
        if start in seen:
            continue
        part, todo = set(), [start]
        while todo:
            cell = todo.pop()
            if cell in part:
                continue
            part.add(cell)
            todo += [(cell[0] + dy, cell[1] + dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)
                     if (cell[0] + dy, cell[1] + dx) in above]
        seen |= part
        parts.append(part)
    if not parts:
        return None
    if component == "largest":
        kept = max(parts, key=lambda p: (len(p), sum(smooth[c] for c in p)))  # max keeps the first of equals
    else:
        kept = set().union(*parts)
    rects = [cells[c] for c in kept]
    return Box(max(min(r[0] for r in rects), 0.0), max(min(r[1] for r in rects), 0.0),
               min(max(r[2] for r in rects), image_size[0]), min(max(r[3] for r in rects), image_size[1]))




def _reference_weights(vlm, encoding, heads, rows_of):
    """Eager full attention maps (the plain-PyTorch reference): the heads' summed attention, averaged over each row's
    query positions ``rows_of[i]``, over the keys."""
    maps = eager_attention_maps(vlm.hf_model, encoding)
    out = []
    for i, rows in enumerate(rows_of):
        out.append(sum(maps[h.layer][i, h.head, rows].mean(0) for h in heads).double().numpy())
    return out


def _assert_boxes_close(got: Box | None, want: Box | None) -> None:
    assert (got is None) == (want is None)
    if want is not None:
        np.testing.assert_allclose(got.as_tuple(), want.as_tuple(), rtol=0, atol=1e-6)


# ------------------------------------------------------------------ every family
def test_last_input_attention_box_equals_plain_pytorch_reference(family):
    vlm = tiny_vlm(family)
    batch, heads = two_prompt_batch(vlm), edge_heads(vlm)
    s = batch.prompt_length
    weights = head_attention(vlm, batch, heads)
    reference = _reference_weights(vlm, batch.encoding, heads, [[s - 1]] * batch.batch_size)
    for i, layout in enumerate(batch.layouts):
        np.testing.assert_allclose(weights[i], reference[i][:s], rtol=0, atol=1e-5)
        assert weights[i][list(layout.visual_positions)].sum() > 1e-3  # the heads see the image at all
    for readout in (BoxReadout(), BoxReadout(sigma=0.0, component="full")):
        boxes = attention_boxes(vlm, batch, heads, readout)
        for i, layout in enumerate(batch.layouts):
            want = _reference_box(layout.blocks, reference[i], layout.image_size, sigma=readout.sigma,
                                  component=readout.component)
            _assert_boxes_close(boxes[i].box, want)
            assert boxes[i].box is not None and boxes[i].box.area < layout.image_size[0] * layout.image_size[1] + 1e-6


def test_output_rows_attention_box_equals_plain_pytorch_reference(family):
    """``query="output"``: the mean over the rows predicting each answer token, teacher-forced."""
    vlm = tiny_vlm(family)
    batch, heads = two_prompt_batch(vlm), edge_heads(vlm)
    s = batch.prompt_length
    vocab = [i for i in range(10, 60) if i not in set(batch.encoding["input_ids"].flatten().tolist())]
    answers = [vocab[:3], vocab[3:4]]
    weights = head_attention(vlm, batch, heads, query="output", answer_ids=answers)
    encoding = vlm.teacher_forced(batch, answers)
    reference = _reference_weights(vlm, encoding, heads, [[s - 1, s, s + 1], [s - 1]])
    for i in range(batch.batch_size):
        np.testing.assert_allclose(weights[i], reference[i][:s], rtol=0, atol=1e-5)
    boxes = attention_boxes(vlm, batch, heads, BoxReadout(query="output"), answer_ids=answers)
    for i, layout in enumerate(batch.layouts):
        _assert_boxes_close(boxes[i].box, _reference_box(layout.blocks, reference[i], layout.image_size))


@pytest.mark.parametrize("name", ["llava_next", "qwen2_vl"])
def test_tiled_and_non_square_layouts_paint_every_block(name):
    """LLaVA-NeXT: a base view and finer tiles; the canvas takes the tiles' pitch and both add their attention.
    Qwen2-VL: one non-square grid (no sqrt(N) square), which IS the canvas."""
    vlm = tiny_vlm(name)
    batch, heads = two_prompt_batch(vlm), edge_heads(vlm)
    layout = batch.layouts[0]
    box_all, box_grid = (attention_boxes(vlm, batch, heads, BoxReadout(blocks=b))[0] for b in ("all", "grid"))
    if name == "llava_next":
        assert len(layout.blocks) > 1
        base = max(layout.blocks, key=lambda b: b.rows * b.cols)
        assert box_all.canvas.rows * box_all.canvas.cols > box_grid.canvas.rows * box_grid.canvas.cols
        assert box_all.grid.sum() > box_grid.grid.sum() + 1e-6  # the tiles' attention is painted too
        assert (box_grid.canvas.rows, box_grid.canvas.cols) == (base.rows, base.cols)
    else:
        (block,) = layout.blocks
        assert block.rows != block.cols
        assert (box_all.canvas.rows, box_all.canvas.cols) == (block.rows, block.cols)
        weights = head_attention(vlm, batch, heads)[0]
        np.testing.assert_allclose(box_all.grid, weights[list(block.positions)].reshape(block.rows, block.cols))


# ------------------------------------------------------------------ hand-computed steps
CANVAS = Canvas((0.0, 0.0, 50.0, 50.0), 5, 5)  # 10-pixel cells
TWO_BLOBS = np.array([[9, 9, 0, 0, 0],  # 36 of attention in 4 cells
                      [9, 9, 0, 0, 0],
                      [0, 0, 0, 0, 0],
                      [0, 0, 0, 4, 4],  # 19 in 4 cells
                      [0, 0, 0, 4, 7]], dtype=float)


def test_threshold_and_components_on_a_hand_computed_grid():
    # mean = (36 + 19) / 25 = 2.2: the two blobs are above, everything else below
    largest = box_from_grid(TWO_BLOBS, CANVAS, (50, 50), BoxReadout(sigma=0))
    assert largest.components == 2
    assert largest.box == Box(0.0, 0.0, 20.0, 20.0)  # sizes tie (4 cells): the one with more attention (36 > 19)
    peak = box_from_grid(TWO_BLOBS, CANVAS, (50, 50), BoxReadout(sigma=0, component="peak"))
    assert peak.box == Box(0.0, 0.0, 20.0, 20.0)  # the first maximum (9) is in the top-left blob
    full = box_from_grid(TWO_BLOBS, CANVAS, (50, 50), BoxReadout(sigma=0, component="full"))
    assert full.box == Box(0.0, 0.0, 50.0, 50.0)
    bigger = TWO_BLOBS.copy()
    bigger[2, 4] = 4  # the bottom-right blob grows to 5 cells: now the largest although its peak is lower
    assert box_from_grid(bigger, CANVAS, (50, 50), BoxReadout(sigma=0)).box == Box(30.0, 20.0, 50.0, 50.0)
    assert box_from_grid(bigger, CANVAS, (50, 50), BoxReadout(sigma=0, component="peak")).box == Box(0, 0, 20, 20)
    # a quantile threshold: the 0.9 quantile of the 25 values is 9 (the top 10 % are the four 9s): none above
    assert box_from_grid(TWO_BLOBS, CANVAS, (50, 50), BoxReadout(sigma=0, threshold=0.9)).box is None
    # 0.8 quantile: 7 (the 20th of 25 sorted values is 4, the 21st 7: numpy's linear rule gives 4 + 0.2 * 3 = 4.6)
    assert box_from_grid(TWO_BLOBS, CANVAS, (50, 50), BoxReadout(sigma=0, threshold=0.8, component="full")).box == \
        Box(0.0, 0.0, 50.0, 50.0)  # the 9s and the 7 are above 4.6
    # diagonal neighbours are connected (8-connectivity): a checker diagonal is one component
    diagonal = np.eye(5) * 5
    assert kept_cells(diagonal, "mean", "largest")[1] == 1
    # a constant map: nothing above its mean, no box
    assert box_from_grid(np.ones((5, 5)), CANVAS, (50, 50)).box is None


def test_box_is_clipped_to_the_image_and_padding_only_gives_none():
    canvas = Canvas((0.0, -10.0, 50.0, 40.0), 5, 5)  # padded: the top row lies above a 50 x 30 image
    top = np.zeros((5, 5))
    top[0, 1] = 1.0
    assert box_from_grid(top, canvas, (50, 30), BoxReadout(sigma=0)).box is None  # only padding is kept
    top[1, 1] = 1.0
    assert box_from_grid(top, canvas, (50, 30), BoxReadout(sigma=0)).box == Box(10.0, 0.0, 20.0, 10.0)


def test_gaussian_smoothing_on_hand_computed_values():
    k = [math.exp(-d * d / 2) for d in range(5)]
    total = k[0] + 2 * sum(k[1:])
    k = [v / total for v in k]  # sigma = 1: radius int(4 + 0.5) = 4
    # a delta in the middle of a 9 x 9 grid: the outer product of the kernel
    delta = np.zeros((9, 9))
    delta[4, 4] = 1.0
    smooth = gaussian_smooth(delta, 1.0)
    assert smooth[4, 4] == pytest.approx(k[0] ** 2, abs=1e-15)
    assert smooth[4, 6] == pytest.approx(k[0] * k[2], abs=1e-15)
    assert smooth[1, 7] == pytest.approx(k[3] * k[3], abs=1e-15)
    # mirrored borders (d c b a | a b c d | d c b a), along a row of 3: [1, 0, 0] -> k0 + k1, k1 + k2 + k4,
    # k2 + 2 k3 + k4 (zero padding would lose mass, 'mirror' mode would double other terms)
    row = gaussian_smooth(np.array([[1.0, 0.0, 0.0]]), 1.0)[0]
    np.testing.assert_allclose(row, [k[0] + k[1], k[1] + k[2] + k[4], k[2] + 2 * k[3] + k[4]], rtol=0, atol=1e-15)
    assert row.sum() == pytest.approx(1.0)
    np.testing.assert_array_equal(gaussian_smooth(TWO_BLOBS, 0), TWO_BLOBS)
    # smoothing changes the box: sigma = 1 merges nothing here but spreads each blob over its neighbours
    smoothed = box_from_grid(TWO_BLOBS, CANVAS, (50, 50), BoxReadout(sigma=1.0))
    want = _reference_smooth(TWO_BLOBS.astype(float), 1.0)
    np.testing.assert_allclose(gaussian_smooth(TWO_BLOBS, 1.0), want, rtol=0, atol=1e-12)
    assert smoothed.box != Box(0.0, 0.0, 20.0, 20.0)


def test_readout_options_are_checked():
    assert parse_threshold("MEAN") == "mean" and parse_threshold("0.9") == 0.9
    for bad in ("median", 0.0, 1.0, 1, True, "1.5"):
        with pytest.raises(ValueError, match="threshold"):
            BoxReadout(threshold=bad)
    for field, value in (("component", "biggest"), ("blocks", "tiles"), ("query", "input"), ("sigma", -1.0),
                         ("sigma", float("nan"))):
        with pytest.raises(ValueError, match=field):
            BoxReadout(**{field: value})
    vlm = tiny_vlm("llava")
    batch = two_prompt_batch(vlm)
    with pytest.raises(ValueError, match="answer_ids"):
        head_attention(vlm, batch, "L0H0", query="output")
    with pytest.raises(ValueError, match="at least one head"):
        head_attention(vlm, batch, HeadSet())
