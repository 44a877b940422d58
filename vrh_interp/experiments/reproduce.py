"""``run_reproduce``: the paper's grounding and cross-task protocol on real benchmark files, in one run folder.

The protocol is a list of the declared experiments' specs (``builtin_specs.ReproduceSpec.steps``), each run by its
own runner, as ``vrh detect``, ``vrh sweep`` and ``vrh vqa-sweep`` run them; this module only composes them and
writes the tables (Appendix E, H, J of the paper), each step resumable from the records it writes:

1. the split (``datasets.splits.detection_split``): ``detect_count`` (200) seeded detection samples, the disjoint
   rest (or ``evaluation_count`` of it) for evaluation. It is a data option (``data.sources``' ``role=``,
   ``detect=``, ``eval=``, ``split_seed=``): the detection and the sweep read ``DATA:role=detection:...`` and
   ``DATA:role=evaluation:...``, disjoint by construction; the ids go to ``split.json``;
2. ``DetectSpec`` (``experiments.detect.run``): every head scored with the VRH design on the detection samples
   (``detect/``, kept as ``scores-vrh.json``);
3. ``SweepSpec`` (``experiments.sweep.run``): the k-sweep on the evaluation samples, top-k vs k random heads, k
   layer-matched heads and (``live``, the default, local models) k live heads drawn outside the top max(k), for each
   random seed (``sweep/``, ``sweep_summary.csv``). The live heads are those the head census
   (``evaluation.census``) of the first evaluation samples finds acting (``census.csv``): a control that inert
   heads cannot carry. The paper's k in {0, 1, 3, 5, 10, 20} is capped at half the model's head count
   (``capped_ks``), the most for which k random heads still exist outside the top k, and at the largest k whose
   layer-matched control can be drawn (``experiments.conditions.largest_usable_k``: a layer holding more than half
   its heads in the top k cannot);
4. the functional-specificity split of every condition into correct / parse failure / mislocation, the
   mislocations split into boxed another annotated object / boxed no object where the loader lists the
   image's other objects (``failure_split.csv``, ``experiments.sweep.failure_counts``);
5. with VQA specs, ``VQASweepSpec`` (``experiments.vqa_sweep.run``), Table 3: the top-``vqa_k`` heads (20, capped
   like k) vs ``vqa_k`` random heads on each benchmark (``vqa/``, ``vqa_summary.csv``, ``vqa_table.csv``).

Every step's spec is checked (``Spec.check``) before any work; the sweep's and the VQA test's k, which the scores
fix, again once the detection has written them. ``manifest.json`` in ``out`` records the arguments; rerunning with
the same ones resumes, with different ones is refused (``runs.RunMismatchError``). ``reproduce.json`` lists what was
run and where the tables are.

``run(spec, vlm, folder)`` is ``vrh reproduce`` (``builtin_specs.ReproduceSpec``: its options, checked before the
model loads; the command loads and places the model once and passes it in, ``run_reproduce(..., vlm=)``).

Sharded (``shard=Shard(i, n)``, ``vrh reproduce --shard i/n``): every shard runs steps 1-2 in full (200
samples: short, and all shards then mask the same heads) and its shard of steps 3 and 5; ``merge_reproduce_runs``
joins the shard folders and writes the tables of steps 3-5.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from vrh_interp.core.bookkeeping.runs import RunFolder, write_atomic, write_json_atomic
from vrh_interp.core.bookkeeping.shards import Shard, shard_config
from vrh_interp.core.description.model import LOCAL, VLM, Placement
from vrh_interp.data.datasets.samples import VQASample
from vrh_interp.data.datasets.splits import PAPER_DETECTION_COUNT
from vrh_interp.data.sources import load_split, load_vqa, reading_once
from vrh_interp.evaluation.census import CENSUS_CSV
from vrh_interp.evaluation.controls import CONTROL_KINDS
from vrh_interp.experiments import detect, sweep, vqa_sweep
from vrh_interp.experiments.builtin_specs import ReproduceSpec
from vrh_interp.experiments.conditions import largest_usable_k
from vrh_interp.experiments.merge import ShardMergeError, check_shards_together, merge_runs, read_shard_folder
from vrh_interp.experiments.sweep import SweepResult, failure_counts, sweep_from_run
from vrh_interp.experiments.vqa_sweep import VQASweepResult, vqa_sweep_from_run
from vrh_interp.scoring.scores import HeadScores

PAPER_KS: tuple[int, ...] = (0, 1, 3, 5, 10, 20)
PAPER_RANDOM_SEEDS: tuple[int, ...] = (0, 1, 2)
PAPER_VQA_K = 20


def capped_ks(ks: Sequence[int], total_heads: int, usable: int | None = None) -> list[int]:
    """``ks`` (and 0) up to ``total_heads // 2`` (the random controls need k heads outside the top max(k)) and
    up to ``usable`` when given (``largest_usable_k`` of the ranking: where the controls can be drawn)."""
    limit = total_heads // 2 if usable is None else min(total_heads // 2, usable)
    return sorted({0, *(k for k in ks if 0 <= k <= limit)})


def failure_split(result: SweepResult) -> pd.DataFrame:
    """Per condition, and per control kind and k with its sets pooled (``seed="all"``): counts and rates of the
    sweep's failure decomposition (``experiments.sweep.failure_counts``): correct, parse failure, mislocation,
    and where the samples list their objects the mislocations split into boxed another object / boxed no
    object (NaN otherwise)."""
    records = result.records
    groups = [(c.key, c.kind, c.k, c.seed, records[records["condition"] == c.key]) for c in result.conditions]
    for kind in CONTROL_KINDS:
        for k in sorted({c.k for c in result.conditions if c.kind == kind}):
            keys = [c.key for c in result.conditions if c.kind == kind and c.k == k]
            groups.append((f"{kind}:k={k}:seed=all", kind, k, "all", records[records["condition"].isin(keys)]))
    rows = []
    for key, kind, k, seed, part in groups:
        counts = failure_counts(part, result.iou_threshold)
        n = counts.pop("n")
        rows.append({"key": key, "condition": kind, "k": k, "seed": seed, "n": n, **counts,
                     **{f"{name}_rate": count / n if n else float("nan") for name, count in counts.items()}})
    return pd.DataFrame(rows)


@dataclass
class ReproduceResult:
    out: Path
    ks: list[int]
    vqa_k: int | None
    sweep_summary: pd.DataFrame
    failure_split: pd.DataFrame
    vqa_summary: pd.DataFrame | None
    vqa_table: pd.DataFrame | None
    claims: pd.DataFrame | None = None  # the causal claim per k > 0 (``experiments.verdicts.sweep_claims``)


def load_vqa_suite(vqa_specs: Sequence[str], limit: int | None) -> list[VQASample]:
    """All benchmarks' samples, the first ``limit`` of each when given."""
    samples: list[VQASample] = []
    for spec in vqa_specs:
        loaded = list(load_vqa(spec))
        samples += loaded[:limit] if limit is not None else loaded
    return samples


def run_reproduce(model_spec: str, data_spec: str, vqa_specs: Sequence[str] = (), out: str | Path = "runs/reproduce",
                  *, detect_count: int = PAPER_DETECTION_COUNT, evaluation_count: int | None = None,
                  split_seed: int = 0, ks: Sequence[int] = PAPER_KS,
                  random_seeds: Sequence[int] = PAPER_RANDOM_SEEDS, vqa_k: int = PAPER_VQA_K,
                  vqa_limit: int | None = None, batch_size: int = 8, max_new_tokens: int = 24,
                  device: str | None = None, dtype: str | None = None, progress: bool = True,
                  shard: Shard | None = None, placement: Placement = LOCAL, live: bool = True,
                  vlm: VLM | None = None) -> ReproduceResult:
    """The whole protocol into ``out`` (see the module doc): ``run`` of the ``ReproduceSpec`` these arguments make.

    With ``shard``, every shard runs the (short) detection in full, so all shards mask the same heads, and
    only its shard of the k-sweep and VQA samples; it writes no tables (its result's tables cover its samples
    only). ``merge_reproduce_runs`` (``vrh merge``) joins the shard folders and writes the tables. ``placement``
    (``core.description.model.Placement``: backend and remote) places the model once (``VLM.on``); detection, the
    k-sweep and the VQA sweep run where it says (remote: batched requests). Remote is not part of the run folder's
    configuration, so a remote run may resume a local one. ``vlm``: the model ``model_spec`` names, already loaded
    and placed (``vrh reproduce`` loads it once, before this call); then ``device``, ``dtype`` and ``placement``
    are not read. ``model_spec`` is what the run folder records either way.
    """
    loaded = vlm is not None
    spec = ReproduceSpec(model=model_spec, data=data_spec, vqa=tuple(vqa_specs), out=str(out), detect=detect_count,
                         eval=evaluation_count, split_seed=split_seed, ks=",".join(map(str, ks)),
                         seeds=",".join(map(str, random_seeds)), vqa_k=vqa_k, vqa_limit=vqa_limit,
                         batch_size=batch_size, max_new_tokens=max_new_tokens, progress=progress, shard=shard,
                         live=live, device=None if loaded else device, dtype=None if loaded else dtype,
                         backend=placement.backend, remote=placement.remote)
    return _reproduce(spec, vlm, placement)


def run(spec: ReproduceSpec, vlm: VLM, folder: Path) -> ReproduceResult:
    """``vrh reproduce`` (``builtin_specs.ReproduceSpec``): the protocol of ``spec`` into ``folder`` on ``vlm``, the
    model ``spec.model`` loaded and placed by the command."""
    return _reproduce(spec.replace(out=str(folder)), vlm)


def _reproduce(spec: ReproduceSpec, vlm: VLM | None, placement: Placement = LOCAL) -> ReproduceResult:
    """The steps' specs (``ReproduceSpec.steps``), each run by its experiment's runner, then the tables. The whole
    plan is checked before any work; the sweep's and the VQA test's k, which the scores fix, once more before
    either runs. Each benchmark file is read once for all the steps (``data.sources.reading_once``)."""
    with reading_once():
        return _steps(spec, vlm, placement)


def _steps(spec: ReproduceSpec, vlm: VLM | None, placement: Placement) -> ReproduceResult:
    started = time.perf_counter()
    spec.check()  # with every step's spec (``ReproduceSpec.plan_faults``)
    out = Path(spec.out)
    arguments = {"kind": "reproduce", "model": spec.model, "data": spec.data, "vqa": list(spec.vqa),
                 "detect_count": spec.detect, "evaluation_count": spec.eval, "split_seed": spec.split_seed,
                 "ks": spec.head_counts(), "random_seeds": spec.control_seeds(), "vqa_k": spec.vqa_k,
                 "vqa_limit": spec.vqa_limit, "max_new_tokens": spec.max_new_tokens, "live": spec.live}
    RunFolder(out, shard_config(arguments, spec.shard, spec.batch_size))
    say = print if spec.progress else (lambda *_: None)
    part = "" if spec.shard is None else f" (shard {spec.shard}: its samples only)"
    if vlm is None:
        from vrh_interp.specs import load_spec

        vlm = load_spec(spec.model, spec.device, spec.dtype).on(placement)

    detection = spec.detection()
    split, skipped = load_split(detection.data)
    write_json_atomic(out / "split.json", {**split.as_dict(), "skipped_rows": len(skipped)})
    say(f"[1/4] detecting heads on {len(split.detection)} samples of {spec.data}")
    scores = detect.run(detection, vlm, Path(detection.out))
    scores.save(out / "scores-vrh.json")  # the run's copy (``scores_file``): what the later steps and vrh merge read

    total = vlm.geometry.total_heads
    used_ks = capped_ks(spec.head_counts(), total, largest_usable_k(scores.ranking(), vlm.geometry))
    k_sweep = spec.k_sweep(",".join(map(str, used_ks))).check()
    vqa_test = spec.vqa_test(min(spec.vqa_k, max(used_ks)))
    if vqa_test is not None:
        vqa_test.check()
    say(f"[2/4] k-sweep on {len(split.evaluation)} disjoint samples{part}, ks={used_ks} ({total} heads), "
        f"random seeds {spec.control_seeds()}")
    result = sweep.run(k_sweep, vlm, Path(k_sweep.out))
    vqa_result = None
    if vqa_test is not None:
        questions = len(load_vqa_suite(vqa_test.vqa, vqa_test.limit))
        say(f"[3/4] VQA suite: {questions} questions{part}, top-{vqa_test.vqa_k} heads vs {vqa_test.vqa_k} random "
            "heads")
        vqa_result = vqa_sweep.run(vqa_test, vlm, Path(vqa_test.out))
    else:
        say("[3/4] no VQA benchmarks given: Table 3 skipped")
    if spec.shard is not None:
        say(f"[4/4] shard {spec.shard} done: merge all {spec.shard.count} shard folders with vrh merge")
        return _tables(out, arguments, total, result, vqa_result, complete=False)
    say("[4/4] tables")
    return write_tables(out, arguments, scores, json.loads((out / "split.json").read_text(encoding="utf-8")),
                        result, vqa_result, seconds=time.perf_counter() - started)


def _tables(out: Path, arguments: dict[str, Any], total_heads: int, result: SweepResult,
            vqa_result: VQASweepResult | None, *, complete: bool = True) -> ReproduceResult:
    """The tables in memory; a shard's (``complete=False``) cover its samples only and have no Table 3 (which may
    have no rows) and no verdicts (a shard's items are not the run's)."""
    from vrh_interp.experiments.verdicts import sweep_claims

    used_ks = sorted({c.k for c in result.conditions})
    return ReproduceResult(
        out=out, ks=used_ks, vqa_k=min(arguments["vqa_k"], max(used_ks)) if arguments["vqa"] else None,
        sweep_summary=result.summary(), failure_split=failure_split(result),
        vqa_summary=None if vqa_result is None else vqa_result.summary(),
        vqa_table=None if vqa_result is None or not complete else vqa_result.table(),
        claims=sweep_claims(result) if complete else None)


def write_tables(out: Path, arguments: dict[str, Any], scores: HeadScores, split: dict[str, Any],
                 result: SweepResult, vqa_result: VQASweepResult | None, *, seconds: float | None) -> ReproduceResult:
    """The tables and ``reproduce.json`` of a complete run (unsharded, or merged from shards)."""
    tables = _tables(out, arguments, scores.scores.size, result, vqa_result)
    tables.sweep_summary.to_csv(out / "sweep_summary.csv", index=False)
    tables.failure_split.to_csv(out / "failure_split.csv", index=False)
    names = ["sweep_summary.csv", "failure_split.csv"]
    if tables.claims is not None:
        tables.claims.to_csv(out / "claims.csv", index=False)
        names.append("claims.csv")
    if tables.vqa_summary is not None and tables.vqa_table is not None:
        tables.vqa_summary.to_csv(out / "vqa_summary.csv", index=False)
        tables.vqa_table.to_csv(out / "vqa_table.csv")
        names += ["vqa_summary.csv", "vqa_table.csv"]
    (out / "reproduce.json").write_text(json.dumps({
        **arguments, "used_ks": tables.ks, "used_vqa_k": tables.vqa_k, "total_heads": scores.scores.size,
        "detection_samples": len(split["detection_ids"]), "evaluation_samples": len(split["evaluation_ids"]),
        "skipped_rows": split["skipped_rows"], "top_heads": scores.top(max(tables.ks)).to_list(),
        "tables": names, "seconds": seconds}, indent=2, default=str))
    return tables


def merge_reproduce_runs(out: str | Path, shard_dirs: Sequence[str | Path]) -> ReproduceResult:
    """Join the folders of ``run_reproduce(..., shard=...)`` shards into ``out`` and write the tables.

    The shards must agree on everything the protocol fixed before the sharded steps (arguments, split,
    detection); the k-sweep and VQA folders are merged with ``merge_runs`` (every check named there), and the
    detection, split and scores are taken from shard 0. ``reproduce.json`` has ``"seconds": null``.
    """
    out, dirs = Path(out), [Path(d) for d in shard_dirs]
    if out.exists() and any(out.iterdir()):
        raise ShardMergeError(f"{out} already exists and is not empty: merge into a new folder (or delete it)")
    folders = sorted((read_shard_folder(d, kinds=("reproduce",)) for d in dirs), key=lambda f: f.shard.index)
    check_shards_together(folders)
    first = folders[0].path
    census = [CENSUS_CSV] if any((f.path / CENSUS_CSV).is_file() for f in folders) else []
    for name in ("split.json", "detect/manifest.json", "scores-vrh.json", *census):
        if not all((f.path / name).is_file() for f in folders):
            raise ShardMergeError(f"a shard folder lacks {name}: its detection or head census did not finish; rerun "
                                  "its command with the same --shard and --out to resume it")
    for name in ("split.json", "detect/manifest.json", *census):
        differing = [str(f.path) for f in folders[1:] if (f.path / name).read_bytes() != (first / name).read_bytes()]
        if differing:
            raise ShardMergeError(f"{name} of {', '.join(differing)} differs from {first}'s: the shards split or "
                                  "detected differently; merge only shards of one command")
    arguments = folders[0].config
    merge_runs(out / "sweep", [f.path / "sweep" for f in folders])
    if arguments["vqa"]:
        merge_runs(out / "vqa", [f.path / "vqa" for f in folders])
    shutil.copytree(first / "detect", out / "detect")
    for name in ("split.json", "scores-vrh.json", *census):
        shutil.copy2(first / name, out / name)
    RunFolder(out, arguments)
    # the summaries the sweep and VQA steps write into their folders when unsharded
    result = sweep_from_run(out / "sweep")
    write_atomic(out / "sweep" / "sweep_summary.csv", result.summary().to_csv(index=False))
    vqa_result = vqa_sweep_from_run(out / "vqa") if arguments["vqa"] else None
    if vqa_result is not None:
        write_atomic(out / "vqa" / "vqa_summary.csv", vqa_result.summary().to_csv(index=False))
    return write_tables(out, arguments, HeadScores.load(out / "scores-vrh.json"),
                        json.loads((out / "split.json").read_text(encoding="utf-8")), result, vqa_result,
                        seconds=None)
