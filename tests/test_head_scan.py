"""Single-head causal scan on the shipped toy A (32 heads; trained, so masking one head changes answers)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vrh_interp.evaluation.grounding import ablation_values, ground_batch
from vrh_interp.experiments.head_scan import HeadScanResult, head_scan, head_scan_from_run
from vrh_interp.experiments.sweep import run_conditions
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.core.description.model import wrap
from vrh_interp.core.bookkeeping.runs import RecordLog
from vrh_interp.scoring.design import resolve_design
from vrh_interp.scoring.scores import HeadScores
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.core.execution.templates.ablation import Ablation
from vrh_interp.toy import load as load_toy
from vrh_interp.evaluation.statistics import spearman

SAMPLES = 8
MAX_NEW_TOKENS = 16


@pytest.fixture(scope="module")
def toy():
    model, processor = load_toy("a")
    return wrap(model, processor)


@pytest.fixture(scope="module")
def samples():
    return synthetic_samples("eval", SAMPLES)


@pytest.fixture(scope="module")
def scores(toy):
    g = toy.geometry
    values = np.random.default_rng(0).random((g.num_layers, g.num_heads))
    values[1, 3] = values[2, 5] = 0.5  # a tie: ranks break it by (layer, head)
    return HeadScores(scores=values, design=resolve_design("vrh"), sample_ids=["detect-0-L1-o0"])


@pytest.fixture(scope="module")
def scan(toy, samples, scores, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("scan") / "run"
    return head_scan(toy, samples, scores, batch_size=4, max_new_tokens=MAX_NEW_TOKENS, run_dir=run_dir,
                     progress=False), run_dir


def _accuracy(outcomes) -> float:
    return float(np.mean([o.iou >= 0.5 for o in outcomes]))


def _ground(toy, samples, heads=None, **kwargs):
    """``ground_batch`` over the scan's batches of 4."""
    return [o for start in range(0, len(samples), 4)
            for o in ground_batch(toy, samples[start: start + 4], heads=heads, max_new_tokens=MAX_NEW_TOKENS, **kwargs)]


def test_each_heads_accuracy_equals_ground_batch_with_that_head_masked(toy, samples, scan):
    result, _ = scan
    table = result.table().set_index("head")
    assert len(table) == toy.geometry.total_heads and (table["n"] == SAMPLES).all()
    base = _ground(toy, samples)
    assert result.baseline_accuracy == _accuracy(base)
    keys = {c.heads[0]: c.key for c in result.sweep.conditions if c.kind == "single"}
    records = result.sweep.records
    for head in toy.geometry.all_heads():
        outcomes = _ground(toy, samples, HeadSet([head]))
        assert table.loc[str(head), "accuracy"] == _accuracy(outcomes), head
        assert table.loc[str(head), "drop"] == _accuracy(base) - _accuracy(outcomes)
        assert records[records["condition"] == keys[head]]["answer"].tolist() == [o.answer for o in outcomes]
    assert table["drop"].nunique() > 2, "single heads should differ in damage on toy A (else the test is weak)"


def test_table_ranks_and_spearman(scan, scores):
    result, _ = scan
    table = result.table()
    assert table["score_rank"].tolist() == list(range(1, len(table) + 1))
    assert table["head"].tolist() == [str(h) for h in scores.ranking()]
    assert table.loc[table["head"] == "L1H3", "score_rank"].item() < table.loc[table["head"] == "L2H5",
                                                                                 "score_rank"].item()
    np.testing.assert_array_equal(table["score"], [scores.score_of(Head.parse(h)) for h in table["head"]])
    # damage rank: 1 = largest drop, tied drops share the best rank
    for row in table.itertuples():
        assert row.damage_rank == 1 + int((table["drop"] > row.drop).sum())
    ra, rb = table["score"].rank() - (len(table) + 1) / 2, table["drop"].rank() - (len(table) + 1) / 2  # tie-averaged
    want = (ra * rb).sum() / np.sqrt((ra ** 2).sum() * (rb ** 2).sum())
    assert result.spearman() == pytest.approx(want, abs=1e-12)
    assert result.spearman() == spearman(table["score"].to_numpy(), table["drop"].to_numpy())


def test_resume_after_a_truncated_log_is_exact(toy, samples, scores, scan, tmp_path):
    result, run_dir = scan
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(run_dir, resumed_dir)
    log = resumed_dir / "sweep_records.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(lines[: len(lines) // 3]) + '{"sample_id": "torn')
    resumed = head_scan(toy, samples, scores, batch_size=4, max_new_tokens=MAX_NEW_TOKENS, run_dir=resumed_dir,
                        progress=False)
    pd.testing.assert_frame_equal(resumed.sweep.records, result.sweep.records)
    pd.testing.assert_frame_equal(resumed.table(), result.table())
    pd.testing.assert_frame_equal(head_scan_from_run(resumed_dir, scores).table(), result.table())
    assert len(RecordLog(log).read()) == len(lines)


KILLED_SCAN = textwrap.dedent("""
    import sys, torch
    torch.set_num_threads(1)
    from vrh_interp.core.description.model import wrap
    from vrh_interp.toy import load
    from vrh_interp.data.sources import synthetic_samples
    from vrh_interp.experiments.head_scan import head_scan
    vlm = wrap(*load("a"))
    head_scan(vlm, synthetic_samples("eval", {samples}), batch_size=4, max_new_tokens={tokens}, run_dir=sys.argv[1],
              progress=False)
""").format(samples=SAMPLES, tokens=MAX_NEW_TOKENS)


def test_scan_killed_and_resumed_equals_uninterrupted(toy, samples, scan, tmp_path):
    result, _ = scan
    run_dir = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SCAN, str(run_dir)], env=env)
    log = run_dir / "sweep_records.jsonl"
    deadline = time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None:
            if log.exists() and log.read_text().count("\n") >= 12:
                break
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    written = len(RecordLog(log).read())
    assert 0 < written < SAMPLES * (1 + toy.geometry.total_heads), "the scan was not interrupted mid-way"
    resumed = head_scan(toy, samples, batch_size=4, max_new_tokens=MAX_NEW_TOKENS, run_dir=run_dir, progress=False)
    pd.testing.assert_frame_equal(resumed.sweep.records, result.sweep.records)


def test_subset_of_heads_scatter_and_errors(toy, samples, scores, scan):
    result, _ = scan
    subset = HeadSet.parse("L0H2,L3H1")
    part = head_scan(toy, samples[:4], heads=subset, batch_size=4, max_new_tokens=MAX_NEW_TOKENS, progress=False)
    assert part.table()["head"].tolist() == ["L0H2", "L3H1"] and np.isnan(part.spearman())
    with pytest.raises(ValueError, match="pass scores="):
        part.scatter()
    fig = result.scatter()
    assert "Spearman" in fig.axes[0].get_title()
    overlapping = HeadScores(scores=scores.scores, design=scores.design, sample_ids=[samples[0].sample_id])
    with pytest.raises(ValueError, match="also used for detection"):
        head_scan(toy, samples, overlapping, progress=False)
    with pytest.raises(ValueError, match="no single-head conditions"):
        HeadScanResult(run_conditions(toy, samples[:1], [part.sweep.conditions[0]], max_new_tokens=2,
                                      progress=False)).table()


def test_mean_ablation_scan_equals_ground_batch(toy, samples):
    values = ablation_values(toy, synthetic_samples("detect", 8), batch_size=8)
    ablation = Ablation("mean", values)
    heads = HeadSet.parse("L0H2,L1H7")
    result = head_scan(toy, samples, heads=heads, ablation=ablation, batch_size=4, max_new_tokens=MAX_NEW_TOKENS,
                       progress=False)
    table = result.table().set_index("head")
    for head in heads:
        assert table.loc[str(head), "accuracy"] == _accuracy(_ground(toy, samples, HeadSet([head]), ablation=ablation))
