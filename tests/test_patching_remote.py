"""Every patching entry point through the serialised remote path equals its local run.

A ``vlm.on(remote="local")`` handle makes nnsight serialise each request exactly as it would for NDIF (templates, index
tensors, the traced code), then run it in-process; the results must be bit-identical to the local handle's.
The real-server counterpart is tests/test_ndif_server.py (slow).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tests.conftest import tiny_vlm
from vrh_interp.data import grounding_samples
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.patching.attribution import attribution_patching
from vrh_interp.patching.batch import PairBatch, baseline, prepare_pairs
from vrh_interp.patching.head_patching import patch_each_head, patch_head_set, patched_answers
from vrh_interp.patching.mediation import direct_and_total_effect
from vrh_interp.patching.pairs import make_pairs
from vrh_interp.patching.positions import position_patching
from vrh_interp.patching.probes import collect_head_features
from vrh_interp.experiments.preferences import export_preference_pairs

HEADS = HeadSet([Head(0, 1), Head(1, 2)])


@pytest.fixture(scope="module")
def pairs() -> PairBatch:
    return prepare_pairs(tiny_vlm("llava"), make_pairs("referent_moved", 3), targets="ground_truth")


def test_prepare_pairs_greedy_targets() -> None:
    vlm = tiny_vlm("llava")
    raw = make_pairs("different_image", 4)  # the kind whose greedy answers differ on this fixture
    local = prepare_pairs(vlm, raw, targets="greedy", max_new_tokens=4)
    remote = prepare_pairs(vlm.on(remote="local"), raw, targets="greedy", max_new_tokens=4)
    assert local.n > 0
    assert (remote.clean_answers, remote.corrupted_answers) == (local.clean_answers, local.corrupted_answers)
    assert [p.pair_id for p in remote.pairs] == [p.pair_id for p in local.pairs]
    assert torch.equal(remote.clean_token, local.clean_token)
    assert torch.equal(remote.corrupted_token, local.corrupted_token)
    assert torch.equal(remote.metric_positions, local.metric_positions)


def test_baseline(pairs: PairBatch) -> None:
    vlm = tiny_vlm("llava")
    local, remote = baseline(vlm, pairs), baseline(vlm.on(remote="local"), pairs)
    assert not np.array_equal(local.clean, local.corrupted), "the pairs must differ for recovery to mean anything"
    np.testing.assert_array_equal(remote.clean, local.clean)
    np.testing.assert_array_equal(remote.corrupted, local.corrupted)


def test_patch_each_head(pairs: PairBatch) -> None:
    vlm = tiny_vlm("llava")
    local = patch_each_head(vlm, pairs, heads_per_forward=4, progress=False)
    remote = patch_each_head(vlm.on(remote="local"), pairs, heads_per_forward=4, progress=False)
    assert len(local.frame) == vlm.geometry.total_heads and local.frame["recovery"].notna().all()
    pd.testing.assert_frame_equal(remote.frame, local.frame, check_exact=True)
    assert remote.per_pair.keys() == local.per_pair.keys()
    for head, values in local.per_pair.items():
        np.testing.assert_array_equal(remote.per_pair[head], values, err_msg=str(head))


@pytest.mark.parametrize("positions", ["answer", "all"])
def test_patch_head_set(pairs: PairBatch, positions: str) -> None:
    vlm = tiny_vlm("llava")
    local = patch_head_set(vlm, pairs, HEADS, positions=positions)
    remote = patch_head_set(vlm.on(remote="local"), pairs, HEADS, positions=positions)
    assert np.isfinite(local["recovery"]) and local["recovery"] != 0
    assert remote == local


def test_patched_answers(pairs: PairBatch) -> None:
    vlm = tiny_vlm("llava")
    local = patched_answers(vlm, pairs, HEADS, max_new_tokens=4)
    remote = patched_answers(vlm.on(remote="local"), pairs, HEADS, max_new_tokens=4)
    assert len(local) == pairs.n and local["patched_answer"].str.len().gt(0).all()
    pd.testing.assert_frame_equal(remote, local, check_exact=True)


@pytest.mark.parametrize("method", ["gradient", "integrated_gradients"])
def test_attribution_patching(pairs: PairBatch, method: str) -> None:
    """Also a guard on nnsight 0.8.1's local simulation of a nested ``with metric.backward():``: it finds that
    block by line number in the REAL file, while the shipped block is ``ast.unparse``d (a statement continued
    over several lines, or a comment line, before it shifts the lines), and a miss is a bare backward:
    ``TypeError: 'NoneType' object does not support the context manager protocol``. A server runs it right."""
    vlm = tiny_vlm("llava")
    local = attribution_patching(vlm, pairs, method=method, steps=2)
    remote = attribution_patching(vlm.on(remote="local"), pairs, method=method, steps=2)
    assert np.abs(local.per_pair).max() > 0, "the attributions must not be trivially zero"
    np.testing.assert_array_equal(remote.per_pair, local.per_pair)
    pd.testing.assert_frame_equal(remote.frame, local.frame, check_exact=True)


def test_position_patching(pairs: PairBatch) -> None:
    vlm = tiny_vlm("llava")
    regions = ("clean_referent", "background")
    local = position_patching(vlm, pairs, [Head(1, 2)], regions=regions)
    remote = position_patching(vlm.on(remote="local"), pairs, [Head(1, 2)], regions=regions)
    assert local["region"].tolist() == ["head_output", *regions] and local["recovery"].notna().all()
    pd.testing.assert_frame_equal(remote, local, check_exact=True)


def test_direct_and_total_effect(pairs: PairBatch) -> None:
    vlm = tiny_vlm("llava")
    local = direct_and_total_effect(vlm, pairs, HEADS)
    remote = direct_and_total_effect(vlm.on(remote="local"), pairs, HEADS)
    assert all(np.isfinite(v) for v in local.values() if isinstance(v, float))
    assert remote == local


def test_collect_head_features_from_greedy_answers() -> None:
    """The generate-then-teacher-force path (prompt_end is covered in test_probes.py)."""
    vlm = tiny_vlm("llava")
    samples = [grounding_samples("eval", i, difficulty=0)[0] for i in range(2)]
    local = collect_head_features(vlm, samples, position="answer_mean", max_new_tokens=4)
    remote = collect_head_features(vlm.on(remote="local"), samples, position="answer_mean", max_new_tokens=4)
    assert local.values.abs().max() > 0
    assert (remote.position, remote.layers) == (local.position, local.layers)
    assert torch.equal(remote.values, local.values)


def test_export_preference_pairs(tmp_path) -> None:
    vlm = tiny_vlm("llava")
    samples = [s for i in range(2) for s in grounding_samples("eval", i, difficulty=0)][:4]
    heads = HeadSet([Head(0, 2)])  # flips some first answer tokens of this fixture (see test_preferences.py)
    kwargs = dict(control_seeds=(0,), batch_size=2, max_new_tokens=1)
    local = export_preference_pairs(vlm, samples, heads, tmp_path / "local" / "pairs.jsonl", **kwargs)
    remote = export_preference_pairs(vlm.on(remote="local"), samples, heads, tmp_path / "remote" / "pairs.jsonl",
                                     **kwargs)
    assert local["n_pairs"].sum() > 0
    pd.testing.assert_frame_equal(remote.drop(columns="path"), local.drop(columns="path"), check_exact=True)
    for a, b in zip(local["path"], remote["path"]):
        assert open(b, encoding="utf-8").read() == open(a, encoding="utf-8").read()


def test_attribution_patching_with_frozen_weights_as_an_ndif_server_loads_them(pairs: PairBatch) -> None:
    """An NDIF server runs ``requires_grad_(False)`` weights: the gradients to the head outputs are unchanged."""
    vlm = tiny_vlm("llava")
    trainable = attribution_patching(vlm, pairs)
    states = {name: p.requires_grad for name, p in vlm.hf_model.named_parameters()}
    assert any(states.values())
    vlm.hf_model.requires_grad_(False)
    try:
        frozen = attribution_patching(vlm, pairs)
    finally:  # the fixture is shared by the session
        for name, parameter in vlm.hf_model.named_parameters():
            parameter.requires_grad_(states[name])
    assert np.abs(trainable.per_pair).max() > 0
    np.testing.assert_array_equal(frozen.per_pair, trainable.per_pair)
