"""run_reproduce end to end on the tiny random Qwen2-VL: files, protocol, resume (accuracy is ~0 by design)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Iterator

import pandas as pd
import pytest

from tests.datasets import fixtures
from vrh_interp.data.datasets.splits import detection_split
from vrh_interp.experiments.reproduce import capped_ks, run_reproduce
from vrh_interp.core.bookkeeping.runs import RunMismatchError
from vrh_interp.core.description.heads import Head
from vrh_interp.data.sources import load_data
from vrh_interp.evaluation.census import Census
from vrh_interp.scoring.scores import HeadScores


def test_capped_ks_leave_room_for_random_controls() -> None:
    assert capped_ks((0, 1, 3, 5, 10, 20), 8) == [0, 1, 3]
    assert capped_ks((1, 3, 5, 10, 20), 784) == [0, 1, 3, 5, 10, 20]
    assert capped_ks((0, 1, 3, 5), 8, usable=2) == [0, 1]  # e.g. the top 3 in one layer of 4 heads


class ModelRan(AssertionError):
    """A forward of the guarded model (``guard_model_runs``)."""


@pytest.fixture
def guard_model_runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every model that ``run_reproduce`` loads (through ``specs.load_spec``) raises ``ModelRan`` on any forward.

    The hook sits on the loaded ``hf_model`` itself, not on a pipeline function, so it holds whatever path the
    pipelines take to the model (nnsight trace or generate, prefill or decode, the shared-prefix cache);
    ``test_the_resume_guard_fires_on_work_left_to_do`` shows it fires at each of the run's stages."""
    from vrh_interp import specs

    real, handles = specs.load_spec, []

    def refuse(*args: object) -> None:
        raise ModelRan("a resumed run must not run the model again")

    def guarded(*args: object, **kwargs: object) -> object:
        vlm = real(*args, **kwargs)
        handles.append(vlm.hf_model.register_forward_pre_hook(refuse))
        return vlm

    monkeypatch.setattr(specs, "load_spec", guarded)
    yield
    for handle in handles:  # a loader may cache models: leave none guarded for other tests
        handle.remove()
    assert handles, "run_reproduce no longer loads its model through specs.load_spec: the guard guards nothing"


def _reproduce_inputs(tmp_path: Path, cv_rows: int = 2) -> tuple[str, list[str]]:
    fixtures.write_lmms_refcoco(tmp_path / "refcoco", fixtures.lmms_rows(14))
    fixtures.write_cvbench(tmp_path / "cv", [{"idx": i, "choices": ["2", "3"], "answer": "(B)"}
                                             for i in range(cv_rows)])
    fixtures.write_countbench(tmp_path / "count", [2, 5])
    return f"lmms-refcoco:{tmp_path / 'refcoco'}", [f"cvbench:{tmp_path / 'cv'}", f"countbench:{tmp_path / 'count'}"]


def test_reproduce_end_to_end_and_resume(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    data, vqa = _reproduce_inputs(tmp_path)
    out = tmp_path / "run"
    arguments = dict(detect_count=6, batch_size=8, max_new_tokens=12, progress=False)
    result = run_reproduce("tiny:qwen2_vl", data, vqa, out, **arguments)

    assert result.ks == [0, 1, 3] and result.vqa_k == 3  # 8 heads: k <= 4 leaves room for k random heads
    for name in ("manifest.json", "split.json", "scores-vrh.json", "census.csv", "detect/detect_records.jsonl",
                 "sweep/sweep_records.jsonl", "sweep_summary.csv", "failure_split.csv", "vqa/vqa_records.jsonl",
                 "vqa_summary.csv", "vqa_table.csv", "reproduce.json"):
        assert (out / name).is_file(), name
    split = json.loads((out / "split.json").read_text())
    expected = detection_split(load_data(data), 6, seed=0)
    assert split["detection_ids"] == [s.sample_id for s in expected.detection]
    assert len(split["evaluation_ids"]) == 8 and not set(split["detection_ids"]) & set(split["evaluation_ids"])
    # the steps are the declared experiments' runs (their own files too), on the two parts of the data's split
    for name in ("detect/scores-vrh.json", "sweep/sweep_summary.csv", "vqa/vqa_summary.csv"):
        assert (out / name).is_file(), name
    detected = json.loads((out / "detect" / "manifest.json").read_text())
    assert detected["dataset"] == data and detected["sample_ids"] == split["detection_ids"]  # as earlier versions
    assert json.loads((out / "sweep" / "manifest.json").read_text())["sample_ids"] == split["evaluation_ids"]

    summary = pd.read_csv(out / "sweep_summary.csv")
    # baseline; per k: top, per control kind (random, matched, live) 3 sets + distribution
    assert len(summary) == 1 + 2 * (1 + 3 * (3 + 1))
    # the live-head sets: drawn only from the census's live heads outside the top 3
    pool = Census.load(out / "census.csv", 8)
    top = set(HeadScores.load(out / "scores-vrh.json").top(3))
    conditions = json.loads((out / "sweep" / "manifest.json").read_text())["conditions"]
    live_sets = [{Head.parse(h) for h in heads} for key, heads in conditions.items() if key.startswith("live:")]
    assert len(live_sets) == 6  # 3 seeds x k = 1, 3
    assert all(drawn <= set(pool.live) and not drawn & top for drawn in live_sets)
    assert set(summary[summary["seed"].astype(str) != "all"]["n"]) == {8}
    assert set(summary[summary["seed"].astype(str) == "all"]["n"]) == {24}
    failures = result.failure_split
    assert (failures[["correct", "mislocation", "parse_failure"]].sum(axis=1) == failures["n"]).all()
    assert list(result.vqa_table.index) == ["Baseline (k=0)", "Random (k=3)", "Layer-matched (k=3)", "VRH (k=3)"]
    assert set(result.vqa_summary["benchmark"]) == {"cvbench", "countbench"}
    report = json.loads((out / "reproduce.json").read_text())
    assert report["used_ks"] == [0, 1, 3] and len(report["top_heads"]) == 3 and report["total_heads"] == 8
    # the verdicts are the claims rules' (one row per k > 0): 8 items cannot decide anything
    claims = pd.read_csv(out / "claims.csv")
    assert claims["id"].tolist() == ["causal:k=1", "causal:k=3"] and set(claims["verdict"]) == {"inconclusive"}
    assert "claims.csv" in report["tables"]

    bare = run_reproduce("tiny:qwen2_vl", data, [], tmp_path / "bare", live=False, ks=(0, 1), **arguments)
    assert "live" not in set(bare.sweep_summary["condition"]) and not (tmp_path / "bare" / "census.csv").exists()

    for stage in _STAGE_LOGS:  # copies left with one stage unfinished, for the firing check below
        shutil.copytree(out, tmp_path / f"unfinished-{stage}")
        (tmp_path / f"unfinished-{stage}" / _STAGE_LOGS[stage]).unlink()

    request.getfixturevalue("guard_model_runs")
    resumed = run_reproduce("tiny:qwen2_vl", data, vqa, out, **arguments)
    pd.testing.assert_frame_equal(resumed.sweep_summary, result.sweep_summary)
    pd.testing.assert_frame_equal(resumed.vqa_table, result.vqa_table)
    with pytest.raises(RunMismatchError, match="split_seed"):
        run_reproduce("tiny:qwen2_vl", data, vqa, out, split_seed=1, **arguments)
    with pytest.raises(RunMismatchError, match="live"):
        run_reproduce("tiny:qwen2_vl", data, vqa, out, live=False, **arguments)

    # the guard fires: a fresh run, and a run left with any one stage's records to compute, run the model
    with pytest.raises(ModelRan):
        run_reproduce("tiny:qwen2_vl", data, vqa, tmp_path / "fresh", **arguments)
    for stage in _STAGE_LOGS:
        with pytest.raises(ModelRan):
            run_reproduce("tiny:qwen2_vl", data, vqa, tmp_path / f"unfinished-{stage}", **arguments)


_STAGE_LOGS = {"detect": "detect/detect_records.jsonl", "sweep": "sweep/sweep_records.jsonl",
               "vqa": "vqa/vqa_records.jsonl"}


def _folder_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_sharded_reproduce_merges_into_the_unsharded_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Three shards (the last one with no samples at all), merged by `vrh merge`: the unsharded run's tables."""
    from vrh_interp.apps.cli import main
    from vrh_interp.experiments.merge import ShardMergeError
    from vrh_interp.experiments.reproduce import merge_reproduce_runs
    from vrh_interp.core.bookkeeping.shards import Shard

    data, vqa = _reproduce_inputs(tmp_path, cv_rows=3)
    arguments = dict(detect_count=6, batch_size=2, max_new_tokens=6, random_seeds=(0, 1), progress=False)
    whole = run_reproduce("tiny:qwen2_vl", data, vqa, tmp_path / "whole", **arguments)
    for i in range(3):  # 8 evaluation samples in 4 batches of 2: shards take 2, 2 and 0 batches
        part = run_reproduce("tiny:qwen2_vl", data, vqa, tmp_path / f"shard{i}", shard=Shard(i, 3), **arguments)
        assert set(part.failure_split[part.failure_split["key"] == "baseline:k=0"]["n"]) == {[4, 4, 0][i]}
        assert not (tmp_path / f"shard{i}" / "sweep_summary.csv").exists()
    with pytest.raises(ShardMergeError, match="shard 2/3 missing"):
        merge_reproduce_runs(tmp_path / "bad", [tmp_path / "shard0", tmp_path / "shard1"])

    assert main(["merge", str(tmp_path / "merged"), *(str(tmp_path / f"shard{i}") for i in range(3)), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["ks"] == whole.ks and printed["vqa_k"] == whole.vqa_k
    merged, unsharded = _folder_bytes(tmp_path / "merged"), _folder_bytes(tmp_path / "whole")
    assert set(merged) == set(unsharded)
    differing = {name for name in merged if merged[name] != unsharded[name]}
    assert differing <= {"reproduce.json", "scores-vrh.json", "detect/scores-vrh.json"}  # run and creation times
    report, reference = (json.loads((tmp_path / d / "reproduce.json").read_text()) for d in ("merged", "whole"))
    assert report.pop("seconds") is None and reference.pop("seconds") > 0 and report == reference
    for name in ("scores-vrh.json", "detect/scores-vrh.json"):
        scores, reference = (json.loads((tmp_path / d / name).read_text()) for d in ("merged", "whole"))
        scores["provenance"].pop("created"), reference["provenance"].pop("created")
        assert scores == reference


def test_the_whole_plan_is_checked_before_any_work(tmp_path: Path) -> None:
    """Every step's spec is checked before the first runner: a fault of a step's folder, or a --data that already
    names a part of a split, is refused before the run folder, the model or the data is touched."""
    from vrh_interp.core.bookkeeping.paths import PathOptionError
    from vrh_interp.experiments.builtin_specs import ReproduceSpec
    from vrh_interp.experiments.spec import SpecError

    data, vqa = _reproduce_inputs(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.lock").touch()  # a run folder (of an interrupted run) whose detection folder is a file
    (out / "detect").write_text("not a folder")
    with pytest.raises(PathOptionError, match="detect' is a file"):
        run_reproduce("tiny:qwen2_vl", data, vqa, out, detect_count=6, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["detect", "run.lock"]  # no manifest, no split: nothing ran
    with pytest.raises(ValueError, match="vrh reproduce splits the benchmark itself"):
        run_reproduce("tiny:qwen2_vl", f"{data}:role=detection", vqa, tmp_path / "part", progress=False)
    assert not (tmp_path / "part").exists()

    spec = ReproduceSpec(model="tiny:qwen2_vl", data=data, vqa=tuple(vqa), out=str(out), detect=6, eval=5,
                         split_seed=3, seeds="0,1", vqa_limit=1, live=False)
    detection, k_sweep, vqa_test = spec.steps()
    assert detection.data == f"{data}:role=detection:detect=6:split_seed=3:eval=5" and detection.recorded_data == data
    assert k_sweep.data == f"{data}:role=evaluation:detect=6:split_seed=3:eval=5" and k_sweep.ks is None
    assert k_sweep.scores == vqa_test.scores == str(out / "scores-vrh.json") and k_sweep.census == str(out)
    assert (k_sweep.control_seeds(), vqa_test.control_seeds(), vqa_test.limit, k_sweep.live) == ([0, 1], [0, 1], 1,
                                                                                                  False)
    with pytest.raises((SpecError, ValueError), match="--scores"):
        vqa_test.check()  # the scores are the detection's: not there yet
    vqa_test.check(pending=("scores",))


def test_each_benchmark_file_is_read_once_for_all_the_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The split, the detection and the k-sweep read one grounding file, the VQA count and sweep one file per
    benchmark: inside ``run_reproduce`` each is read once (``sources.reading_once``; it was read once per step),
    outside it every load reads the file again."""
    from vrh_interp.data import sources

    data, vqa = _reproduce_inputs(tmp_path)
    reads: dict[str, int] = {}

    def counted(name: str, kinds: tuple[str, ...]) -> None:  # the loaders of ``kinds`` in table ``name``, counted
        table = dict(getattr(sources, name))

        def count(kind: str, real: Callable[..., object]) -> Callable[..., object]:
            def load(spec: sources.ParsedSpec) -> object:
                reads[kind] = reads.get(kind, 0) + 1
                return real(spec)
            return load

        monkeypatch.setattr(sources, name, MappingProxyType({**table, **{k: count(k, table[k]) for k in kinds}}))

    counted("GROUNDING_KINDS", ("lmms-refcoco",))
    counted("VQA_BENCHMARKS", ("cvbench", "countbench"))
    run_reproduce("tiny:qwen2_vl", data, vqa, tmp_path / "run", detect_count=6, batch_size=8, max_new_tokens=4,
                  progress=False)
    assert reads == {"lmms-refcoco": 1, "cvbench": 1, "countbench": 1}
    load_data(data)
    load_data(data)
    assert reads["lmms-refcoco"] == 3
