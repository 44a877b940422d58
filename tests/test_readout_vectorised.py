"""The layer-stacked region readout and the vectorised spatial entropy are bit-identical to the per-layer and
per-grid code they replace in scoring (which tests/test_scoring.py checks against eager brute force)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import noise_image, tiny_vlm
from vrh_interp.core.execution import interventions as iv
from vrh_interp.data import grounding_samples
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.data.checks import as_box
from vrh_interp.scoring.collect import (_input_rows, _region_and_visual_masks, collect_batch,
                                        negative_spatial_entropies, negative_spatial_entropy)
from vrh_interp.core.execution.templates.readout import RegionAttentionReadout, _row_scores

# mRoPE (qwen2_vl), sliding-window layers with their own mask (gemma3), MHA-like GQA groups, image splitting
FAMILIES = ("llava", "qwen2_vl", "gemma3", "idefics3")


def _readouts(vlm, batch, boxes, **stacked):
    region, visual, _ = _region_and_visual_masks(batch, boxes)
    in_index, _ = _input_rows(batch)
    rows = torch.cat([in_index, torch.full((batch.batch_size, 1), batch.prompt_length - 1)], dim=1)
    per_layer = RegionAttentionReadout(iv.attention_readout(vlm, rows), region, visual, last_row_map=True)
    layered = RegionAttentionReadout(iv.attention_readout(vlm, rows), region, visual, last_row_map=True,
                                     stack_layers=True, **stacked)
    return per_layer, layered


def _by_layer(values: dict, per_layer: bool) -> tuple[torch.Tensor, ...]:
    """``{layer: value}`` of either mode -> ``(stats [L, ...], maps [L, ...])`` (or ``(stats,)``)."""
    chunks = []
    for layer in sorted(values):
        parts = values[layer] if isinstance(values[layer], tuple) else (values[layer],)
        chunks.append(tuple(p[None] for p in parts) if per_layer else parts)
    return tuple(torch.cat(x) for x in zip(*chunks))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("budget", [1 << 30, None, 1, "sliced"],
                         ids=["one_chunk", "default", "chunk_per_layer", "sample_slices"])
def test_layer_stacked_region_readout_is_bit_identical_to_per_layer(family, budget, monkeypatch):
    if budget == "sliced":  # every chunk reduced one sample at a time (what long prompts get on CPU)
        from vrh_interp.core.execution.templates import readout

        monkeypatch.setattr(readout, "SLICE_BYTES", 1)
        budget = 1 << 30
    vlm = tiny_vlm(family)
    samples = [grounding_samples("detect", i)[0] for i in range(3)]
    batch = vlm.encode_grounding([s.image for s in samples], [s.expression for s in samples])
    boxes = [as_box(s.box) for s in samples]
    per_layer, layered = _readouts(vlm, batch, boxes, **({} if budget is None else {"max_stack_bytes": budget}))
    assert layered.stack_layers
    ablation = iv.head_ablation(vlm, HeadSet([Head(0, 1)]))
    layers = vlm.geometry.num_layers
    want = iv.run_generate(vlm, batch.encoding, [per_layer, ablation], max_new_tokens=4, min_new_tokens=4)
    got = iv.run_generate(vlm, batch.encoding, [layered, ablation], max_new_tokens=4, min_new_tokens=4)
    assert torch.equal(got.ids, want.ids)
    assert len(got.steps) == len(want.steps) == 4
    if budget != 1:  # one value per generation step (all layers' one-row scores fit), at the last layer
        assert all(list(step[0]) == [layers - 1] for step in got.steps[1:])
    if budget == 1 << 30:
        assert list(got.steps[0][0]) == [layers - 1]
    for t, (g, w) in enumerate(zip(got.steps, want.steps)):
        g_val, w_val = _by_layer(g[0], False), _by_layer(w[0], True)
        assert len(g_val) == len(w_val) == (2 if t == 0 else 1)  # the last row's map at the prompt forward
        for a, b in zip(g_val, w_val):
            assert a.shape[0] == layers and a.shape == b.shape and torch.equal(a, b), f"step {t}"
    assert not layered._pending, "nothing may stay referenced after a forward"
    # and in a plain forward
    want = iv.run_forward(vlm, batch.encoding, [per_layer]).values[0]
    got = iv.run_forward(vlm, batch.encoding, [layered]).values[0]
    for a, b in zip(_by_layer(got, False), _by_layer(want, True), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("shape", [(3, 8, 4, 1, 37, 16), (2, 8, 4, 5, 37, 16), (2, 14, 2, 1, 61, 64),
                                   (2, 14, 2, 3, 61, 64), (2, 4, 4, 1, 20, 16), (1, 6, 1, 2, 9, 8)])
def test_row_scores_equal_repeated_keys_matmul_bitwise(shape):
    b, heads, kv, rows, keys, dim = shape
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, heads, rows, dim, generator=gen)
    k = torch.randn(b, kv, keys, dim, generator=gen)
    want = torch.matmul(q, k.repeat_interleave(heads // kv, dim=1).transpose(-1, -2))
    assert torch.equal(_row_scores(q, k), want)
    out = torch.empty(2, b, heads, rows, keys)
    assert torch.equal(_row_scores(q, k, out=out[1]), want) and torch.equal(out[1], want)


def test_vectorised_spatial_entropy_is_bit_identical_to_the_loop():
    rng = np.random.default_rng(0)
    grids = []
    for shape in [(1, 1), (1, 6), (5, 1), (3, 3), (12, 12), (7, 13), (24, 24)]:
        for dtype in (np.float32, np.float64):
            stack = [rng.random((6, *shape)),  # many small components
                     np.cumsum(np.cumsum(rng.standard_normal((6, *shape)), 1), 2),  # few large ones
                     (rng.random((6, *shape)) < 0.05) * rng.random((6, *shape)),  # sparse peaks
                     np.ones((6, *shape)),  # nothing above the mean: -inf
                     np.exp(5 * rng.standard_normal((6, *shape)))]
            grids.append(np.concatenate(stack).astype(dtype))
    snake = np.zeros((15, 15), np.float32)  # one long winding component
    snake[::2] = 1
    snake[1::4, -1] = 1
    snake[3::4, 0] = 1
    grids.append(snake[None])
    for stack in grids:
        want = np.array([negative_spatial_entropy(g) for g in stack])
        got = negative_spatial_entropies(stack)
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.float64
    assert negative_spatial_entropies(snake) == 0.0
    assert negative_spatial_entropies(np.zeros((2, 3, 0, 4))).shape == (2, 3)


def test_collect_batch_takes_a_pre_encoded_batch():
    vlm = tiny_vlm("llava")
    samples = [grounding_samples("detect", i)[0] for i in range(2)]
    batch = vlm.encode_grounding([s.image for s in samples], [s.expression for s in samples])
    want = collect_batch(vlm, samples, max_new_tokens=3)
    got = collect_batch(vlm, samples, max_new_tokens=3, batch=batch)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.output_rows, b.output_rows)
        np.testing.assert_array_equal(a.input_rows, b.input_rows)
        np.testing.assert_array_equal(a.neg_entropy, b.neg_entropy)
        assert a.answer == b.answer
    with pytest.raises(ValueError, match="rows for"):
        collect_batch(vlm, samples[:1], max_new_tokens=3, batch=batch)


def test_stack_layers_refuses_a_head_subset():
    vlm = tiny_vlm("llava")
    batch = vlm.encode_grounding([noise_image(40, 40)], ["x"])
    mask = torch.zeros(1, batch.prompt_length, dtype=torch.bool)
    readout = iv.attention_readout(vlm, [-1], heads=HeadSet([Head(0, 0)]))
    with pytest.raises(ValueError, match="every head"):
        RegionAttentionReadout(readout, mask, mask, stack_layers=True)


def test_argmax_in_region_equals_gather_at_argmax_including_ties():
    from vrh_interp.core.execution.templates.readout import _argmax_in_region

    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(2, 3, 4, 5, 30, generator=gen), -1)
    probs[0, 0, 0, 0] = 0.0  # a fully masked row: argmax 0
    probs[0, 1, 1, 1, 3] = probs[0, 1, 1, 1, 20] = 1.0  # ties between a region and an outside key, both orders
    probs[1, 2, 2, 2, 20] = probs[1, 2, 2, 2, 3] = 1.0
    probs[1, 0, 3, 0, 7] = probs[1, 0, 3, 0, 9] = 2.0  # a tie inside the region
    probs = torch.nan_to_num(probs)
    region = torch.rand(3, 30, generator=gen) < 0.3
    region[:, 3], region[:, 20], region[:, 7], region[:, 9] = True, False, True, True
    region[2] = False  # a sample without region tokens
    want = torch.gather(region[:, None, None, :].expand(probs.shape), -1, probs.argmax(-1)[..., None]).squeeze(-1)
    best_in = (probs * region[:, None, None, :]).amax(-1)
    best_out = (probs * ~region[:, None, None, :]).amax(-1)
    got = _argmax_in_region(probs, best_in, best_out, region)
    assert torch.equal(got, want.float())
