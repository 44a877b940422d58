"""Activation patching on tiny fixtures, checked against plain-PyTorch hooks (tests/reference.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from tests.conftest import tiny_vlm
from tests.reference import (captured_o_proj_inputs, decoder_layers, eager_attention_maps, edited_o_proj_inputs,
                             forced_log_probs, text_geometry)
from vrh_interp.data.scenes import COLOURS, make_scene, move_object, recolour_object
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.core.description.model import wrap
from vrh_interp.patching.attribution import AttributionResult, attribution_patching, compare_attribution
from vrh_interp.patching.batch import PairBatch, baseline, measure, prepare_pairs
from vrh_interp.patching.head_patching import HeadPatchingResult, patch_each_head, patch_head_set, patched_answers
from vrh_interp.patching.mediation import FreezeComponents, _corrupted_values, direct_and_total_effect, mlp_path
from vrh_interp.patching.pairs import PAIR_KINDS, make_pairs
from vrh_interp.patching.positions import position_patching
from vrh_interp.core.execution.templates.head_outputs import RowPairHeadPatch
from vrh_interp.core.description.tiny import TINY_FAMILIES, build_tiny
from vrh_interp.core.execution import interventions as iv

MAX_NEW = 6


def _pair_batch(vlm, kind: str = "referent_moved", n: int = 3) -> PairBatch:
    # random-weight fixtures often give both inputs the same greedy answer: use the referents' boxes
    return prepare_pairs(vlm, make_pairs(kind, n), targets="ground_truth")


def _reference_logits(vlm, encoding, edits=None) -> torch.Tensor:
    model = vlm.hf_model
    with torch.no_grad():
        if edits:
            with edited_o_proj_inputs(model, edits):
                return model(**encoding).logits
        return model(**encoding).logits


def _reference_ld(vlm, pairs: PairBatch, encoding, edits=None) -> np.ndarray:
    """The pairs' metric on the corrupted rows from a plain HF forward with optional o_proj pre-hook edits:
    whole answer = sum of log p(clean answer) - sum of log p(corrupted answer), by hand; first token =
    logit(clean token) - logit(corrupted token) at the divergence position."""
    logits = _reference_logits(vlm, encoding, edits)
    n, side = pairs.n, pairs.side
    if pairs.metric == "first_token":
        rows = torch.arange(side, 2 * side)
        picked = logits[rows, pairs.metric_positions]
        return (picked.gather(1, pairs.clean_token[:, None])
                - picked.gather(1, pairs.corrupted_token[:, None]))[:, 0].numpy()
    ids = encoding["input_ids"]
    return np.array([float(forced_log_probs(logits, side + i, pairs.prompt_length, len(pairs.clean_ids[i]), ids).sum()
                           - forced_log_probs(logits, side + n + i, pairs.prompt_length, len(pairs.corrupted_ids[i]),
                                              ids).sum()) for i in range(n)])


# --- pairs -------------------------------------------------------------------------------------------------

def _fits(scene, dx: int) -> bool:
    try:
        move_object(scene, 0, dx, 0)
        return True
    except ValueError:
        return False


def test_move_object_changes_only_the_object_pixels():
    scene = make_scene("eval", 3, 1)
    moved = next(move_object(scene, 0, dx, 0) for dx in (25, -25, 20, -20, 30, -30) if _fits(scene, dx))
    dx = moved.objects[0].box[0] - scene.objects[0].box[0]
    before, after = np.asarray(scene.image), np.asarray(moved.image)
    changed = np.any(before != after, axis=-1)
    old = scene.object_index_map == 0
    new = moved.object_index_map == 0
    assert np.array_equal(changed, old ^ new)  # only the object's old and new pixels change
    assert moved.objects[0].box == tuple(int(v) for v in np.add(scene.objects[0].box, (dx, 0, dx, 0)))
    assert (after[new] == COLOURS[scene.objects[0].colour]).all()
    with pytest.raises(ValueError, match="leaves the image"):
        move_object(scene, 0, 500, 0)


def test_recolour_keeps_layout():
    scene = make_scene("eval", 4, 1)
    colour = next(c for c in COLOURS if c != scene.objects[0].colour)
    recoloured = recolour_object(scene, 0, colour)
    assert np.array_equal(recoloured.object_index_map, scene.object_index_map)
    assert (np.asarray(recoloured.image)[scene.object_index_map == 0] == COLOURS[colour]).all()
    others = scene.object_index_map != 0
    assert (np.asarray(recoloured.image)[others] == np.asarray(scene.image)[others]).all()


@pytest.mark.parametrize("kind", PAIR_KINDS)
def test_pairs_are_deterministic_and_consistent(kind):
    pairs = make_pairs(kind, 5)
    again = make_pairs(kind, 5)
    assert [p.pair_id for p in pairs] == [p.pair_id for p in again]
    for pair in pairs:
        assert pair.kind == kind
        if kind == "expression_swap":
            assert pair.clean.image is pair.corrupted.image and pair.clean.expression != pair.corrupted.expression
            assert pair.corrupted_box != tuple(pair.clean.box)
        else:
            assert pair.clean.expression == pair.corrupted.expression
        if kind == "referent_moved":
            assert pair.corrupted_box != tuple(pair.clean.box)
        if kind == "referent_recoloured":
            # the expression now names the other object, whose box is the corrupted answer
            assert pair.corrupted_box in [tuple(b) for b in pair.corrupted.meta["object_boxes"]]
            assert pair.corrupted_box != tuple(pair.clean.box)


def test_swap_pairs_of_same_length():
    pairs = make_pairs("expression_swap", 6, same_expression_length=True)
    assert all(len(p.clean.expression.split()) == len(p.corrupted.expression.split()) for p in pairs)


# --- head-output patching --------------------------------------------------------------------------------

@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_patching_every_head_reproduces_the_clean_output(family):
    """All heads at the answer positions: the corrupted rows' metric equals the clean rows' (MLPs are
    position-wise and the answer-position tokens are identical, so the residual stream there is clean)."""
    vlm = tiny_vlm(family)
    pairs = _pair_batch(vlm)
    base = baseline(vlm, pairs)
    result = patch_head_set(vlm, pairs, vlm.geometry.all_heads(), base=base)
    assert result["recovery"] == pytest.approx(1.0, abs=1e-4)
    _, encoding = pairs.encode(vlm)
    template = RowPairHeadPatch.build([(h, pairs.clean_rows(), pairs.corrupted_rows())
                                       for h in vlm.geometry.all_heads()],
                                      vlm.geometry, iv.projection_path(vlm), positions=pairs.positions("answer"))
    values = measure(vlm, pairs, encoding, [1], templates=[template])[0]
    np.testing.assert_allclose(values, base.clean_parts, atol=1e-4)  # every coordinate's part too
    for name in ("x1", "y1", "x2", "y2"):
        assert np.isnan(result[f"recovery_{name}"]) or result[f"recovery_{name}"] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("family", ["llava", "qwen2_vl", "gemma3"])
def test_patching_from_the_same_run_changes_nothing(family):
    vlm = tiny_vlm(family)
    pairs = _pair_batch(vlm)
    same = dataclasses.replace(pairs, pairs=[type(p)(p.pair_id, p.kind, p.clean, p.clean, None) for p in pairs.pairs])
    _, encoding = same.encode(vlm)
    unpatched = measure(vlm, same, encoding, [1])
    template = RowPairHeadPatch.build([(h, same.clean_rows(), same.corrupted_rows()) for h in vlm.geometry.all_heads()],
                                      vlm.geometry, iv.projection_path(vlm))
    patched = measure(vlm, same, encoding, [1], templates=[template])
    np.testing.assert_allclose(patched, unpatched, atol=1e-5)


@pytest.mark.parametrize("family", ["llava", "qwen2_vl", "internvl", "idefics3"])
@pytest.mark.parametrize("positions", ["answer", "all"])
def test_each_head_patch_equals_hook_reference(family, positions):
    vlm = tiny_vlm(family)
    pairs = _pair_batch(vlm)
    g = vlm.geometry
    heads = HeadSet([Head(0, 0), Head(g.num_layers - 1, g.num_heads - 1)])
    result = patch_each_head(vlm, pairs, heads=heads, positions=positions, heads_per_forward=2, progress=False)
    _, encoding = pairs.encode(vlm)
    clean = captured_o_proj_inputs(vlm.hf_model, encoding)
    side = pairs.side
    pos = list(pairs.positions(positions)) if positions == "answer" else list(range(encoding["input_ids"].shape[1]))
    for head in heads:
        def edit(x, head=head):
            x[side:2 * side, pos, head.head] = clean[head.layer][:side, pos, head.head]
        expected = _reference_ld(vlm, pairs, encoding, {head.layer: edit})
        np.testing.assert_allclose(result.per_pair[head], expected, atol=1e-4)
    assert set(result.frame["head"]) == {str(h) for h in heads}


def test_patched_generation_with_every_head_gives_the_clean_answer():
    vlm = tiny_vlm("llava")
    pairs = _pair_batch(vlm)
    frame = patched_answers(vlm, pairs, vlm.geometry.all_heads(), max_new_tokens=MAX_NEW)
    assert list(frame["patched_answer"]) == list(frame["clean_answer"])
    none = patched_answers(vlm, pairs, HeadSet(), max_new_tokens=MAX_NEW)
    corrupted = [p.corrupted for p in pairs.pairs]
    batch = vlm.encode_grounding([s.image for s in corrupted], [s.expression for s in corrupted])
    plain = vlm.hf_model.generate(**batch.encoding, max_new_tokens=MAX_NEW, do_sample=False)
    assert list(none["patched_answer"]) == vlm.decode_answers(plain, batch.prompt_length)


# --- attribution patching -------------------------------------------------------------------------------

def _fresh(family: str, dtype=torch.float32):
    tiny = build_tiny(family, seed=0)
    return wrap(tiny.model.to(dtype), tiny.processor)


_DOUBLE: dict[str, object] = {}


def _double(family: str):
    """The fixture in float64 (cached, never mutated): on random weights the whole-answer metric's clean-corrupted
    gap is ~0.01 nats, so float32 rounding (~1e-6 per summed token) would move recoveries by ~1e-3."""
    if family not in _DOUBLE:
        _DOUBLE[family] = _fresh(family, torch.float64)
    return _DOUBLE[family]


def _as_double(encoding):
    return {k: (v.double() if torch.is_floating_point(v) else v) for k, v in encoding.items()}


@pytest.mark.parametrize("method", ["gradient", "integrated_gradients"])
def test_attribution_is_exact_when_the_metric_is_linear_in_the_head_outputs(method):
    """Last layer with its MLP zeroed and the final norm removed: logits, hence the single-token logit difference,
    are linear in its head outputs, so both linear estimates equal exact patching."""
    vlm = _fresh("llava")
    model = vlm.hf_model
    last = decoder_layers(model)[-1]
    torch.nn.init.zeros_(last.mlp.down_proj.weight)
    model.get_decoder().norm = torch.nn.Identity()
    pairs = _pair_batch(vlm).with_metric("first_token")
    g = vlm.geometry
    heads = HeadSet(Head(g.num_layers - 1, h) for h in range(g.num_heads))
    exact = patch_each_head(vlm, pairs, heads=heads, progress=False)
    estimate = attribution_patching(vlm, pairs, method=method, steps=2)
    for head in heads:
        np.testing.assert_allclose(estimate.per_pair[head.layer, head.head],
                                   exact.per_pair[head] - exact.baseline.corrupted,
                                   rtol=1e-3, atol=1e-4)


def test_attribution_equals_the_finite_difference_estimate():
    """Central differences (error O(alpha^2)) of the whole-answer metric along clean - corrupted, from plain hooks."""
    vlm = _fresh("llava", torch.float64)
    pairs = _pair_batch(vlm)
    _, encoding = pairs.encode(vlm)
    encoding = {k: (v.double() if torch.is_floating_point(v) else v) for k, v in encoding.items()}
    estimate = attribution_patching(vlm, pairs)
    clean = captured_o_proj_inputs(vlm.hf_model, encoding)
    side, pos = pairs.side, list(pairs.positions("answer"))
    alpha = 1e-2  # measured: agreement ~1e-3 relative; smaller steps drown in the fixture's float32 rounding
    for head in [Head(0, 1), Head(1, 0)]:
        def step(sign: float, head: Head = head):
            def edit(x):
                x[side:2 * side, pos, head.head] += sign * alpha * (
                    clean[head.layer][:side, pos, head.head] - clean[head.layer][side:, pos, head.head])
            return _reference_ld(vlm, pairs, encoding, {head.layer: edit})
        central = (step(1.0) - step(-1.0)) / (2 * alpha)
        np.testing.assert_allclose(estimate.per_pair[head.layer, head.head], central, rtol=1e-2, atol=5e-6)


def test_integrated_gradients_of_a_layer_add_up_to_patching_the_whole_layer():
    """Path-integral theorem: summed over one layer's heads, integrated gradients (all heads of that layer
    interpolated together) equal the exact effect of patching the whole layer, up to the midpoint rule's
    O(1/steps^2) error; the exact effect comes from plain hooks. The single-point gradient does not."""
    vlm = _fresh("llava", torch.float64)
    pairs = _pair_batch(vlm)
    _, encoding = pairs.encode(vlm)
    encoding = {k: (v.double() if torch.is_floating_point(v) else v) for k, v in encoding.items()}
    clean = captured_o_proj_inputs(vlm.hf_model, encoding)
    side, pos, layer = pairs.side, list(pairs.positions("answer")), 0

    def edit(x):
        x[side:2 * side, pos] = clean[layer][:side, pos]
    exact = _reference_ld(vlm, pairs, encoding, {layer: edit}) - _reference_ld(vlm, pairs, encoding)
    estimate = attribution_patching(vlm, pairs, method="integrated_gradients", steps=16).per_pair[layer].sum(axis=0)
    scale = np.abs(exact).max()
    assert scale > 1e-3
    np.testing.assert_allclose(estimate, exact, atol=2e-3 * scale)
    gradient = attribution_patching(vlm, pairs).per_pair[layer].sum(axis=0)
    assert np.abs(gradient - exact).max() > 5 * np.abs(estimate - exact).max()


def _frames(exact_values: dict[str, float], estimate_values: dict[str, float]):
    def frame(values):
        return pd.DataFrame([{"head": h, "layer": Head.parse(h).layer, "head_index": Head.parse(h).head,
                              "recovery": v, "method": "gradient"} for h, v in values.items()])
    return HeadPatchingResult(frame(exact_values), {}, None), AttributionResult(frame(estimate_values), None, None)


def test_agreement_is_measured_on_the_heads_exact_patching_ranks_first():
    """Many near-zero heads make the all-heads rank correlation look good; the top-k numbers must not."""
    big = {"L2H6": 0.21, "L3H5": 0.15, "L2H7": 0.12, "L3H1": 0.05}
    small = {f"L0H{h}": 0.001 * h for h in range(8)} | {f"L1H{h}": -0.0005 * h for h in range(8)}
    exact, faithful = _frames(big | small, big | small)
    summary = compare_attribution(exact, faithful)
    assert summary["top_k"] == 4 and summary["top_k_heads"] == "L2H6 L3H5 L2H7 L3H1"
    assert summary["top_k_spearman"] == pytest.approx(1.0) and summary["safe_substitute"] == "yes"
    # the top exact head underestimated 13-fold and the rest of the top reversed: all-heads rho stays high
    distorted = {"L2H6": 0.016, "L3H5": 0.03, "L2H7": 0.06, "L3H1": 0.1}
    _, estimate = _frames(big | small, distorted | small)
    summary = compare_attribution(exact, estimate)
    assert summary["spearman"] > 0.8
    assert summary["top_k_spearman"] == pytest.approx(-1.0)
    assert summary["best_exact_head"] == "L2H6" and summary["best_exact_rank_by_estimate"] == 4
    assert summary["ratio_min"] == pytest.approx(0.016 / 0.21)
    assert summary["top_k_overlap"] == 1.0
    assert summary["safe_substitute"].startswith("no: top-4 Spearman")


def test_rank_comparison_on_a_real_sweep():
    vlm = tiny_vlm("llava")
    pairs = _pair_batch(vlm)
    exact = patch_each_head(vlm, pairs, progress=False)
    estimate = attribution_patching(vlm, pairs)
    summary = compare_attribution(exact, estimate)
    assert summary["heads"] == len(vlm.geometry.all_heads())
    assert -1.0 <= summary["spearman"] <= 1.0 and -1.0 <= summary["kendall_tau_b"] <= 1.0
    same = compare_attribution(exact, type(estimate)(exact.frame.assign(method="exact"), estimate.per_pair,
                                                     estimate.baseline))
    assert same["top_k_spearman"] == pytest.approx(1.0) and same["safe_substitute"] == "yes"


# --- key/value-position patching ------------------------------------------------------------------------

def test_value_position_patch_equals_eager_reference():
    """Values of one head at the referent's visual tokens: output change = p_corrupted[rows, P] @ dV[P]."""
    vlm = tiny_vlm("llava")
    pairs = _pair_batch(vlm, "referent_moved")
    head = Head(1, 1)
    frame = position_patching(vlm, pairs, [head], regions=["clean_referent"], states="values")
    batch, encoding = pairs.encode(vlm)
    from vrh_interp.patching.positions import region_positions
    source_positions, positions = region_positions(pairs, batch, encoding)["clean_referent"]
    model = vlm.hf_model
    num_heads, head_dim = text_geometry(model)
    kv = model.config.get_text_config().num_key_value_heads
    group = head.head // (num_heads // kv)
    values: dict[str, torch.Tensor] = {}
    handle = decoder_layers(model)[head.layer].self_attn.v_proj.register_forward_hook(
        lambda _m, _i, out: values.__setitem__("v", out.detach().clone()))
    with torch.no_grad():
        model(**encoding)
    handle.remove()
    b, s, _ = values["v"].shape
    v = values["v"].view(b, s, kv, head_dim)[:, :, group]
    probs = eager_attention_maps(model, encoding)[head.layer][:, head.head]  # [b, q, k]
    side, rows = pairs.side, list(pairs.positions("answer"))

    def edit(x):
        for r in range(side):  # every row of a side: each pair's clean-answer and corrupted-answer rows
            p = positions[r]
            delta = v[r, source_positions[r]] - v[side + r, p]  # [P, D]
            x[side + r, rows, head.head] += probs[side + r][rows][:, p] @ delta
    expected = _reference_ld(vlm, pairs, encoding, {head.layer: edit})
    base = baseline(vlm, pairs)
    got = frame.set_index("region").loc["clean_referent", "recovery"]
    want = float(np.mean(expected - base.corrupted) / np.mean(base.clean - base.corrupted))
    assert got == pytest.approx(want, abs=5e-4)  # 5e-4: 2.3e-4 measured on an AVX2-only CPU


def test_key_position_patch_equals_a_two_pass_hook_reference():
    """Keys of one head's KV group at the referent's visual tokens, by hooks alone: pass 1 swaps the clean
    run's k_proj output into the corrupted rows there (same layout, so same RoPE positions) and captures that
    head's o_proj input at the answer rows; pass 2 writes only those values into an otherwise unpatched run."""
    vlm = _double("llava")
    pairs = _pair_batch(vlm, "referent_moved")
    head = Head(0, 0)  # the fixture's head whose keys at the referent matter most (recovery ~ -0.007)
    frame = position_patching(vlm, pairs, [head], regions=["clean_referent"], states="keys")
    batch, encoding = pairs.encode(vlm)
    encoding = _as_double(encoding)
    from vrh_interp.patching.positions import region_positions
    source_positions, positions = region_positions(pairs, batch, encoding)["clean_referent"]
    assert [list(a) for a in source_positions] == [list(b) for b in positions]  # same expression, same layout
    model = vlm.hf_model
    num_heads, head_dim = text_geometry(model)
    kv = model.config.get_text_config().num_key_value_heads
    group = slice(head.head // (num_heads // kv) * head_dim, (head.head // (num_heads // kv) + 1) * head_dim)
    side, rows = pairs.side, list(pairs.positions("answer"))

    def swap_keys(_module, _inputs, out):
        out = out.clone()
        for r in range(side):
            p = [int(x) for x in positions[r]]
            out[side + r, p, group] = out[r, p, group]
        return out

    handle = decoder_layers(model)[head.layer].self_attn.k_proj.register_forward_hook(swap_keys)
    try:
        patched = captured_o_proj_inputs(model, encoding)[head.layer]
    finally:
        handle.remove()

    def edit(x):
        x[side:2 * side, rows, head.head] = patched[side:2 * side, rows, head.head]
    expected = _reference_ld(vlm, pairs, encoding, {head.layer: edit})
    base = baseline(vlm, pairs)
    got = frame.set_index("region").loc["clean_referent", "recovery"]
    want = float(np.mean(expected - base.corrupted) / np.mean(base.clean - base.corrupted))
    assert abs(want) > 5e-3  # the keys there matter in this fixture, so the comparison is not 0 == 0
    assert got == pytest.approx(want, abs=2e-5)  # measured agreement ~5e-6 (float32 recomputation)


def test_visual_positions_cannot_matter_in_expression_swaps():
    """The image precedes the text, so visual keys/values are identical in both runs: recovery 0."""
    vlm = tiny_vlm("llava")
    candidates = make_pairs("expression_swap", 12, same_expression_length=True)
    lengths = {p.pair_id: [vlm.encode_grounding([s.image], [s.expression]).prompt_length
                           for s in (p.clean, p.corrupted)]
               for p in candidates}
    same = [p for p in candidates if lengths[p.pair_id][0] == lengths[p.pair_id][1]]  # equal TOKEN counts
    pairs = prepare_pairs(vlm, same[:3], targets="ground_truth")
    frame = position_patching(vlm, pairs, [Head(1, 0)], regions=["clean_referent", "background", "text"])
    by_region = frame.set_index("region")["recovery"]
    # 0 up to the recomputation's float32 rounding (the head output is recomputed outside the sdpa kernel)
    # 5e-4: 1.8e-4 measured on an AVX2-only CPU (no avx512; the landed 0.2 code alike); a leak is of order 1e-2
    assert by_region["clean_referent"] == pytest.approx(0.0, abs=5e-4)
    assert by_region["background"] == pytest.approx(0.0, abs=5e-4)
    assert abs(by_region["text"]) > 1e-4  # the expression differs, so text keys/values do matter


def test_regions_follow_the_image_when_padding_differs():
    """Expressions of different lengths shift the image: regions are mapped through each row's own layout.

    Copied keys keep the clean row's rotary phase, so recovery is near 0 rather than exactly 0; copying
    the same absolute positions instead would read other patches (recoveries of several percent)."""
    vlm = tiny_vlm("llava")
    swaps = [p for p in make_pairs("expression_swap", 12) if len(p.clean.expression) != len(p.corrupted.expression)]
    pairs = prepare_pairs(vlm, swaps[:3], targets="ground_truth")
    batch, encoding = pairs.encode(vlm)
    lengths = encoding["attention_mask"].sum(dim=1)
    side = pairs.side
    assert (lengths[:side] != lengths[side:]).any()
    with pytest.raises(ValueError, match="equal length"):
        patch_head_set(vlm, pairs, HeadSet([Head(0, 0)]), positions="all")
    from vrh_interp.patching.positions import region_positions
    source, target = region_positions(pairs, batch, encoding)["clean_referent"]
    assert len(source) == side  # one entry per row of a side
    for r in range(side):
        shift = int(lengths[side + r] - lengths[r])  # more text in the corrupted row: its image starts earlier
        assert [s - t for s, t in zip(source[r], target[r])] == [shift] * len(source[r])
        assert encoding["input_ids"][r, source[r]].eq(vlm.image_token_id).all()
        assert encoding["input_ids"][side + r, target[r]].eq(vlm.image_token_id).all()


# --- mediation ------------------------------------------------------------------------------------------

def test_freezing_at_the_unpatched_values_changes_nothing():
    vlm = tiny_vlm("llava")
    pairs = _pair_batch(vlm)
    g = vlm.geometry
    _, encoding = pairs.encode(vlm)
    rows, positions, layers = pairs.corrupted_rows(), pairs.positions("answer"), list(range(g.num_layers))
    heads_out, mlps_out = _corrupted_values(vlm, encoding, rows, positions, layers)
    freeze = FreezeComponents({l: iv.projection_path(vlm)(l) for l in layers}, {l: mlp_path(vlm, l) for l in layers},
                              {l: tuple(range(g.num_heads)) for l in layers}, g.num_heads, g.head_dim, tuple(rows),
                              positions, heads_out, mlps_out)
    frozen = measure(vlm, pairs, encoding, [1], templates=[freeze])[0].sum(-1)
    np.testing.assert_allclose(frozen, baseline(vlm, pairs).corrupted, atol=1e-5)


def test_direct_effect_of_first_layer_heads_is_what_reaches_the_logits_unmediated():
    vlm = _double("llava")
    pairs = _pair_batch(vlm)
    g = vlm.geometry
    # every head of the last layer: its only downstream component is the last MLP
    last = HeadSet(Head(g.num_layers - 1, h) for h in range(g.num_heads))
    effect = direct_and_total_effect(vlm, pairs, last)
    total = patch_head_set(vlm, pairs, last)
    assert effect["total"] == pytest.approx(total["recovery"])
    assert effect["indirect"] == pytest.approx(effect["total"] - effect["direct"])
    # reference: patch the heads and replace the last MLP's output by its unpatched corrupted value
    _, encoding = pairs.encode(vlm)
    encoding = _as_double(encoding)
    model = vlm.hf_model
    mlp_out: dict[str, torch.Tensor] = {}
    mlp = decoder_layers(model)[-1].mlp
    handle = mlp.register_forward_hook(lambda _m, _i, out: mlp_out.__setitem__("v", out.detach().clone()))
    with torch.no_grad():
        model(**encoding)
    handle.remove()
    clean = captured_o_proj_inputs(model, encoding)
    side, pos = pairs.side, list(pairs.positions("answer"))

    def edit(x):
        x[side:2 * side, pos] = clean[g.num_layers - 1][:side, pos]

    def freeze_hook(_m, _i, out):
        out = out.clone()
        out[side:2 * side, pos] = mlp_out["v"][side:2 * side, pos]
        return out
    handle = mlp.register_forward_hook(freeze_hook)
    try:
        expected = _reference_ld(vlm, pairs, encoding, {g.num_layers - 1: edit})
    finally:
        handle.remove()
    base = baseline(vlm, pairs)
    want = float(np.mean(expected - base.corrupted) / np.mean(base.clean - base.corrupted))
    assert effect["direct"] == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_teacher_forcing_does_not_leak_the_answer_into_the_prompt(family):
    """Appending answer tokens leaves the prompt-end logits unchanged (PaliGemma needs token type 1 for them)."""
    vlm = tiny_vlm(family)
    pair = make_pairs("referent_moved", 1)[0]
    batch = vlm.encode_grounding([pair.clean.image], [pair.clean.expression])
    with torch.no_grad():
        prompt_only = vlm.hf_model(**batch.encoding).logits[0, -1]
        forced = vlm.hf_model(**vlm.teacher_forced(batch, [[5, 6, 7]])).logits[0, batch.prompt_length - 1]
    torch.testing.assert_close(forced, prompt_only, atol=1e-5, rtol=0)
