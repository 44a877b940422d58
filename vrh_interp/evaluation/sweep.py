"""``sweep``: grounding accuracy with the top-k heads masked vs k random heads (the paper's causal test).

Controls. Random heads are drawn uniformly, with a seeded generator, from all heads EXCLUDING the
detected set (the top max(ks) heads of the ranking), optionally also excluding first-layer heads
(the paper's DPO control). For one seed the random sets are nested (the first k of one seeded
permutation), as the top-k sets are. Several seeds are reported separately and pooled.

Protocol. Detection and evaluation samples must be disjoint: passing the ``HeadScores`` (which carries
its sample ids) or ``detection_ids`` makes an overlap an error. Every (sample, condition) outcome is a
record in the run folder, so the sweep resumes after interruption and the summary is recomputed from
records: accuracy with bootstrap CI, mean IoU, parse-failure and mislocation rates, and an exact
McNemar test of each masked condition against the unmasked baseline on the same samples.

Scale-out. ``shard=Shard(i, n)`` grounds one shard's samples (``vrh_interp.shards``) into its own run folder;
``vrh_interp.merge.merge_runs`` joins the shards' folders and ``sweep_from_run`` reads the merged folder
(equal to the unsharded run's) without the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from vrh_interp.evaluation.grounding import ground_batch
from vrh_interp.evaluation.statistics import bootstrap_ci, mcnemar_exact
from vrh_interp.heads import HeadGeometry, HeadSet
from vrh_interp.model import VLM
from vrh_interp.provenance import library_versions, model_provenance
from vrh_interp.runs import RecordLog, RunFolder, whole_run_manifest
from vrh_interp.samples import GroundingSampleLike, check_samples
from vrh_interp.scoring.scores import HeadScores
from vrh_interp.shards import Shard, shard_config

RECORD_COLUMNS: list[str] = ["sample_id", "condition", "kind", "k", "seed", "answer", "parsed", "box", "iou"]


@dataclass(frozen=True)
class Condition:
    kind: str  # "baseline", "top" or "random"
    k: int
    seed: int | None
    heads: HeadSet

    @property
    def key(self) -> str:
        return f"{self.kind}:k={self.k}" + (f":seed={self.seed}" if self.seed is not None else "")

    @classmethod
    def from_key(cls, key: str, heads: HeadSet) -> "Condition":
        """The condition whose ``key`` is ``key`` (as run folders record them: ``{key: heads}``)."""
        kind, k, *seed = key.split(":")
        if not k.startswith("k=") or len(seed) > 1 or (seed and not seed[0].startswith("seed=")):
            raise ValueError(f"{key!r} is not a condition key such as 'random:k=5:seed=1'")
        return cls(kind, int(k[2:]), int(seed[0][5:]) if seed else None, heads)


def random_control(geometry: HeadGeometry, detected: HeadSet, k: int, seed: int, *,
                   exclude_first_layer: bool = False) -> HeadSet:
    """k heads drawn (seeded) from all heads not in ``detected`` (nested in k for a fixed seed)."""
    eligible = [h for h in geometry.all_heads() if h not in detected and not (exclude_first_layer and h.layer == 0)]
    if k > len(eligible):
        raise ValueError(f"cannot draw {k} random heads: only {len(eligible)} heads lie outside the detected set")
    order = np.random.default_rng(seed).permutation(len(eligible))
    return HeadSet(eligible[i] for i in order[:k])


def sweep_conditions(ranking: HeadSet, geometry: HeadGeometry, ks: Sequence[int], random_seeds: Sequence[int], *,
                     exclude_first_layer: bool = False) -> list[Condition]:
    total = geometry.total_heads
    bad = [k for k in ks if not 0 <= k <= total]
    if bad:
        raise ValueError(f"k values {bad} out of range: the model has {total} heads")
    if len(set(ks)) != len(ks):
        raise ValueError(f"duplicate k values in {list(ks)}")
    detected = ranking[: max(ks)]
    conditions = [Condition("baseline", 0, None, HeadSet())]
    for k in sorted(k for k in ks if k > 0):
        conditions.append(Condition("top", k, None, ranking[:k]))
        for seed in random_seeds:
            conditions.append(Condition("random", k, seed, random_control(
                geometry, detected, k, seed, exclude_first_layer=exclude_first_layer)))
    return conditions


@dataclass
class SweepResult:
    records: pd.DataFrame
    conditions: list[Condition]
    iou_threshold: float

    def summary(self, *, bootstrap_seed: int = 0) -> pd.DataFrame:
        """One row per (kind, k, seed) plus pooled random rows (seed 'all')."""
        df = self.records.copy()
        df["correct"] = df["iou"] >= self.iou_threshold
        base = df[df["condition"] == "baseline:k=0"].set_index("sample_id")["correct"]
        rows = []
        groups: list[tuple[str, str, int, Any, pd.DataFrame]] = []
        for cond in self.conditions:
            groups.append((cond.key, cond.kind, cond.k, cond.seed, df[df["condition"] == cond.key]))
        for k in sorted({c.k for c in self.conditions if c.kind == "random"}):
            pooled = df[df["condition"].str.startswith(f"random:k={k}:")]
            groups.append((f"random:k={k}:seed=all", "random", k, "all", pooled))
        for key, kind, k, seed, part in groups:
            if part.empty:
                continue
            correct = part["correct"].to_numpy()
            paired = mcnemar_exact(base.loc[part["sample_id"]].to_numpy(), correct) if kind != "baseline" else \
                {"lost": 0, "gained": 0, "p_value": 1.0}
            low, high = bootstrap_ci(correct.astype(float), seed=bootstrap_seed)
            rows.append({
                "key": key, "condition": kind, "k": k, "seed": seed, "n": len(part),
                "accuracy": float(correct.mean()), "accuracy_ci_low": low, "accuracy_ci_high": high,
                "mean_iou": float(part["iou"].mean()),
                "parse_failure_rate": float((~part["parsed"]).mean()),
                "mislocation_rate": float((part["parsed"] & ~part["correct"]).mean()),
                "lost_vs_baseline": paired["lost"], "gained_vs_baseline": paired["gained"],
                "p_value_vs_baseline": paired["p_value"],
            })
        return pd.DataFrame(rows)


def sweep(vlm: VLM, eval_samples: Sequence[GroundingSampleLike], ranking: HeadScores | HeadSet, *,
          ks: Sequence[int] = (0, 1, 3, 5, 10, 20), random_seeds: Sequence[int] = (0, 1, 2),
          detection_ids: Sequence[str] | None = None, exclude_first_layer: bool = False,
          iou_threshold: float = 0.5, batch_size: int = 8, max_new_tokens: int = 24,
          run_dir: str | Path | None = None, progress: bool = True, remote: bool | str = False,
          shard: Shard | None = None) -> SweepResult:
    """Mask the top-k heads of ``ranking`` and k random heads; ``shard`` runs one shard (``run_conditions``)."""
    if isinstance(ranking, HeadScores):
        detection_ids = list(detection_ids or []) + list(ranking.sample_ids)
        head_ranking = ranking.ranking()
    else:
        head_ranking = ranking
    overlap = sorted(set(detection_ids or []) & {s.sample_id for s in eval_samples})
    if overlap:
        raise ValueError(
            f"{len(overlap)} evaluation samples were also used for detection (e.g. {overlap[:3]}): detection and "
            "evaluation samples must be disjoint (use vrh_interp.splits or different seeds)"
        )
    geometry = vlm.geometry
    geometry.validate(head_ranking)
    conditions = sweep_conditions(head_ranking, geometry, list(ks), list(random_seeds),
                                  exclude_first_layer=exclude_first_layer)
    return run_conditions(vlm, eval_samples, conditions, iou_threshold=iou_threshold, batch_size=batch_size,
                          max_new_tokens=max_new_tokens, run_dir=run_dir, progress=progress, remote=remote,
                          shard=shard)


def run_conditions(vlm: VLM, eval_samples: Sequence[GroundingSampleLike], conditions: Sequence[Condition], *,
                   iou_threshold: float = 0.5, batch_size: int = 8, max_new_tokens: int = 24,
                   run_dir: str | Path | None = None, progress: bool = True,
                   remote: bool | str = False, shard: Shard | None = None) -> SweepResult:
    """Greedy grounding of every sample under every condition, resumable through ``run_dir``.

    With ``shard``, only that shard's samples (``Shard.select``) are grounded and the result holds their
    records only; merge the shard folders with ``vrh_interp.merge.merge_runs`` and read the merged folder
    with ``sweep_from_run`` for the full result.
    """
    check_samples(eval_samples, minimum=1, what="evaluation samples")
    if not 0 < iou_threshold <= 1:
        raise ValueError("iou_threshold must be in (0, 1]")
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    keys = [c.key for c in conditions]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate conditions: {keys}")
    if "baseline:k=0" not in keys:
        raise ValueError("conditions must include the unmasked baseline (Condition('baseline', 0, None, HeadSet()))")
    config = {"kind": "sweep", "model": model_provenance(vlm), "sample_ids": [s.sample_id for s in eval_samples],
              "conditions": {c.key: c.heads.to_list() for c in conditions}, "max_new_tokens": max_new_tokens,
              "libraries": {k: v for k, v in library_versions().items() if k in ("transformers", "torch")}}
    folder = RunFolder(run_dir, shard_config(config, shard, batch_size)) if run_dir is not None else None
    mine = shard.select(eval_samples, batch_size) if shard is not None else list(eval_samples)
    log = folder.log("sweep_records") if folder else None
    records: list[dict[str, Any]] = log.read() if log else []
    done = {(r["sample_id"], r["condition"]) for r in records}
    total = len(conditions) * len(mine)
    bar = tqdm(total=total, initial=len(done), desc="sweep: masked grounding", disable=not progress, unit="answer")
    for cond in conditions:
        todo = [s for s in mine if (s.sample_id, cond.key) not in done]
        for start in range(0, len(todo), batch_size):
            chunk = todo[start: start + batch_size]
            outcomes = ground_batch(vlm, chunk, heads=cond.heads, max_new_tokens=max_new_tokens, remote=remote)
            new = [{**o.as_dict(), "condition": cond.key, "kind": cond.kind, "k": cond.k, "seed": cond.seed}
                   for o in outcomes]
            if log is not None:
                log.append(new)
            records.extend(new)
            bar.update(len(chunk))
    bar.close()
    return SweepResult(records=_records_frame(records, conditions, [s.sample_id for s in eval_samples]),
                       conditions=list(conditions), iou_threshold=iou_threshold)


def sweep_from_run(run_dir: str | Path, *, iou_threshold: float = 0.5) -> SweepResult:
    """The result of a complete sweep run folder (e.g. merged shards), read without the model: what ``sweep``
    or ``run_conditions`` on the same samples and conditions returns."""
    run_dir = Path(run_dir)
    config = whole_run_manifest(run_dir, "sweep", "a sweep")
    records = RecordLog(run_dir / "sweep_records.jsonl").read()
    conditions = [Condition.from_key(key, HeadSet(config["conditions"][key])) for key in condition_order(records)]
    if len(conditions) != len(config["conditions"]):
        raise ValueError(f"{run_dir} is incomplete: no answers yet under conditions "
                         f"{sorted(set(config['conditions']) - {c.key for c in conditions})}; rerun its command to "
                         "resume it")
    missing = len(conditions) * len(config["sample_ids"]) - len({(r["sample_id"], r["condition"]) for r in records})
    if missing:
        raise ValueError(f"{run_dir} is incomplete: {missing} (sample, condition) answers are missing; rerun its "
                         "command to resume it")
    return SweepResult(records=_records_frame(records, conditions, config["sample_ids"]), conditions=conditions,
                       iou_threshold=iou_threshold)


def condition_order(records: Sequence[dict[str, Any]]) -> list[str]:
    """Condition keys in the order a run evaluated them: first appearance in its log (a run folder's manifest
    keeps conditions as a key-sorted mapping; a run appends condition after condition, also when resumed)."""
    return list(dict.fromkeys(r["condition"] for r in records))


def _records_frame(records: Sequence[dict[str, Any]], conditions: Sequence[Condition],
                   sample_ids: Sequence[str]) -> pd.DataFrame:
    """Records as a frame in condition order, then sample order (the order does not depend on resumes)."""
    frame = pd.DataFrame(list(records), columns=RECORD_COLUMNS)
    frame["box"] = frame["box"].map(lambda b: None if b is None else tuple(float(v) for v in b))
    order = {c.key: i for i, c in enumerate(conditions)}
    ids = {sample_id: i for i, sample_id in enumerate(sample_ids)}
    frame = frame.assign(_c=frame["condition"].map(order), _s=frame["sample_id"].map(ids))
    return frame.sort_values(["_c", "_s"]).drop(columns=["_c", "_s"]).reset_index(drop=True)
