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
do, it just writes its tables). ``vrh_interp.experiments.reproduce.merge_reproduce_runs`` merges ``vrh reproduce``
shards.

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

from vrh_interp.core.bookkeeping.runs import RunFolder, check_not_running, read_manifest
from vrh_interp.experiments.declared import Experiment, experiment, experiments, mergeable
from vrh_interp.experiments.design_space import design_space_from_run
from vrh_interp.scoring.detect import stats_from_run
from vrh_interp.core.bookkeeping.shards import Shard


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


def shard_experiment(folder: str | os.PathLike[str]) -> Experiment | None:
    """The experiment a shard folder holds (what ``vrh merge`` does with it: its ``merge``): the kind its
    ``manifest.json`` names (``RunManifestError`` naming the file when it is damaged), or, without one, the
    experiment whose ``shards_in`` subfolder it has with a manifest (``design_space/``); None when neither says
    (``merge_runs`` then names what the folder lacks)."""
    folder = Path(folder)
    if (folder / "manifest.json").is_file():
        kind = read_manifest(folder / "manifest.json").get("kind")
        return next((e for e in experiments() if e.name == kind), None)
    return next((e for e in experiments() if e.shards_in and (folder / e.shards_in / "manifest.json").is_file()), None)


def read_shard_folder(path: str | os.PathLike[str], kinds: Sequence[str] | None = None) -> ShardFolder:
    """A shard folder's manifest, split into its shard entry and the whole run's configuration; ``kinds``: the
    manifest kinds accepted (default: every experiment declared ``mergeable``)."""
    kinds = tuple(e.name for e in mergeable()) if kinds is None else kinds
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
    """The order an unsharded run appends records in: its declaration's ``order`` (e.g. condition, then
    benchmark, then sample). Manifests keep conditions and benchmarks as key-sorted mappings, so the values of
    every field but the sample are read from shard 0's log, in the order it first records them (shard 0 is never
    empty: it holds the first batch of every benchmark under every condition)."""

    experiment: Experiment
    values: dict[str, list[Any]]  # each field of the order but the last -> its values in run order

    @classmethod
    def of(cls, experiment: Experiment, records: Sequence[dict[str, Any]]) -> "RunOrder":
        return cls(experiment, {field: list(dict.fromkeys(r[field] for r in records if field in r))
                                for field in experiment.order[:-1]})

    def sort_key(self) -> Callable[[dict[str, Any]], tuple[int, ...]]:
        rank = {field: {value: i for i, value in enumerate(values)} for field, values in self.values.items()}
        return lambda r: tuple(rank[field][r[field]] for field in rank)

    def units(self, config: dict[str, Any], shard: Shard, batch_size: int) -> list[tuple[Any, ...]]:
        """The units (record keys) of ``shard`` in the order an unsharded run appends them."""
        declared = self.experiment
        sample_field, outer = declared.order[-1], declared.order[:-1]
        samples = config[declared.samples]
        mine: dict[Any, list[Any]] = {}

        def shard_samples(values: dict[str, Any]) -> list[Any]:
            group = values[declared.samples_by] if declared.samples_by is not None else None
            if group not in mine:
                mine[group] = shard.select(samples[group] if group is not None else samples, batch_size)
            return mine[group]

        combos: list[dict[str, Any]] = [{}]
        for field in outer:
            combos = [{**combo, field: value} for combo in combos for value in self.values[field]]
        return [tuple({**combo, sample_field: sample}[field] for field in declared.record_key)
                for combo in combos for sample in shard_samples(combo)]


def _declared(kind: str) -> Experiment:
    """The declaration of a mergeable ``kind``."""
    declared = experiment(kind)
    if not declared.mergeable:
        raise ShardMergeError(f"{kind!r} runs are not merged by merge_runs (expected one of "
                              f"{sorted(e.name for e in mergeable())})")
    return declared


def _unit(declared: Experiment, record: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(record[field] for field in declared.record_key)


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
    return _declared(folder.config["kind"]).read_log(folder.path).read()


def _shard_records(folder: ShardFolder, order: RunOrder) -> list[dict[str, Any]]:
    """The shard's records in unsharded append order, after checking they are exactly its units."""
    by_key = {_unit(order.experiment, record): record
              for record in _read_records(folder)}  # each unit once (RecordLog.read)
    expected = order.units(folder.config, folder.shard, folder.batch_size)
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
    declared = _declared(kind)
    order = RunOrder.of(declared, _read_records(folders[0]))
    unseen = [value for field, entry in declared.listed
              for value in sorted(set(folders[0].config.get(entry, {})) - set(order.values[field]))]
    if unseen:
        raise ShardMergeError(f"shard {folders[0].shard} ({folders[0].path}) is incomplete: nothing recorded yet "
                              f"for {', '.join(unseen)}; rerun its command with the same --shard {folders[0].shard} "
                              "and --out to resume it, then merge again")
    merged = [record for folder in folders for record in _shard_records(folder, order)]
    merged.sort(key=order.sort_key())  # stable: shards in index order, samples in order within each

    staging = out.with_name(out.name + ".merging")
    if staging.exists():
        shutil.rmtree(staging)
    declared.open_log(RunFolder(staging, folders[0].config)).append(merged)
    if declared.merge_files is not None:
        declared.resolve("merge_files")(staging, folders)
    if out.exists():
        out.rmdir()
    os.replace(staging, out)
    return MergedRun(out, kind, len(folders), len(merged))


def copy_detect_stats(staging: Path, folders: Sequence[ShardFolder]) -> None:
    """A detection merge's files beside its log: every shard's statistics files (named by the records, already
    with global names) into ``staging/detect_stats`` (the "detect" declaration's ``merge_files``)."""
    stats = staging / "detect_stats"
    stats.mkdir()
    for folder in folders:
        for name in sorted({r["file"] for r in _read_records(folder)}):
            shutil.copy2(folder.path / "detect_stats" / name, stats / name)


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
