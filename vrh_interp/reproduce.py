"""``run_reproduce``: the paper's grounding and cross-task protocol on real benchmark files, in one run folder.

Steps (Appendix E, H, J of the paper), each resumable from the records it writes:

1. load the grounding data (``sources.load_data``) and split it with ``datasets.splits.detection_split``:
   ``detect_count`` (200) seeded detection samples, the disjoint rest (or ``evaluation_count`` of it) for
   evaluation; the ids go to ``split.json``;
2. score every head with the VRH design on the detection samples (``detect/``, ``scores-vrh.json``);
3. k-sweep on the evaluation samples, top-k vs k random heads drawn outside the top max(k), for each random
   seed (``sweep/``, ``sweep_summary.csv``). The paper's k in {0, 1, 3, 5, 10, 20} is capped at half the
   model's head count (``capped_ks``), the most for which k random heads still exist outside the top k;
4. the functional-specificity split of every condition into correct / mislocation / parse failure
   (``failure_split.csv``);
5. with VQA specs, Table 3: the top-``vqa_k`` heads (20, capped like k) vs ``vqa_k`` random heads on each
   benchmark (``vqa/``, ``vqa_summary.csv``, ``vqa_table.csv``).

``manifest.json`` in ``out`` records the arguments; rerunning with the same ones resumes, with different
ones is refused (``runs.RunMismatchError``). ``reproduce.json`` lists what was run and where the tables are.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pandas as pd

from vrh_interp.datasets.samples import VQASample
from vrh_interp.datasets.splits import PAPER_DETECTION_COUNT, detection_split
from vrh_interp.datasets.vqa_sweep import vqa_sweep
from vrh_interp.evaluation.sweep import SweepResult, sweep
from vrh_interp.runs import RunFolder, write_json_atomic
from vrh_interp.scoring.detect import score_heads
from vrh_interp.sources import load_data, load_vqa

PAPER_KS: tuple[int, ...] = (0, 1, 3, 5, 10, 20)
PAPER_RANDOM_SEEDS: tuple[int, ...] = (0, 1, 2)
PAPER_VQA_K = 20


def capped_ks(ks: Sequence[int], total_heads: int) -> list[int]:
    """``ks`` (and 0) up to ``total_heads // 2``: the random controls need k heads outside the top max(k)."""
    return sorted({0, *(k for k in ks if 0 <= k <= total_heads // 2)})


def failure_split(result: SweepResult) -> pd.DataFrame:
    """Per condition (random seeds also pooled): counts and rates of correct, mislocation, parse failure."""
    records = result.records.assign(correct=result.records["iou"] >= result.iou_threshold)
    groups = [(c.key, c.kind, c.k, c.seed, records[records["condition"] == c.key]) for c in result.conditions]
    for k in sorted({c.k for c in result.conditions if c.kind == "random"}):
        groups.append((f"random:k={k}:seed=all", "random", k, "all",
                       records[records["condition"].str.startswith(f"random:k={k}:")]))
    rows = []
    for key, kind, k, seed, part in groups:
        counts = {"correct": int(part["correct"].sum()),
                  "mislocation": int((part["parsed"] & ~part["correct"]).sum()),
                  "parse_failure": int((~part["parsed"]).sum())}
        rows.append({"key": key, "condition": kind, "k": k, "seed": seed, "n": len(part), **counts,
                     **{f"{name}_rate": count / len(part) if len(part) else float("nan")
                        for name, count in counts.items()}})
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
                  device: str | None = None, dtype: str | None = None, progress: bool = True) -> ReproduceResult:
    from vrh_interp.cli import _load_model

    started = time.perf_counter()
    out = Path(out)
    arguments = {"kind": "reproduce", "model": model_spec, "data": data_spec, "vqa": list(vqa_specs),
                 "detect_count": detect_count, "evaluation_count": evaluation_count, "split_seed": split_seed,
                 "ks": list(ks), "random_seeds": list(random_seeds), "vqa_k": vqa_k, "vqa_limit": vqa_limit,
                 "max_new_tokens": max_new_tokens}
    RunFolder(out, arguments)
    say = print if progress else (lambda *_: None)

    vlm = _load_model(model_spec, device, dtype)
    samples = load_data(data_spec)
    split = detection_split(samples, detect_count, seed=split_seed, evaluation_count=evaluation_count)
    write_json_atomic(out / "split.json", split.as_dict())
    say(f"[1/4] detecting heads on {len(split.detection)} samples of {data_spec}")
    scores = score_heads(vlm, list(split.detection), "vrh", batch_size=batch_size, max_new_tokens=max_new_tokens,
                         run_dir=out / "detect", dataset=data_spec, progress=progress)
    scores.save(out / "scores-vrh.json")

    total = vlm.geometry.total_heads
    used_ks = capped_ks(ks, total)
    say(f"[2/4] k-sweep on {len(split.evaluation)} disjoint samples, ks={used_ks} ({total} heads), "
        f"random seeds {list(random_seeds)}")
    result = sweep(vlm, list(split.evaluation), scores, ks=used_ks, random_seeds=random_seeds, batch_size=batch_size,
                   max_new_tokens=max_new_tokens, run_dir=out / "sweep", progress=progress)
    summary = result.summary()
    summary.to_csv(out / "sweep_summary.csv", index=False)
    say("[3/4] failure split")
    failures = failure_split(result)
    failures.to_csv(out / "failure_split.csv", index=False)

    vqa_summary = vqa_table = None
    used_vqa_k = min(vqa_k, max(used_ks)) if vqa_specs else None
    if vqa_specs:
        suite = load_vqa_suite(vqa_specs, vqa_limit)
        say(f"[4/4] VQA suite: {len(suite)} questions, top-{used_vqa_k} heads vs {used_vqa_k} random heads")
        vqa_result = vqa_sweep(vlm, suite, scores.ranking()[:used_vqa_k], random_seeds=random_seeds,
                               batch_size=batch_size, run_dir=out / "vqa", progress=progress)
        vqa_summary, vqa_table = vqa_result.summary(), vqa_result.table()
        vqa_summary.to_csv(out / "vqa_summary.csv", index=False)
        vqa_table.to_csv(out / "vqa_table.csv")
    else:
        say("[4/4] no VQA benchmarks given: Table 3 skipped")

    tables = ["sweep_summary.csv", "failure_split.csv"] + (["vqa_summary.csv", "vqa_table.csv"] if vqa_specs else [])
    (out / "reproduce.json").write_text(json.dumps({
        **arguments, "used_ks": used_ks, "used_vqa_k": used_vqa_k, "total_heads": total,
        "detection_samples": len(split.detection), "evaluation_samples": len(split.evaluation),
        "skipped_rows": len(getattr(samples, "skipped", ())), "top_heads": scores.top(max(used_ks)).to_list(),
        "tables": tables, "seconds": time.perf_counter() - started}, indent=2, default=str))
    return ReproduceResult(out=out, ks=used_ks, vqa_k=used_vqa_k, sweep_summary=summary, failure_split=failures,
                           vqa_summary=vqa_summary, vqa_table=vqa_table)
