"""Patch metrics are objects (``vrh_interp.patching.metrics``): one registry read by the batch, the CLI and the
grid, and a new metric is one class."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.conftest import tiny_vlm
from vrh_interp.core.description.heads import HeadSet
from vrh_interp.patching import batch
from vrh_interp.patching.batch import baseline, prepare_pairs
from vrh_interp.patching.head_patching import patch_each_head
from vrh_interp.patching.metrics import PATCH_METRICS, AnswerMetric, FirstTokenMetric, PatchMetric, patch_metric
from vrh_interp.patching.pairs import make_pairs


def test_the_registry_is_what_everything_reads():
    assert tuple(PATCH_METRICS) == ("answer", "first_token") == batch.METRICS  # names the tables always wrote
    assert isinstance(patch_metric("answer"), AnswerMetric) and isinstance(patch_metric("first_token"),
                                                                           FirstTokenMetric)
    assert batch.METRIC_LABELS == {name: m.label for name, m in PATCH_METRICS.items()}
    assert (patch_metric("answer").sequences, patch_metric("first_token").sequences) == (2, 1)
    with pytest.raises(ValueError, match=r"metric must be one of \('answer', 'first_token'\), not 'whole'"):
        patch_metric("whole")
    from vrh_interp.apps.cli import build_parser

    assert build_parser().parse_args(["patch", "--metric", "first_token"]).metric == "first_token"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["patch", "--metric", "whole"])


def test_the_registry_imports_no_torch():
    probe = "import sys, vrh_interp.patching.metrics; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


class NegatedFirstToken(FirstTokenMetric):
    """The first-token logit difference with its sign flipped: a new metric in one class (a test's)."""

    name = "negated_first_token"
    label = "minus the first-token logit difference"

    def scoring(self, pairs):
        scored = super().scoring(pairs)
        return {**scored, "weights": -scored["weights"]}


def test_a_new_metric_is_one_class(monkeypatch):
    assert issubclass(NegatedFirstToken, PatchMetric)
    monkeypatch.setitem(PATCH_METRICS, NegatedFirstToken.name, NegatedFirstToken())
    vlm = tiny_vlm("llava")
    pairs = prepare_pairs(vlm, make_pairs("referent_moved", 3), targets="ground_truth", metric=NegatedFirstToken.name)
    first = pairs.with_metric("first_token")
    assert pairs.sequences == 1 and pairs.forced() == first.forced()
    negated, plain = baseline(vlm, pairs), baseline(vlm, first)
    np.testing.assert_allclose(negated.clean, -plain.clean, atol=1e-5)
    np.testing.assert_allclose(negated.corrupted, -plain.corrupted, atol=1e-5)
    heads = HeadSet(vlm.geometry.all_heads()[:3])
    with torch.no_grad():
        a = patch_each_head(vlm, pairs, heads=heads, progress=False).frame
        b = patch_each_head(vlm, first, heads=heads, progress=False).frame
    np.testing.assert_allclose(a["recovery"], b["recovery"], atol=1e-4)  # a recovery is a ratio: sign-free
    assert set(a["metric"]) == {NegatedFirstToken.name}


def test_key_value_patch_kinds_are_objects_in_one_registry():
    from vrh_interp.core.execution.templates.position_patch import PATCHED_STATES, StatePatch, patched_states

    assert {name: (kind.keys, kind.values) for name, kind in PATCHED_STATES.items()} == {
        "keys": (True, False), "values": (False, True), "both": (True, True)}
    assert all(isinstance(kind, StatePatch) for kind in PATCHED_STATES.values())
    with pytest.raises(ValueError, match="states must be one of 'keys', 'values', 'both', not 'queries'"):
        patched_states("queries")
