"""Runs killed mid-way resume to exactly the result of an uninterrupted run; mismatched folders are refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from tests.conftest import tiny_vlm
from vrh_interp.data.datasets.errors import DatasetError
from vrh_interp.data.datasets.samples import GroundingSample
from vrh_interp.experiments.sweep import sweep, sweep_from_run
from vrh_interp.core.description.heads import HeadSet
from vrh_interp.experiments.merge import merge_runs
from vrh_interp.core.bookkeeping.runs import RecordLog, RunMismatchError
from vrh_interp.scoring.detect import score_heads
from vrh_interp.core.bookkeeping.shards import Shard
from vrh_interp.data.sources import synthetic_samples

FAMILY = "qwen2_vl"
SCRIPT = textwrap.dedent("""
    import sys, torch
    torch.set_num_threads(1)
    from vrh_interp.core.description.model import wrap
    from vrh_interp.core.description.tiny import build_tiny
    from vrh_interp.data.sources import synthetic_samples
    from vrh_interp.scoring.detect import score_heads
    from vrh_interp.experiments.sweep import sweep, sweep_from_run
    tiny = build_tiny("{family}")
    vlm = wrap(tiny.model, tiny.processor)
    if sys.argv[1] == "detect":
        score_heads(vlm, synthetic_samples("detect", 24), batch_size=2, max_new_tokens=3, run_dir=sys.argv[2],
                    progress=False)
    elif sys.argv[1] == "sweep-mean":
        from vrh_interp.evaluation.grounding import ablation_values
        values = ablation_values(vlm, synthetic_samples("detect", 4))
        sweep(vlm, synthetic_samples("eval", 4), vlm.geometry.all_heads(), ks=(0, 1, 2), random_seeds=(0, 1),
              batch_size=2, max_new_tokens=3, run_dir=sys.argv[2], progress=False, ablation="mean",
              ablation_values=values)
    else:
        sweep(vlm, synthetic_samples("eval", 4), vlm.geometry.all_heads(), ks=(0, 1, 2), random_seeds=(0, 1),
              batch_size=2, max_new_tokens=3, run_dir=sys.argv[2], progress=False)
""").format(family=FAMILY)


def _kill_after_first_records(kind: str, run_dir: Path, records: str, lines: int = 1) -> int:
    """Start a run in a subprocess and SIGKILL it once at least ``lines`` (not all) records are written."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, kind, str(run_dir)], env=env)
    log = run_dir / records
    deadline = time.time() + 240
    try:
        while time.time() < deadline:
            if log.exists() and log.read_text().count("\n") >= lines:
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
    # conditions: baseline, then per k top, random seed 0 and 1, matched seed 0 and 1 (11), 4 samples in batches
    # of 2; conditions are batched, so the first batch's 22 records arrive in one pass and the kill lands before
    # the second batch's
    written = _kill_after_first_records("sweep", tmp_path / "killed", "sweep_records.jsonl", lines=17)
    assert 17 <= written < 44
    vlm = tiny_vlm(FAMILY)
    samples = synthetic_samples("eval", 4)
    kwargs = dict(ks=(0, 1, 2), random_seeds=(0, 1), batch_size=2, max_new_tokens=3, progress=False)
    resumed = sweep(vlm, samples, vlm.geometry.all_heads(), run_dir=tmp_path / "killed", **kwargs)
    fresh = sweep(vlm, samples, vlm.geometry.all_heads(), run_dir=tmp_path / "fresh", **kwargs)
    pd.testing.assert_frame_equal(resumed.records, fresh.records)
    pd.testing.assert_frame_equal(resumed.summary(), fresh.summary())
    assert len(resumed.records) == 4 * 11  # baseline + (top + 2 random + 2 layer-matched) x 2 ks
    assert {"matched:k=1:seed=0", "matched:k=2:seed=1", "matched:k=2:seed=all"} <= set(resumed.summary()["key"])
    assert len(RecordLog(tmp_path / "killed" / "sweep_records.jsonl").read()) == 44  # nothing duplicated


def test_mean_ablation_sweep_killed_and_resumed_equals_uninterrupted(tmp_path):
    """The same for mean ablation: the resumed run masks with the same reference values (their fingerprint is in
    the manifest), and resuming with other values is refused."""
    from vrh_interp.evaluation.grounding import ablation_values

    written = _kill_after_first_records("sweep-mean", tmp_path / "killed", "sweep_records.jsonl", lines=9)
    assert 9 <= written < 44
    vlm = tiny_vlm(FAMILY)
    samples = synthetic_samples("eval", 4)
    values = ablation_values(vlm, synthetic_samples("detect", 4))
    kwargs = dict(ks=(0, 1, 2), random_seeds=(0, 1), batch_size=2, max_new_tokens=3, progress=False, ablation="mean")
    resumed = sweep(vlm, samples, vlm.geometry.all_heads(), run_dir=tmp_path / "killed", ablation_values=values,
                    **kwargs)
    fresh = sweep(vlm, samples, vlm.geometry.all_heads(), run_dir=tmp_path / "fresh", ablation_values=values,
                  **kwargs)
    pd.testing.assert_frame_equal(resumed.records, fresh.records)
    pd.testing.assert_frame_equal(resumed.summary(), fresh.summary())
    assert {"baseline:k=0", "top:k=2:ablation=mean", "matched:k=1:seed=all:ablation=mean"} <= \
        set(resumed.summary()["key"])
    assert len(RecordLog(tmp_path / "killed" / "sweep_records.jsonl").read()) == 44
    other = ablation_values(vlm, synthetic_samples("detect", 3))
    with pytest.raises(RunMismatchError, match="different configuration"):
        sweep(vlm, samples, vlm.geometry.all_heads(), run_dir=tmp_path / "killed", ablation_values=other, **kwargs)
    with pytest.raises(ValueError, match="mean ablation needs reference outputs: pass ablation_values="):
        sweep(vlm, samples, vlm.geometry.all_heads(), **kwargs)


def test_run_folder_of_another_configuration_is_refused(tmp_path):
    vlm = tiny_vlm(FAMILY)
    samples = synthetic_samples("eval", 2)
    sweep(vlm, samples, vlm.geometry.all_heads(), ks=(0, 1), random_seeds=(0,), max_new_tokens=2,
          run_dir=tmp_path, progress=False)
    with pytest.raises(RunMismatchError, match="different configuration"):
        sweep(vlm, samples, vlm.geometry.all_heads(), ks=(0, 2), random_seeds=(0,), max_new_tokens=2,
              run_dir=tmp_path, progress=False)



def test_resuming_with_other_weights_of_the_same_model_is_refused(tmp_path):
    """A folder made with one set of weights refuses the same model id with others (a checkpoint retrained in place,
    a toy of another version): their records would otherwise mix silently. A manifest written before the weights
    fingerprint existed still resumes."""
    import json

    import torch

    from vrh_interp.core.description.model import wrap
    from vrh_interp.core.bookkeeping.provenance import weights_fingerprint
    from vrh_interp.core.description.tiny import build_tiny

    vlm = tiny_vlm(FAMILY)
    samples = synthetic_samples("eval", 2)
    kwargs = dict(ks=(0, 1), random_seeds=(0,), max_new_tokens=2, progress=False)
    sweep(vlm, samples, vlm.geometry.all_heads(), run_dir=tmp_path / "run", **kwargs)
    tiny = build_tiny(FAMILY, seed=0)  # the same weights, built again (not the shared fixture: edited below): resumes
    again = wrap(tiny.model, tiny.processor)
    assert weights_fingerprint(again.hf_model) == weights_fingerprint(vlm.hf_model)
    sweep(again, samples, again.geometry.all_heads(), run_dir=tmp_path / "run", **kwargs)
    with torch.no_grad():
        next(again.hf_model.parameters()).mul_(1.5)
    assert weights_fingerprint(again.hf_model) != weights_fingerprint(vlm.hf_model)
    with pytest.raises(RunMismatchError, match="the same model with other weights"):
        sweep(again, samples, again.geometry.all_heads(), run_dir=tmp_path / "run", **kwargs)
    manifest = tmp_path / "run" / "manifest.json"
    older = json.loads(manifest.read_text())
    del older["model"]["weights"]
    manifest.write_text(json.dumps(older))
    sweep(vlm, samples, vlm.geometry.all_heads(), run_dir=tmp_path / "run", **kwargs)


def test_weights_fingerprint_reads_every_parameter_and_is_none_for_weights_not_in_memory():
    import torch

    from vrh_interp.core.bookkeeping.provenance import FINGERPRINT_VALUES, weights_fingerprint

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 2))
    base = weights_fingerprint(model)
    assert model[0].weight.numel() > FINGERPRINT_VALUES  # sampled
    for parameter in model.parameters():  # the last value of each parameter is always read
        kept = parameter.detach().view(-1)[-1].item()
        with torch.no_grad():
            parameter.view(-1)[-1] = kept + 1.0
        assert weights_fingerprint(model) != base
        with torch.no_grad():
            parameter.view(-1)[-1] = kept
        assert weights_fingerprint(model) == base
    assert weights_fingerprint(model.to(torch.float16)) != base  # the dtype is part of it
    with torch.device("meta"):
        assert weights_fingerprint(torch.nn.Linear(4, 4)) is None

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


@dataclass
class FlakyStorage:
    """An ``ImageSource`` on storage that drops out once, on read number ``fail_on`` (a network mount or object
    store going away mid-run), and serves the image again afterwards: a real data-source failure raised through
    the real pipeline (no model is replaced)."""

    image: Image.Image
    fail_on: int
    reads: int = field(default=0)

    def open(self) -> Image.Image:
        self.reads += 1
        if self.reads == self.fail_on:
            raise DatasetError("remote storage", "connection reset while reading the image")
        return self.image.copy()

    def size(self, *, full_decode: bool = False) -> tuple[int, int]:
        return self.image.size


def _on_flaky_storage(samples, flaky_id: str, fail_on: int) -> list[GroundingSample]:
    return [GroundingSample(s.sample_id, s.expression, s.box, s.image.size,
                            FlakyStorage(s.image, fail_on if s.sample_id == flaky_id else 0)) for s in samples]


SWEEP = dict(ks=(0, 1, 2), random_seeds=(0, 1), batch_size=2, max_new_tokens=3, progress=False)


def test_remote_sweep_failing_mid_way_resumes_without_losing_or_repeating_answers(tmp_path):
    """A remote-mode sweep (requests serialised as for NDIF, conditions batched 2 per generation) fails in its
    second batch of samples; rerunning it resumes."""
    vlm = tiny_vlm(FAMILY)
    clean = synthetic_samples("eval", 5)
    # read 1 is check_samples, read 2 encodes the second batch (samples 2 and 3; each batch is encoded once and
    # replicated across the conditions of every pass)
    samples = _on_flaky_storage(clean, clean[3].sample_id, fail_on=2)
    with pytest.raises(DatasetError, match="connection reset"):
        sweep(vlm.on(remote="local"), samples, vlm.geometry.all_heads(), run_dir=tmp_path / "run", max_batch_rows=4,
              **SWEEP)
    written = RecordLog(tmp_path / "run" / "sweep_records.jsonl").read()
    # every condition of the first batch (6 passes of 2 conditions); the failing batch left nothing
    assert len(written) == 11 * 2 and {r["sample_id"] for r in written} == {s.sample_id for s in clean[:2]}
    resumed = sweep(vlm.on(remote="local"), samples, vlm.geometry.all_heads(), run_dir=tmp_path / "run",
                    max_batch_rows=4, **SWEEP)
    fresh = sweep(vlm, clean, vlm.geometry.all_heads(), max_batch_rows=2, **SWEEP)  # local, one condition a pass
    pd.testing.assert_frame_equal(resumed.records, fresh.records)
    pd.testing.assert_frame_equal(resumed.summary(), fresh.summary())
    log = RecordLog(tmp_path / "run" / "sweep_records.jsonl").read()
    assert len(log) == 5 * 11 and len({(r["sample_id"], r["condition"]) for r in log}) == 5 * 11


def test_interrupted_shard_resumes_and_merges_into_the_unsharded_run(tmp_path):
    vlm = tiny_vlm(FAMILY)
    clean = synthetic_samples("eval", 7)  # batches [0, 1] [2, 3] | [4, 5] [6]: shard 1/2 holds the last two
    whole = sweep(vlm, clean, vlm.geometry.all_heads(), run_dir=tmp_path / "whole", **SWEEP)
    samples = _on_flaky_storage(clean, clean[6].sample_id, fail_on=2)  # fails encoding shard 1's second batch
    with pytest.raises(DatasetError):
        sweep(vlm, samples, vlm.geometry.all_heads(), run_dir=tmp_path / "s1", shard=Shard(1, 2), **SWEEP)
    assert len(RecordLog(tmp_path / "s1" / "sweep_records.jsonl").read()) == 11 * 2  # 11 conditions of 2 samples
    sweep(vlm, samples, vlm.geometry.all_heads(), run_dir=tmp_path / "s1", shard=Shard(1, 2), **SWEEP)
    sweep(vlm, clean, vlm.geometry.all_heads(), run_dir=tmp_path / "s0", shard=Shard(0, 2), **SWEEP)
    merge_runs(tmp_path / "merged", [tmp_path / "s0", tmp_path / "s1"])
    assert (tmp_path / "merged" / "sweep_records.jsonl").read_bytes() == \
        (tmp_path / "whole" / "sweep_records.jsonl").read_bytes()
    pd.testing.assert_frame_equal(sweep_from_run(tmp_path / "merged").records, whole.records)
