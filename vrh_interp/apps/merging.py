"""``vrh merge`` of each experiment (its declaration's ``merge``, ``experiments.declared.Experiment``): join the shard
folders into ``out``, then write and print what the unsharded command writes and prints, so that a merged folder
reads like an unsharded one. ``options`` are ``vrh merge``'s (``--preset``, ``--top``, ``--iou``, ``--json``). An
experiment declared ``mergeable`` without a ``merge`` of its own gets ``records``: its record logs joined and counted.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

from vrh_interp.apps import show
from vrh_interp.core.bookkeeping.runs import read_manifest, write_atomic
from vrh_interp.experiments.merge import merge_runs


def records(out: Path, shards: Sequence[Path], options: argparse.Namespace) -> int:
    """The record logs joined (``experiments.merge.merge_runs``); their count printed."""
    merged = merge_runs(out, shards)
    facts = {"out": str(out), "kind": merged.kind, "shards": merged.shards, "records": merged.records}
    print(json.dumps(facts) if options.json else f"merged {merged.shards} shards of a {merged.kind} run: "
          f"{merged.records} records in {out}")
    return 0


def detect(out: Path, shards: Sequence[Path], options: argparse.Namespace) -> int:
    """``vrh detect``'s shards: the scores file of ``--preset`` and the top ``--top`` heads."""
    from vrh_interp.scoring.detect import scores_from_run

    merge_runs(out, shards)
    scores = scores_from_run(out, options.preset)
    show.scores(scores, scores.save(out / f"scores-{options.preset}.json"), options.preset, options.top, options.json)
    return 0


def sweep(out: Path, shards: Sequence[Path], options: argparse.Namespace) -> int:
    """``vrh sweep``'s shards: ``sweep_summary.csv`` (correct at IoU ``--iou``), the table and the verdicts."""
    from vrh_interp.experiments.sweep import sweep_from_run

    merge_runs(out, shards)
    result = sweep_from_run(out, iou_threshold=options.iou)
    write_atomic(out / "sweep_summary.csv", result.summary().to_csv(index=False))
    show.sweep_table(result, options.json, out)
    return 0


def vqa_sweep(out: Path, shards: Sequence[Path], options: argparse.Namespace) -> int:
    """``vrh vqa-sweep``'s shards: ``vqa_summary.csv`` and the accuracy table."""
    from vrh_interp.experiments.vqa_sweep import vqa_sweep_from_run

    merge_runs(out, shards)
    result = vqa_sweep_from_run(out)
    write_atomic(out / "vqa_summary.csv", result.summary().to_csv(index=False))
    show.vqa_table(result, options.json, out)
    return 0


def design_space(out: Path, shards: Sequence[Path], options: argparse.Namespace) -> int:
    """``vrh design-space``'s shards (``experiments.merge.merge_design_space_runs``): ``design_space.csv``."""
    from vrh_interp.experiments.merge import merge_design_space_runs

    table = merge_design_space_runs(out, shards)
    write_atomic(out / "design_space.csv", table.to_csv(index=False))
    show.design_table(table, int(table["k"].iloc[0]), options.json)
    return 0


def reproduce(out: Path, shards: Sequence[Path], options: argparse.Namespace) -> int:
    """``vrh reproduce``'s shards (``experiments.reproduce.merge_reproduce_runs``): its tables and verdicts."""
    from vrh_interp.experiments.reproduce import merge_reproduce_runs

    result = merge_reproduce_runs(out, shards)
    show.reproduce_tables(result, read_manifest(out / "manifest.json")["data"], options.json)
    return 0
