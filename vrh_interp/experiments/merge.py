"""``merge_runs``: join the folders of a sharded detection, sweep or VQA sweep into the folder an unsharded run
writes.

Each shard folder (written with ``shard=Shard(i, n)`` / ``--shard i/n``) holds the full configuration (model,
all sample ids, conditions, ...) plus a ``"shard"`` entry, and the records of its own samples only. Merging
checks, before writing anything, that the shards belong together and that nothing is lost or counted twice:

* every folder is a shard folder of the same kind, made by the same configuration (the differing keys are
  named otherwise) with the same shard count, batch size and assignment rule;
* the indices are exactly ``0 .. n-1`` (a missing or repeated shard is named, with its folders);
* every shard is complete: its records cover exactly its samples (x conditions), none missing, none foreign,
  none repeated; an incomplete shard is named, with the fix (rerun its command: it resumes).

The merged folder gets the unsharded manifest and the records in the order an uninterrupted unsharded run
appends them (detection: sample order; sweep: condition, then sample; VQA: condition, benchmark, sample),
with the detection statistics files copied under their (already global) names. It is therefore byte for byte
the folder an unsharded run writes, and everything that reads run folders works on it: ``scores_from_run``,
``sweep_from_run``, ``vqa_sweep_from_run``, and rerunning the unsharded command on it (nothing is left to
do, it just writes its tables). ``vrh_interp.apps.reproduce.merge_reproduce_runs`` merges ``vrh reproduce`` shards.

``merge_design_space_runs`` does the same for ``vrh design-space --shard`` folders: each holds the full
detection (``detect/``, identical in every shard) and its shard of the evaluation (``design_space/``).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from vrh_interp.experiments.sweep import condition_order
from vrh_interp.core.runs import RECORD_KEYS, RecordLog, RunFolder, check_not_running, read_manifest
from vrh_interp.experiments.design_space import design_space_from_run
from vrh_interp.scoring.detect import stats_from_run
from vrh_interp.core.shards import Shard

MERGEABLE_KINDS: dict[str, str] = {"detect": "detect_records", "sweep": "sweep_records",
                                   "vqa_sweep": "vqa_records"}  # kind -> record log


class ShardMergeError(ValueError):
    """Shard folders that do not form one complete run."""


@dataclass(frozen=True)
class ShardFolder:
    path: Path
    shard: Shard
    batch_size: int
    config: dict[str, Any]  # the manifest without its "shard" entry


@dataclass(frozen=True)
class MergedRun:
    path: Path
    kind: str
    shards: int
    records: int


def read_shard_folder(path: str | os.PathLike[str], kinds: Sequence[str] = tuple(MERGEABLE_KINDS)) -> ShardFolder:
    """A shard folder's manifest, split into its shard entry and the whole run's configuration."""
    path = Path(path)
    manifest = path / "manifest.json"
    if not manifest.exists():
        raise ShardMergeError(f"{path} is not a run folder (no manifest.json): pass the --out folders of the "
                              "--shard runs")
    config = read_manifest(manifest)
    entry = config.pop("shard", None)
    if entry is None:
        raise ShardMergeError(f"{path} is not a shard folder (its manifest has no 'shard' entry): pass the --out "
                              "folders of runs made with --shard i/n")
    if config.get("kind") not in kinds:
        raise ShardMergeError(f"{path} holds a {config.get('kind')!r} run; expected one of {sorted(kinds)}")
    check_not_running(path)  # a shard still being written would merge as incomplete, or change under us
    return ShardFolder(path, Shard(entry["index"], entry["count"]), entry["batch_size"], config)


@dataclass(frozen=True)
class RunOrder:
    """The order an unsharded run appends records in: condition, then benchmark (VQA), then sample. Manifests
    keep conditions and benchmarks as key-sorted mappings, so the order is read from shard 0's log (shard 0 is
    never empty: it holds the first batch of every benchmark under every condition)."""

    conditions: list[str]
    benchmarks: list[str]

    @classmethod
    def of(cls, kind: str, records: Sequence[dict[str, Any]]) -> "RunOrder":
        if kind == "detect":
            return cls([], [])
        return cls(condition_order(records), list(dict.fromkeys(r["benchmark"] for r in records if "benchmark" in r)))

    def sort_key(self, kind: str) -> Callable[[dict[str, Any]], tuple[int, ...]]:
        if kind == "detect":
            return lambda r: ()
        condition = {c: i for i, c in enumerate(self.conditions)}
        benchmark = {b: i for i, b in enumerate(self.benchmarks)}
        return lambda r: (condition[r["condition"]], benchmark.get(r.get("benchmark"), 0))


def _unit(kind: str, record: dict[str, Any]) -> tuple[str, ...]:
    return tuple(record[field] for field in RECORD_KEYS[MERGEABLE_KINDS[kind]])


def _expected_units(folder: ShardFolder, order: RunOrder) -> list[tuple[str, ...]]:
    """The shard's units in the order an unsharded run appends them."""
    kind, config, shard, size = folder.config["kind"], folder.config, folder.shard, folder.batch_size
    if kind == "detect":
        return [(i,) for i in shard.select(config["sample_ids"], size)]
    if kind == "sweep":
        ids = shard.select(config["sample_ids"], size)
        return [(i, c) for c in order.conditions for i in ids]
    return [(b, i, c) for c in order.conditions for b in order.benchmarks
            for i in shard.select(config["samples"][b], size)]


def check_shards_together(folders: Sequence[ShardFolder]) -> None:
    """Same configuration, shard count and batch size; indices exactly 0 .. n-1 (else ShardMergeError)."""
    first = folders[0]
    for other in folders[1:]:
        differing = sorted(k for k in set(first.config) | set(other.config)
                           if first.config.get(k) != other.config.get(k))
        if differing:
            raise ShardMergeError(
                f"{first.path} and {other.path} were made by different configurations (they differ in "
                f"{', '.join(differing)}): merge only shards of one command, run with the same arguments")
        if (other.shard.count, other.batch_size) != (first.shard.count, first.batch_size):
            raise ShardMergeError(
                f"{first.path} is shard {first.shard} with batch size {first.batch_size} but {other.path} is shard "
                f"{other.shard} with batch size {other.batch_size}: every shard of a run needs the same shard count "
                "and --batch-size (the batch size decides which samples a shard takes)")
    by_index: dict[int, list[Path]] = {}
    for folder in folders:
        by_index.setdefault(folder.shard.index, []).append(folder.path)
    repeated = {i: paths for i, paths in by_index.items() if len(paths) > 1}
    if repeated:
        i, paths = next(iter(sorted(repeated.items())))
        raise ShardMergeError(f"shard {i}/{first.shard.count} is given {len(paths)} times "
                              f"({', '.join(map(str, paths))}): pass each shard's folder once")
    missing = [i for i in range(first.shard.count) if i not in by_index]
    if missing:
        names = ", ".join(f"{i}/{first.shard.count}" for i in missing)
        raise ShardMergeError(f"shard {names} missing: run the same command with --shard {missing[0]}/"
                              f"{first.shard.count} (its own --out) and pass its folder too")


def _read_records(folder: ShardFolder) -> list[dict[str, Any]]:
    return RecordLog(folder.path / f"{MERGEABLE_KINDS[folder.config['kind']]}.jsonl").read()


def _shard_records(folder: ShardFolder, order: RunOrder) -> list[dict[str, Any]]:
    """The shard's records in unsharded append order, after checking they are exactly its units."""
    kind = folder.config["kind"]
    by_key = {_unit(kind, record): record for record in _read_records(folder)}  # each unit once (RecordLog.read)
    expected = _expected_units(folder, order)
    foreign = sorted(set(by_key) - set(expected))
    if foreign:
        raise ShardMergeError(f"shard {folder.shard} ({folder.path}) holds {len(foreign)} records of samples "
                              f"outside the shard (e.g. {foreign[0]}): the folder was reused by another run")
    absent = [u for u in expected if u not in by_key]
    if absent:
        raise ShardMergeError(f"shard {folder.shard} ({folder.path}) is incomplete: {len(absent)} of "
                              f"{len(expected)} units are missing (e.g. {absent[0]}); rerun its command with the "
                              f"same --shard {folder.shard} and --out to resume it, then merge again")
    return [by_key[u] for u in expected]


def merge_runs(out: str | os.PathLike[str], shard_dirs: Sequence[str | os.PathLike[str]]) -> MergedRun:
    """Merge the shard folders ``shard_dirs`` of one run into a new folder ``out`` (see the module doc)."""
    if not shard_dirs:
        raise ShardMergeError("no shard folders given")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ShardMergeError(f"{out} already exists and is not empty: merge into a new folder (or delete it)")
    folders = sorted((read_shard_folder(d) for d in shard_dirs), key=lambda f: f.shard.index)
    check_shards_together(folders)
    kind = folders[0].config["kind"]
    order = RunOrder.of(kind, _read_records(folders[0]))
    unseen = sorted(set(folders[0].config.get("conditions", {})) - set(order.conditions)) + \
        sorted(set(folders[0].config.get("samples", {})) - set(order.benchmarks))
    if unseen:
        raise ShardMergeError(f"shard {folders[0].shard} ({folders[0].path}) is incomplete: nothing recorded yet "
                              f"for {', '.join(unseen)}; rerun its command with the same --shard {folders[0].shard} "
                              "and --out to resume it, then merge again")
    merged = [record for folder in folders for record in _shard_records(folder, order)]
    merged.sort(key=order.sort_key(kind))  # stable: shards in index order, samples in order within each

    staging = out.with_name(out.name + ".merging")
    if staging.exists():
        shutil.rmtree(staging)
    RunFolder(staging, folders[0].config).log(MERGEABLE_KINDS[kind]).append(merged)
    if kind == "detect":
        stats = staging / "detect_stats"
        stats.mkdir()
        for folder in folders:
            for name in sorted({r["file"] for r in RecordLog(folder.path / "detect_records.jsonl").read()}):
                shutil.copy2(folder.path / "detect_stats" / name, stats / name)
    if out.exists():
        out.rmdir()
    os.replace(staging, out)
    return MergedRun(out, kind, len(folders), len(merged))


def merge_design_space_runs(out: str | os.PathLike[str],
                            shard_dirs: Sequence[str | os.PathLike[str]]) -> pd.DataFrame:
    """Merge sharded design-space folders into ``out`` (``detect/`` + merged ``design_space/``); its table."""
    out, shard_dirs = Path(out), [Path(d) for d in shard_dirs]
    if out.exists() and any(out.iterdir()):
        raise ShardMergeError(f"{out} already exists and is not empty: merge into a new folder (or delete it)")
    if not shard_dirs:
        raise ShardMergeError("no shard folders given")
    manifests = []
    for folder in shard_dirs:
        manifest = folder / "detect" / "manifest.json"
        if not manifest.exists():
            raise ShardMergeError(f"{folder} has no detection run (detect/manifest.json): pass the --out folders "
                                  "of `vrh design-space --shard` runs")
        manifests.append(read_manifest(manifest))
    for folder, manifest in zip(shard_dirs[1:], manifests[1:]):
        if manifest != manifests[0]:
            raise ShardMergeError(f"{shard_dirs[0]} and {folder} detected heads on different data or models: "
                                  "merge only shards of one command")
    stats_from_run(shard_dirs[0] / "detect")  # complete, else the error says how to resume it
    merge_runs(out / "design_space", [d / "design_space" for d in shard_dirs])
    shutil.copytree(shard_dirs[0] / "detect", out / "detect")
    return design_space_from_run(out)
