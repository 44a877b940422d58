"""Runs killed mid-way resume to exactly the result of an uninterrupted run; mismatched folders are refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import tiny_vlm
from vrh_interp.evaluation.sweep import sweep
from vrh_interp.heads import HeadSet
from vrh_interp.runs import RecordLog, RunMismatchError
from vrh_interp.scoring.detect import score_heads
from vrh_interp.sources import synthetic_samples

FAMILY = "qwen2_vl"
SCRIPT = textwrap.dedent("""
    import sys, torch
    torch.set_num_threads(1)
    from vrh_interp.model import wrap
    from vrh_interp.testing.tiny import build_tiny
    from vrh_interp.sources import synthetic_samples
    from vrh_interp.scoring.detect import score_heads
    from vrh_interp.evaluation.sweep import sweep
    tiny = build_tiny("{family}")
    vlm = wrap(tiny.model, tiny.processor)
    if sys.argv[1] == "detect":
        score_heads(vlm, synthetic_samples("detect", 24), batch_size=2, max_new_tokens=3, run_dir=sys.argv[2],
                    progress=False)
    else:
        sweep(vlm, synthetic_samples("eval", 4), vlm.geometry.all_heads(), ks=(0, 1, 2), random_seeds=(0, 1),
              batch_size=2, max_new_tokens=3, run_dir=sys.argv[2], progress=False)
""").format(family=FAMILY)


def _kill_after_first_records(kind: str, run_dir: Path, records: str) -> int:
    """Start a run in a subprocess and SIGKILL it once some (not all) records are written."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, kind, str(run_dir)], env=env)
    log = run_dir / records
    deadline = time.time() + 240
    try:
        while time.time() < deadline:
            if log.exists() and log.read_text().count("\n") >= 1:
                break
            if proc.poll() is not None:
                pytest.fail(f"the {kind} run ended before it could be interrupted (exit {proc.returncode})")
            time.sleep(0.01)
        else:
            pytest.fail(f"the {kind} run wrote no records in time")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # simulate a torn last line as a kill mid-write would leave it
    with open(log, "a") as handle:
        handle.write('{"sample_id": "torn')
    return len(RecordLog(log).read())


def test_detection_killed_and_resumed_equals_uninterrupted(tmp_path):
    written = _kill_after_first_records("detect", tmp_path / "killed", "detect_records.jsonl")
    assert 0 < written < 24
    vlm = tiny_vlm(FAMILY)
    samples = synthetic_samples("detect", 24)
    resumed = score_heads(vlm, samples, batch_size=2, max_new_tokens=3, run_dir=tmp_path / "killed", progress=False)
    fresh = score_heads(vlm, samples, batch_size=2, max_new_tokens=3, run_dir=tmp_path / "fresh", progress=False)
    np.testing.assert_allclose(resumed.scores, fresh.scores, rtol=0, atol=1e-7)
    assert resumed.sample_ids == fresh.sample_ids
    assert len(RecordLog(tmp_path / "killed" / "detect_records.jsonl").read()) == 24  # nothing duplicated


def test_sweep_killed_and_resumed_equals_uninterrupted(tmp_path):
    written = _kill_after_first_records("sweep", tmp_path / "killed", "sweep_records.jsonl")
    assert 0 < written
    vlm = tiny_vlm(FAMILY)
    samples = synthetic_samples("eval", 4)
    kwargs = dict(ks=(0, 1, 2), random_seeds=(0, 1), batch_size=2, max_new_tokens=3, progress=False)
    resumed = sweep(vlm, samples, vlm.geometry.all_heads(), run_dir=tmp_path / "killed", **kwargs)
    fresh = sweep(vlm, samples, vlm.geometry.all_heads(), run_dir=tmp_path / "fresh", **kwargs)
    pd.testing.assert_frame_equal(resumed.records, fresh.records)
    pd.testing.assert_frame_equal(resumed.summary(), fresh.summary())
    assert len(resumed.records) == 4 * 7  # baseline + (top + 2 random) x 2 ks


def test_run_folder_of_another_configuration_is_refused(tmp_path):
    vlm = tiny_vlm(FAMILY)
    samples = synthetic_samples("eval", 2)
    sweep(vlm, samples, vlm.geometry.all_heads(), ks=(0, 1), random_seeds=(0,), max_new_tokens=2,
          run_dir=tmp_path, progress=False)
    with pytest.raises(RunMismatchError, match="different configuration"):
        sweep(vlm, samples, vlm.geometry.all_heads(), ks=(0, 2), random_seeds=(0,), max_new_tokens=2,
              run_dir=tmp_path, progress=False)


def test_bad_sample_sets_are_refused():
    vlm = tiny_vlm(FAMILY)
    samples = synthetic_samples("eval", 2)
    with pytest.raises(ValueError, match="duplicate sample id"):
        sweep(vlm, samples + samples[:1], HeadSet(), ks=(0,), random_seeds=())
    with pytest.raises(ValueError, match="at least 1"):
        score_heads(vlm, [])
    detection = synthetic_samples("detect", 2)
    with pytest.raises(ValueError, match="disjoint"):
        sweep(vlm, detection, vlm.geometry.all_heads(), ks=(0, 1), random_seeds=(),
              detection_ids=[detection[0].sample_id])
    with pytest.raises(ValueError, match="out of range"):
        sweep(vlm, samples, vlm.geometry.all_heads(), ks=(0, 999), random_seeds=())
