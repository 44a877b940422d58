"""Sharded runs merge into exactly the unsharded run; merging refuses shards that do not form one run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import tiny_vlm
from vrh_interp.apps.cli import main
from vrh_interp.experiments.sweep import sweep, sweep_from_run
from vrh_interp.experiments.merge import ShardMergeError, merge_runs
from vrh_interp.core.bookkeeping.runs import RunRecordError
from vrh_interp.scoring.detect import collect_detection_stats, score_heads, scores_from_run
from vrh_interp.scoring.scores import HeadScores
from vrh_interp.core.bookkeeping.shards import Shard
from vrh_interp.data.sources import synthetic_samples

FAMILY = "qwen2_vl"
SWEEP = dict(ks=(0, 1, 2), random_seeds=(0, 1), batch_size=2, max_new_tokens=3, progress=False)


def folder_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_shards_take_whole_batches_and_cover_every_sample_once():
    assert Shard.parse("1/3") == Shard(1, 3) and str(Shard(1, 3)) == "1/3"
    # 9 samples in batches of 2 = 5 batches; 3 shards take 2, 2 and 1 batches
    assert [list(Shard(i, 3).positions(9, 2)) for i in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    assert [list(Shard(i, 3).positions(2, 4)) for i in range(3)] == [[0, 1], [], []]
    for total, batch, count in [(1, 1, 1), (17, 3, 4), (100, 8, 7), (5, 10, 2)]:
        positions = [p for i in range(count) for p in Shard(i, count).positions(total, batch)]
        assert positions == list(range(total))
        starts = [Shard(i, count).positions(total, batch).start for i in range(count)]
        assert all(s % batch == 0 or s == total for s in starts)
    assert Shard(1, 2).select("abcde", 2) == ["e"] and Shard(1, 2).select("abcde", 1) == ["d", "e"]
    for bad, message in [("3/3", "0-based, 0 .. 2"), ("1-3", "INDEX/COUNT"), ("0/0", ">= 1"), ("-1/2", "INDEX/COUNT")]:
        with pytest.raises(ValueError, match=message):
            Shard.parse(bad)


def test_sharded_detection_merges_into_the_unsharded_folder(tmp_path):
    vlm = tiny_vlm(FAMILY)
    samples = synthetic_samples("detect", 9)
    kwargs = dict(batch_size=2, max_new_tokens=3, dataset="synthetic:detect:9", progress=False)
    whole = score_heads(vlm, samples, run_dir=tmp_path / "whole", **kwargs)
    parts = []
    for i in range(3):
        stats = collect_detection_stats(vlm, samples, run_dir=tmp_path / f"shard{i}", shard=Shard(i, 3), **kwargs)
        parts.append([s.sample_id for s in stats])
    assert parts == [[s.sample_id for s in samples[a:b]] for a, b in [(0, 4), (4, 8), (8, 9)]]
    merged = merge_runs(tmp_path / "merged", [tmp_path / f"shard{i}" for i in (2, 0, 1)])  # any order
    assert (merged.kind, merged.shards, merged.records) == ("detect", 3, 9)
    # records, statistics files and manifest: byte for byte what the unsharded run wrote
    assert folder_bytes(tmp_path / "merged") == folder_bytes(tmp_path / "whole")
    scores = scores_from_run(tmp_path / "merged")
    assert np.array_equal(scores.scores, whole.scores) and np.array_equal(scores.per_position, whole.per_position)
    assert scores.sample_ids == whole.sample_ids and scores.ranking() == whole.ranking()
    assert scores.provenance["sample_ids"] == [s.sample_id for s in samples]
    with pytest.raises(ValueError, match="shard 1/3 only: merge all shards first"):
        scores_from_run(tmp_path / "shard1")


@pytest.fixture(scope="module")
def sweep_runs(tmp_path_factory) -> Path:
    """An unsharded sweep (``whole``) and the same sweep in three shards (``shard0`` .. ``shard2``)."""
    root = tmp_path_factory.mktemp("sweep")
    vlm = tiny_vlm(FAMILY)
    samples = synthetic_samples("eval", 5)
    sweep(vlm, samples, vlm.geometry.all_heads(), run_dir=root / "whole", **SWEEP)
    for i in range(3):
        part = sweep(vlm, samples, vlm.geometry.all_heads(), run_dir=root / f"shard{i}", shard=Shard(i, 3), **SWEEP)
        # baseline + (top + 2 random + 2 layer-matched) x 2 ks
        assert len(part.records) == 11 * len(Shard(i, 3).select(samples, 2))
    return root


def test_sharded_sweep_merges_into_the_unsharded_result(sweep_runs, tmp_path):
    merged = merge_runs(tmp_path / "merged", [sweep_runs / f"shard{i}" for i in range(3)])
    assert (merged.kind, merged.records) == ("sweep", 5 * 11)
    assert folder_bytes(tmp_path / "merged") == folder_bytes(sweep_runs / "whole")
    vlm = tiny_vlm(FAMILY)
    whole = sweep(vlm, synthetic_samples("eval", 5), vlm.geometry.all_heads(), run_dir=sweep_runs / "whole", **SWEEP)
    result = sweep_from_run(tmp_path / "merged")
    pd.testing.assert_frame_equal(result.records, whole.records)
    pd.testing.assert_frame_equal(result.summary(), whole.summary())
    assert [c.key for c in result.conditions] == [c.key for c in whole.conditions]
    assert [c.heads for c in result.conditions] == [c.heads for c in whole.conditions]


def _copy_shards(sweep_runs: Path, tmp_path: Path) -> list[Path]:
    copies = []
    for i in range(3):
        shutil.copytree(sweep_runs / f"shard{i}", tmp_path / f"shard{i}")
        copies.append(tmp_path / f"shard{i}")
    return copies


def test_merge_refuses_missing_repeated_and_foreign_shards(sweep_runs, tmp_path):
    shards = [sweep_runs / f"shard{i}" for i in range(3)]
    with pytest.raises(ShardMergeError, match=r"shard 1/3 missing: run the same command with --shard 1/3"):
        merge_runs(tmp_path / "a", [shards[0], shards[2]])
    with pytest.raises(ShardMergeError, match=r"shard 2/3 is given 2 times"):
        merge_runs(tmp_path / "b", [*shards, shards[2]])
    with pytest.raises(ShardMergeError, match="not a shard folder"):
        merge_runs(tmp_path / "c", [*shards, sweep_runs / "whole"])
    vlm = tiny_vlm(FAMILY)
    other = tmp_path / "other-config"
    sweep(vlm, synthetic_samples("eval", 5), vlm.geometry.all_heads(), run_dir=other, shard=Shard(1, 3),
          **{**SWEEP, "max_new_tokens": 2})
    with pytest.raises(ShardMergeError, match="different configurations .*max_new_tokens"):
        merge_runs(tmp_path / "d", [shards[0], other, shards[2]])
    regrouped = tmp_path / "other-batch"
    sweep(vlm, synthetic_samples("eval", 5), vlm.geometry.all_heads(), run_dir=regrouped, shard=Shard(1, 3),
          **{**SWEEP, "batch_size": 1})
    with pytest.raises(ShardMergeError, match="same shard count and --batch-size"):
        merge_runs(tmp_path / "e", [shards[0], regrouped, shards[2]])
    assert not any((tmp_path / name).exists() for name in "abcde")  # nothing written on refusal


def test_merge_refuses_incomplete_shards_and_resumed_shards_merge(sweep_runs, tmp_path):
    shards = _copy_shards(sweep_runs, tmp_path)
    log = shards[1] / "sweep_records.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:-3]))  # as if shard 1 was interrupted
    with pytest.raises(ShardMergeError, match=r"shard 1/3 .* is incomplete: 3 of 22 units are missing.*--shard 1/3"):
        merge_runs(tmp_path / "merged", shards)
    log.write_text("".join(lines + [lines[0].replace('"iou": ', '"iou": 0.5, "x": ', 1)]))  # a unit twice
    with pytest.raises(RunRecordError, match=r"line 23: a second, different record of .*first is on line 1"):
        merge_runs(tmp_path / "merged", shards)
    log.write_text("".join(lines[:-3]))
    vlm = tiny_vlm(FAMILY)
    sweep(vlm, synthetic_samples("eval", 5), vlm.geometry.all_heads(), run_dir=shards[1], shard=Shard(1, 3),
          **SWEEP)  # resume the shard
    merge_runs(tmp_path / "merged", shards)
    assert folder_bytes(tmp_path / "merged") == folder_bytes(sweep_runs / "whole")
    with pytest.raises(ShardMergeError, match="already exists"):
        merge_runs(tmp_path / "merged", shards)


def _run(capsys, *argv: str) -> object:
    assert main(list(argv)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_cli_sharded_detect_sweep_and_design_space_merge_like_unsharded(tmp_path, capsys):
    common = ["--model", f"tiny:{FAMILY}", "--batch-size", "2", "--max-new-tokens", "3", "--json"]
    detect = [*common, "--data", "synthetic:detect:5", "--top", "4"]
    whole = _run(capsys, "detect", *detect, "--out", str(tmp_path / "detect"))
    for i in range(2):
        done = _run(capsys, "detect", *detect, "--out", str(tmp_path / f"detect-{i}"), "--shard", f"{i}/2")
        assert done["done"] == [4, 1][i] and not list((tmp_path / f"detect-{i}").glob("scores-*.json"))
    merged = _run(capsys, "merge", str(tmp_path / "detect-merged"), str(tmp_path / "detect-0"),
                  str(tmp_path / "detect-1"), "--top", "4", "--json")
    assert merged["top"] == whole["top"]
    got, want = HeadScores.load(merged["scores_file"]), HeadScores.load(whole["scores_file"])
    assert np.array_equal(got.scores, want.scores) and got.sample_ids == want.sample_ids

    sweep_args = [*common, "--data", "synthetic:eval:3", "--scores", whole["scores_file"], "--ks", "0,1",
                  "--seeds", "0"]
    summary = _run(capsys, "sweep", *sweep_args, "--out", str(tmp_path / "sweep"))
    for i in range(2):
        _run(capsys, "sweep", *sweep_args, "--out", str(tmp_path / f"sweep-{i}"), "--shard", f"{i}/2")
    assert _run(capsys, "merge", str(tmp_path / "sweep-merged"), str(tmp_path / "sweep-0"),
                str(tmp_path / "sweep-1"), "--json") == summary
    assert (tmp_path / "sweep-merged" / "sweep_summary.csv").read_bytes() == \
        (tmp_path / "sweep" / "sweep_summary.csv").read_bytes()

    design = [*common, "--data", "synthetic:detect:5", "--eval-data", "synthetic:eval:3", "--k", "1",
              "--random-sets", "2"]
    table = _run(capsys, "design-space", *design, "--out", str(tmp_path / "design"))
    for i in range(2):  # shard 0 collects its own detection statistics, shard 1 starts from the merged detect run
        if i == 1:
            shutil.copytree(tmp_path / "detect-merged", tmp_path / "design-1" / "detect")
        _run(capsys, "design-space", *design, "--out", str(tmp_path / f"design-{i}"), "--shard", f"{i}/2")
    assert (tmp_path / "design-1" / "detect" / "detect_records.jsonl").read_bytes() == \
        (tmp_path / "detect-merged" / "detect_records.jsonl").read_bytes()  # resumed: nothing collected again
    assert _run(capsys, "merge", str(tmp_path / "design-merged"), str(tmp_path / "design-0"),
                str(tmp_path / "design-1"), "--json") == table
    assert (tmp_path / "design-merged" / "design_space.csv").read_bytes() == \
        (tmp_path / "design" / "design_space.csv").read_bytes()
    assert main(["merge", str(tmp_path / "bad"), str(tmp_path / "sweep-0")]) == 2
    assert "shard 1/2 missing" in capsys.readouterr().err


def test_cli_sharded_vqa_sweep_merges_into_the_unsharded_summary_and_table(tmp_path, capsys):
    """`vrh merge` of `vrh vqa-sweep --shard` folders writes and prints what the unsharded command does (it used to
    join the records only: no vqa_summary.csv, a record count printed)."""
    common = ["--model", f"tiny:{FAMILY}", "--batch-size", "2", "--max-new-tokens", "3"]
    scores = _run(capsys, "detect", *common, "--data", "synthetic:detect:4", "--json",
                  "--out", str(tmp_path / "detect"))["scores_file"]
    vqa = [*common, "--vqa", "synthetic:eval:3", "--scores", scores, "--vqa-k", "2", "--random-sets", "2"]
    assert main(["vqa-sweep", *vqa, "--out", str(tmp_path / "whole")]) == 0
    table = capsys.readouterr().out
    assert "VQA accuracy (%), top-2 VRHs" in table
    whole = _run(capsys, "vqa-sweep", *vqa, "--json", "--out", str(tmp_path / "whole-json"))
    for i in range(2):
        _run(capsys, "vqa-sweep", *vqa, "--json", "--out", str(tmp_path / f"vqa-{i}"), "--shard", f"{i}/2")
    assert _run(capsys, "merge", str(tmp_path / "merged"), str(tmp_path / "vqa-0"), str(tmp_path / "vqa-1"),
                "--json") == whole
    for name in ("vqa_records.jsonl", "manifest.json", "vqa_summary.csv"):
        assert (tmp_path / "merged" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert main(["merge", str(tmp_path / "merged-text"), str(tmp_path / "vqa-0"), str(tmp_path / "vqa-1")]) == 0
    assert capsys.readouterr().out.replace("merged-text", "whole") == table
