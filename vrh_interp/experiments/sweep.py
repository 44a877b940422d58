"""``sweep``: grounding accuracy with the top-k heads masked vs control head sets (the paper's causal test).

Controls. Per k, ``random_seeds`` (default 20) head sets of each control kind, every one drawn with its own
seeded generator from the heads OUTSIDE the detected set (the top max(ks) heads of the ranking):

* ``random`` (the paper's): k heads uniformly, optionally also excluding first-layer heads (the paper's DPO
  control). For one seed the sets are nested in k (the first k of one seeded permutation), as the top-k are.
* ``matched`` (``layer_matched_control``): as many heads in each layer as the top-k set has there. Early
  layers can be the most harmful to mask whatever the heads do, so a uniform control mixes "retrieval" with
  "breaks everything"; the layer-matched one separates them.

Statistics (``evaluation.statistics``). The unit of a control is the head set: ``SweepResult.summary`` has a
row per set and, per (control kind, k), a ``seed="all"`` row with the distribution of the sets' accuracies
(mean, sd, quantiles) and a two-level bootstrap interval for their mean; each top-k row carries the empirical
p-value against each control's sets at its k (``p_vs_random``, ``p_vs_matched``). ``summary_verdict`` judges
"top-k is more harmful than both controls" with ``statistics.set_level_verdict``; no verdict uses an interval
of pooled samples.

k as a fraction. ``ks`` takes counts or percentages of all heads (``parse_ks``: ``"0,1%,2.5%,5"``); the
summary shows ``k`` and ``k_fraction``.

Protocol. Detection and evaluation samples must be disjoint: passing the ``HeadScores`` (which carries
its sample ids) or ``detection_ids`` makes an overlap an error. Every (sample, condition) outcome is a
record in the run folder (``manifest.json`` maps each condition key to its heads), so the sweep resumes
after interruption and the summary is recomputed from records + manifest (``sweep_from_run``): accuracy
with bootstrap CI, mean IoU, the failure decomposition (parse failure / boxed another known object / boxed
no object, or parse failure / mislocation where the samples do not list their objects) and an exact McNemar
test of each masked condition against the unmasked baseline on the same samples.

Scale-out. ``shard=Shard(i, n)`` grounds one shard's samples (``vrh_interp.core.shards``) into its own run folder;
``vrh_interp.experiments.merge.merge_runs`` joins the shards' folders and ``sweep_from_run`` reads the merged folder
(equal to the unsharded run's) without the model.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Iterator, Mapping, Sequence, TypeVar

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from vrh_interp.core.backends.base import backend_config, check_ablation_kinds
from vrh_interp.core.backends.select import backend_for, backend_type
from vrh_interp.core.boxes import Box
from vrh_interp.core._display import card_html, card_text
from vrh_interp.evaluation.grounding import encode_samples, ground_conditions
from vrh_interp.core.interventions import shared_image_prefix
from vrh_interp.evaluation.statistics import (QUANTILES, bootstrap_ci, empirical_p_value, mcnemar_exact,
                                              random_set_distribution, set_level_verdict, two_level_bootstrap_ci)
from vrh_interp.core.heads import HeadGeometry, HeadSet, HeadsLike
from vrh_interp.core.limits import check_prompts_fit
from vrh_interp.experiments.ks import KSpecError, check_ks, parse_ks  # noqa: F401 - re-exported: sweep.parse_ks, KSpecError
from vrh_interp.core.model import VLM, GroundingBatch
from vrh_interp.core.provenance import library_versions, model_provenance
from vrh_interp.core.published import PublishedHeadSet, check_geometry
from vrh_interp.core.runs import RecordLog, RunFolder, whole_run_manifest
from vrh_interp.experiments.declared import experiment
from vrh_interp.data.checks import GroundingSampleLike, as_box, check_samples
from vrh_interp.scoring.scores import HeadScores, ScoresTransferWarning
from vrh_interp.core.shards import Shard, shard_config
from vrh_interp.core.ablation_kinds import ABLATION_METHODS, DEFAULT_ABLATION_KIND, ablation_method
from vrh_interp.core.templates.ablation import ZERO_ABLATION, Ablation, AblationValues
from vrh_interp.evaluation.controls import (CONTROL_KINDS, DEFAULT_RANDOM_SEEDS, layer_matched_control, live_control,
                                           random_control)

SWEEP = experiment("sweep")  # its declaration: record log, record key, merge order

RECORD_COLUMNS: list[str] = ["sample_id", "condition", "kind", "k", "seed", "answer", "parsed", "box", "iou",
                             "other_object_iou"]
QUANTILE_COLUMNS: list[str] = [f"accuracy_q{round(100 * q):02d}" for q in QUANTILES]


@dataclass(frozen=True)
class Condition:
    """One masked condition. ``kind``: "baseline", "top", a control kind ("random", "matched") or a caller's
    own (cross-masking's "own" / "transferred", design-space variants); ``ablation`` is how the heads are
    removed ("zero": the paper's zero ablation; appended to the key only when not "zero")."""

    kind: str
    k: int
    seed: int | None
    heads: HeadSet
    ablation: str = "zero"

    @property
    def key(self) -> str:
        return (f"{self.kind}:k={self.k}" + (f":seed={self.seed}" if self.seed is not None else "")
                + (f":ablation={self.ablation}" if self.ablation != DEFAULT_ABLATION_KIND else ""))

    @classmethod
    def from_key(cls, key: str, heads: HeadSet) -> "Condition":
        """The condition whose ``key`` is ``key`` (as run folders record them: ``{key: heads}``)."""
        kind, k, *rest = key.split(":")
        names = [part.partition("=")[0] for part in rest]
        if k.startswith("k=") and names in ([], ["seed"], ["ablation"], ["seed", "ablation"]):
            fields = dict(part.split("=", 1) for part in rest)
            return cls(kind, int(k[2:]), int(fields["seed"]) if "seed" in fields else None, heads,
                       fields.get("ablation", DEFAULT_ABLATION_KIND))
        raise ValueError(f"{key!r} is not a condition key such as 'random:k=5:seed=1'")


def control_conditions(geometry: HeadGeometry, detected: HeadSet, k: int, top_k_set: HeadSet | None,
                       random_seeds: Sequence[int], *, matched: bool = True, exclude_first_layer: bool = False,
                       ablation: str = "zero", live: HeadSet | None = None) -> list[Condition]:
    """The random (then, with ``matched`` and a ``top_k_set``, layer-matched; then, with ``live``, live-head)
    control sets at one k, one per seed."""
    conditions = [Condition("random", k, seed, random_control(geometry, detected, k, seed,
                                                              exclude_first_layer=exclude_first_layer), ablation)
                  for seed in random_seeds]
    if matched and top_k_set is not None:
        conditions += [Condition("matched", k, seed, layer_matched_control(geometry, detected, top_k_set, seed),
                                 ablation) for seed in random_seeds]
    if live is not None:
        conditions += [Condition("live", k, seed, live_control(live, detected, k, seed), ablation)
                       for seed in random_seeds]
    return conditions


def largest_usable_k(ranking: HeadSet, geometry: HeadGeometry, *, matched: bool = True,
                     exclude_first_layer: bool = False) -> int:
    """The largest k whose controls can be drawn when the top k of ``ranking`` is the detected set: k random
    heads outside it (and, with ``matched``, in each layer as many heads outside it as it has there)."""
    for k in range(min(len(ranking), geometry.total_heads), 0, -1):
        top = ranking[:k]
        outside = [h for h in geometry.all_heads() if h not in top and not (exclude_first_layer and h.layer == 0)]
        if k > len(outside):
            continue
        if matched and any(2 * len(heads) > geometry.num_heads for heads in top.by_layer().values()):
            continue
        return k
    return 0


def sweep_conditions(ranking: HeadSet, geometry: HeadGeometry, ks: Sequence[int],
                     random_seeds: Sequence[int] = DEFAULT_RANDOM_SEEDS, *, exclude_first_layer: bool = False,
                     matched: bool = True, ablation: str = "zero", live: HeadSet | None = None) -> list[Condition]:
    """Baseline, then per k > 0 (ascending): top-k, the random sets, the layer-matched sets, with ``live`` (the
    census's live heads) the live-head sets, all masked with ``ablation`` (the baseline masks nothing and stays
    ``baseline:k=0`` whatever the kind)."""
    total = geometry.total_heads
    bad = [k for k in ks if not 0 <= k <= total]
    if bad:
        raise ValueError(f"k values {bad} out of range: the model has {total} heads")
    if len(set(ks)) != len(ks):
        raise ValueError(f"duplicate k values in {list(ks)}")
    short = [k for k in ks if k > len(ranking)]
    if short:  # ranking[:k] would mask fewer heads than its label says
        raise ValueError(f"k values {short} exceed the ranking's {len(ranking)} heads: pass ks up to "
                         f"{len(ranking)} (--ks), or a longer ranking")
    detected = ranking[: max(ks)] if ks else HeadSet()
    conditions = [Condition("baseline", 0, None, HeadSet())]  # masks nothing: the same under every ablation kind
    for k in sorted(k for k in ks if k > 0):
        conditions.append(Condition("top", k, None, ranking[:k], ablation))
        try:
            conditions += control_conditions(geometry, detected, k, ranking[:k], random_seeds, matched=matched,
                                             exclude_first_layer=exclude_first_layer, ablation=ablation, live=live)
        except ValueError as error:
            usable = largest_usable_k(ranking, geometry, matched=matched, exclude_first_layer=exclude_first_layer)
            raise ValueError(
                f"k={k} with the top {max(ks)} heads as the detected set: {error}. The largest usable k on this "
                f"model ({total} heads) is {usable} ({usable / total:.1%}): pass ks up to {usable} (--ks)"
                + (", or leave the layer-matched control out (matched=False, --no-matched)" if matched else "")
            ) from None
    return conditions


def other_object_iou(sample: GroundingSampleLike, box: Sequence[float] | None) -> float | None:
    """The largest IoU of a parsed box with any annotated object OTHER than the referent, or None when the box
    did not parse or the sample does not list its objects (``meta["object_boxes"]``, as the synthetic scenes
    do). The referent is ``meta["target_index"]`` when given, else every listed box equal to ``sample.box``.
    0.0 when the referent is the only listed object."""
    meta = getattr(sample, "meta", None) or {}
    boxes = meta.get("object_boxes")
    if box is None or boxes is None:
        return None
    target = meta.get("target_index")
    referent = as_box(sample.box)
    others = [as_box(b) for i, b in enumerate(boxes) if (i != target if target is not None else as_box(b) != referent)]
    parsed = Box(*(float(v) for v in box))
    return max((parsed.iou(other) for other in others), default=0.0)


def _set_outcomes(parts: Sequence[pd.DataFrame], column: str = "correct") -> np.ndarray:
    """(sets x samples) table of one column, sets aligned on the samples they all share."""
    series = [part.set_index("sample_id")[column] for part in parts]
    shared = [i for i in series[0].index if all(i in s.index for s in series[1:])]
    return np.array([s.loc[shared].to_numpy(dtype=float) for s in series]).reshape(len(series), len(shared))


def _clustered(parts: Sequence[pd.DataFrame], seed: int, resamples: int) -> tuple[float, float, dict[str, float]]:
    """Sets each answered on their own items (one per scene): the accuracy over all their items, its percentile
    interval resampling the sets (the clusters) with replacement; no quantiles (a set's accuracy on its few items
    is not a draw of the set-accuracy distribution)."""
    correct = [part["correct"].to_numpy(dtype=float) for part in parts]
    totals, sizes = np.array([c.sum() for c in correct]), np.array([c.size for c in correct], dtype=float)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(parts), size=(resamples, len(parts)))
    means = totals[picks].sum(axis=1) / sizes[picks].sum(axis=1)
    dist = {"sets": len(parts), "mean": float(totals.sum() / sizes.sum()), "sd": float("nan"),
            **{f"q{round(100 * q):02d}": float("nan") for q in QUANTILES}}
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975)), dist


def condition_rows(parts: Mapping[str, pd.DataFrame], conditions: Sequence[Condition], base: pd.Series,
                   total_heads: int | None, *, bootstrap_seed: int,
                   resamples: int) -> Iterator[tuple[Condition, dict[str, Any], dict[str, Any]]]:
    """Per condition with records (``parts[key]``, a boolean ``correct`` column): the columns every sweep
    summary's row starts with (the condition, ``k_fraction`` NaN when the model's head count is unknown, ``n``,
    the accuracy with its bootstrap interval over samples; the set-level columns ``sets``, ``accuracy_sd`` and
    the quantiles NaN, ``set_level_rows`` fills them) and the exact McNemar test of the same samples against
    ``base`` (baseline correctness by sample id; nothing lost or gained for the baseline itself)."""
    for cond in conditions:
        part = parts[cond.key]
        if part.empty:
            continue
        correct = part["correct"].to_numpy(dtype=bool)
        paired = mcnemar_exact(base.loc[part["sample_id"]].to_numpy(dtype=bool), correct) \
            if cond.kind != "baseline" else {"lost": 0, "gained": 0, "p_value": 1.0}
        low, high = bootstrap_ci(correct.astype(float), seed=bootstrap_seed, resamples=resamples)
        yield cond, {"key": cond.key, "condition": cond.kind, "k": cond.k,
                     "k_fraction": cond.k / total_heads if total_heads else float("nan"), "seed": cond.seed,
                     "ablation": cond.ablation, "n": len(correct), "sets": float("nan"),
                     "accuracy": float(correct.mean()), "accuracy_ci_low": low, "accuracy_ci_high": high,
                     "accuracy_sd": float("nan"), **{c: float("nan") for c in QUANTILE_COLUMNS}}, paired


def set_level_rows(rows: list[dict[str, Any]], parts: Mapping[str, pd.DataFrame], conditions: Sequence[Condition], *,
                   pooled: Callable[[pd.DataFrame], dict[str, Any]], bootstrap_seed: int = 0,
                   resamples: int = 2000) -> list[dict[str, Any]]:
    """``rows`` (one per condition, with ``key`` and ``accuracy``) plus, per (control kind, k, ablation), a
    ``seed="all"`` row of the sets' distribution; every non-control masked row gets ``p_vs_<control kind>``.

    ``parts`` maps condition keys to their records (with a boolean ``correct`` column); ``pooled(records)``
    gives the aggregate row's remaining columns from the sets' pooled records (descriptive rates). The
    aggregate's ``accuracy`` is the mean of the set accuracies, its interval the two-level bootstrap, and
    its paired-test columns are NaN: a McNemar test on pooled sets would count each sample once per set.
    """
    by_key = {row["key"]: row for row in rows}
    out = list(rows)
    groups: dict[tuple[str, int, str], list[Condition]] = {}
    for cond in conditions:
        if cond.kind in CONTROL_KINDS and cond.key in by_key:
            groups.setdefault((cond.kind, cond.k, cond.ablation), []).append(cond)
    for row in out:
        for kind in CONTROL_KINDS:
            row.setdefault(f"p_vs_{kind}", float("nan"))
    for (kind, k, ablation), members in groups.items():
        accuracies = [by_key[c.key]["accuracy"] for c in members]
        outcomes = _set_outcomes([parts[c.key] for c in members])
        if outcomes.shape[1] or len(members) == 1:
            low, high = two_level_bootstrap_ci(outcomes, seed=bootstrap_seed, resamples=resamples)
            dist = random_set_distribution(accuracies)
        else:  # one fresh set per scene (a partition of the items): clusters, not a distribution of set accuracies
            low, high, dist = _clustered([parts[c.key] for c in members], bootstrap_seed, resamples)
        template = by_key[members[0].key]
        aggregate = {column: float("nan") for column in template}
        aggregate.update({c: template[c] for c in ("condition", "k", "k_fraction", "ablation", "benchmark")
                          if c in template})
        aggregate.update(pooled(pd.concat([parts[c.key] for c in members])))
        suffix = f":ablation={ablation}" if ablation != DEFAULT_ABLATION_KIND else ""
        aggregate.update({"key": f"{kind}:k={k}:seed=all{suffix}",
                          "seed": "all", "sets": dist["sets"], "accuracy": dist["mean"], "accuracy_ci_low": low,
                          "accuracy_ci_high": high, "accuracy_sd": dist["sd"],
                          **{column: dist[column[len("accuracy_"):]] for column in QUANTILE_COLUMNS}})
        last = max(i for i, row in enumerate(out) if row["key"] in {c.key for c in members})
        out.insert(last + 1, aggregate)
        for cond in conditions:
            if cond.kind != "baseline" and cond.kind not in CONTROL_KINDS and cond.k == k \
                    and cond.ablation == ablation and cond.key in by_key:
                by_key[cond.key][f"p_vs_{kind}"] = empirical_p_value(by_key[cond.key]["accuracy"], accuracies) \
                    if np.isfinite(dist["q05"]) else float("nan")  # clustered sets: the rank test is the claim's
    return out


def summary_verdict(summary: pd.DataFrame, k: int, *, target: str = "top",
                    controls: Sequence[str] | None = None, alpha: float = 0.05) -> dict[str, Any]:
    """The 0.2 set-level rule "masking the ``target`` set at ``k`` is more harmful than each control's sets", kept
    for compatibility (deprecated): every verdict the library prints comes from ``evaluation.claims`` with the
    evidence of ``experiments.verdicts`` (per-item records, three outcomes); this one reads a summary only.

    ``summary`` is one model's ``SweepResult.summary()`` (or its CSV read back, or one benchmark's rows of a
    VQA summary). The control sets are the summary's per-set rows (``seed`` not "all"); ``controls=None``
    uses every control kind present at ``k``. Returns ``verdict`` and ``reason``
    (``statistics.set_level_verdict``), the ``target`` row and each control's aggregate row.
    """
    seeds = summary["seed"].astype(str)
    target_row = summary[(summary["condition"] == target) & (summary["k"] == k)]
    if len(target_row) != 1:
        raise ValueError(f"the summary has {len(target_row)} {target!r} rows at k={k}, expected 1")
    present = [c for c in CONTROL_KINDS if ((summary["condition"] == c) & (summary["k"] == k)).any()]
    kinds = present if controls is None else list(controls)
    sets = {kind: summary[(summary["condition"] == kind) & (summary["k"] == k) & (seeds != "all")]["accuracy"]
            .astype(float).tolist() for kind in kinds}
    aggregates = {kind: summary[(summary["condition"] == kind) & (summary["k"] == k) & (seeds == "all")]
                  for kind in kinds}
    row = target_row.iloc[0]
    verdict, reason = set_level_verdict(float(row["accuracy"]), float(row["p_value_vs_baseline"]), sets, alpha=alpha)
    return {"verdict": verdict, "reason": reason, "target": row,
            "controls": {kind: (frame.iloc[0] if len(frame) else None) for kind, frame in aggregates.items()}}


@dataclass
class SweepResult:
    records: pd.DataFrame
    conditions: list[Condition]
    iou_threshold: float
    total_heads: int | None = None  # for ``k_fraction``; NaN when unknown

    def summary(self, *, bootstrap_seed: int = 0, resamples: int = 2000) -> pd.DataFrame:
        """One row per condition (each control set its own row), then per (control kind, k) a ``seed="all"``
        row of the sets' distribution (module doc). Failure decomposition: ``parse_failure_rate``,
        ``mislocation_rate`` (parsed, wrong) split into ``other_object_rate`` (the box hits another annotated
        object at IoU >= the threshold) and ``no_object_rate``; these two are NaN for a condition where some
        mislocated sample does not list its objects (or its records predate the field)."""
        df = self.records.copy()
        df["correct"] = df["iou"] >= self.iou_threshold
        base = df[df["condition"] == "baseline:k=0"].set_index("sample_id")["correct"]
        parts = {cond.key: df[df["condition"] == cond.key] for cond in self.conditions}
        rows = [{**row, **self._rates(parts[cond.key]), "lost_vs_baseline": paired["lost"],
                 "gained_vs_baseline": paired["gained"], "p_value_vs_baseline": paired["p_value"]}
                for cond, row, paired in condition_rows(parts, self.conditions, base, self.total_heads,
                                                        bootstrap_seed=bootstrap_seed, resamples=resamples)]
        rows = set_level_rows(rows, parts, self.conditions, pooled=self._rates, bootstrap_seed=bootstrap_seed,
                              resamples=resamples)
        return pd.DataFrame(rows)

    def accuracy_table(self) -> pd.DataFrame:
        """Plain accuracy (IoU >= the threshold) per k (rows) and condition kind (columns), control sets pooled: a
        quick look, without the intervals and p-values of ``summary()``."""
        df = self.records.assign(correct=self.records["iou"] >= self.iou_threshold)
        table = df.pivot_table(index="k", columns="kind", values="correct", aggfunc="mean")
        return table[[kind for kind in dict.fromkeys(c.kind for c in self.conditions) if kind in table]]

    def _card(self) -> tuple[str, list[tuple[str, str]]]:
        sets = self._set_counts()
        table = self.accuracy_table()
        rows = [(f"k={k}", ", ".join(f"{kind} {row[kind]:.2f}" + (f" ({sets[kind]} sets)" if sets.get(kind, 0) > 1
                                                                   else "")
                                     for kind in table if row[kind] == row[kind]))  # NaN: kind not run at this k
                for k, row in table.iterrows()]
        samples = self.records["sample_id"].nunique()
        return (f"SweepResult: {samples} samples, {len(self.conditions)} conditions, accuracy = IoU >= "
                f"{self.iou_threshold:g} (summary() for intervals and p-values)", rows[:8])

    def __repr__(self) -> str:
        """The accuracy per k and condition kind in a few lines, not the records frame (``records``)."""
        return card_text(*self._card())

    def _repr_html_(self) -> str:
        """The title, then the accuracy per k (rows) and condition kind (columns), control sets pooled."""
        title, _ = self._card()
        kinds = ", ".join(f"{kind} {n} set{'s' if n > 1 else ''}" for kind, n in self._set_counts().items() if n)
        rows = [("controls", kinds)] if kinds else []
        table = self.accuracy_table().rename_axis(columns=None).reset_index()  # one header row, k a column
        return card_html(title, rows, table=table.to_html(index=False, na_rep="", float_format="{:.2f}".format))

    def _set_counts(self) -> dict[str, int]:
        return {kind: len({c.seed for c in self.conditions if c.kind == kind}) for kind in ("random", "matched")}

    def claims(self, *, seed: int = 0) -> Any:
        """The causal claim at every k > 0 against the control sets, judged by the claims rules
        (``experiments.verdicts.sweep_claims``) as an ``evaluation.table.ClaimsTable``: a notebook shows it whole
        (verdict, claim, estimate with its interval, the full reason), ``print`` gives the terminal text,
        ``.frame`` every column."""
        from vrh_interp.evaluation.table import ClaimsTable
        from vrh_interp.experiments.verdicts import sweep_claims

        return ClaimsTable(sweep_claims(self, seed=seed), title="SweepResult claims")

    def plot(self, title: str = "grounding accuracy vs masked heads", *, ax: Any = None) -> Any:
        """Accuracy against k, controls as bands (``viz.plots.k_sweep_curve`` of ``summary()``): a ``Figure`` a
        notebook shows as a picture, or drawn into ``ax`` (then its figure)."""
        from vrh_interp.viz.plots import k_sweep_curve

        return k_sweep_curve(self.summary(), title=title, ax=ax)

    def _rates(self, part: pd.DataFrame) -> dict[str, Any]:
        counts = failure_counts(part, self.iou_threshold)
        n = counts["n"]
        return {"n": n, "mean_iou": float(part["iou"].mean()),
                **{f"{name}_rate": counts[name] / n if n else float("nan") for name in FAILURE_CATEGORIES[1:]}}


FAILURE_CATEGORIES: tuple[str, ...] = ("correct", "parse_failure", "mislocation", "other_object", "no_object")


def failure_counts(records: pd.DataFrame, iou_threshold: float) -> dict[str, Any]:
    """The failure decomposition of some sweep records (columns ``parsed``, ``iou``, ``other_object_iou``):
    ``n``, then counts of ``correct`` (IoU >= threshold), ``parse_failure`` (no box), ``mislocation`` (a box,
    wrong), split into ``other_object`` (the box hits another annotated object at IoU >= the threshold) and
    ``no_object``. The split is NaN when some mislocated record does not know the other objects (samples
    without ``meta["object_boxes"]``, or records that predate the field): then only the two-way split holds."""
    correct = records["iou"].astype(float) >= iou_threshold
    parsed = records["parsed"].astype(bool)
    wrong = parsed & ~correct
    other = pd.to_numeric(records["other_object_iou"], errors="coerce") if "other_object_iou" in records \
        else pd.Series(float("nan"), index=records.index)
    known = not (wrong & other.isna()).any()
    hit = wrong & (other >= iou_threshold)
    return {"n": len(records), "correct": int(correct.sum()), "parse_failure": int((~parsed).sum()),
            "mislocation": int(wrong.sum()), "other_object": int(hit.sum()) if known else float("nan"),
            "no_object": int((wrong & ~hit).sum()) if known else float("nan")}


def sweep(vlm: VLM, eval_samples: Sequence[GroundingSampleLike], ranking: HeadScores | HeadsLike, *,
          ks: Sequence[int | str] | str = (0, 1, 3, 5, 10, 20),
          random_seeds: Sequence[int] = DEFAULT_RANDOM_SEEDS, matched: bool = True,
          detection_ids: Sequence[str] | None = None, exclude_first_layer: bool = False,
          iou_threshold: float = 0.5, batch_size: int = 8, max_new_tokens: int = 24,
          run_dir: str | Path | None = None, progress: bool = True,
          shard: Shard | None = None, ablation: str = "zero",
          ablation_values: AblationValues | None = None, max_batch_rows: int | None = None,
          live: HeadSet | None = None) -> SweepResult:
    """Mask the top-k heads of ``ranking``, ``len(random_seeds)`` random sets and (``matched``) as many
    layer-matched sets per k, and with ``live`` (the live heads of ``evaluation.census.run_census``) as many sets
    drawn from the live heads: a control that inert heads cannot carry. ``ks`` are counts or percentages of all
    heads (``parse_ks``); ``shard`` runs one shard (``run_conditions``). ``ablation``: "zero" (the paper's), "mean"
    or "resample", the latter two with ``ablation_values`` (``evaluation.grounding.ablation_values`` on the
    detection samples). Conditions are batched ``max_batch_rows`` rows per generation (``run_conditions``). A
    published ranking (``vrh_interp.core.published``) is checked against the model's grid
    (``published.check_geometry``) and its source is recorded as ``heads_source`` in the run folder's manifest.
    The model runs where the handle is placed (``run_conditions``). ``ranking``: a ``HeadScores`` or heads in any
    form ``HeadSet.coerce`` reads (a ``HeadSet``, ``"L3H2,L1H0"``, a list of ``Head`` / ``"L3H2"`` / ``(3, 2)``),
    best first."""
    if isinstance(ranking, HeadScores):
        detection_ids = list(detection_ids or []) + list(ranking.sample_ids)
        head_ranking = ranking.ranking()
    else:
        head_ranking = HeadSet.coerce(ranking, "sweep(ranking)")
    check_ks(ks)
    live = None if live is None else HeadSet.coerce(live, "sweep(live)")
    overlap = sorted(set(detection_ids or []) & {s.sample_id for s in eval_samples})
    if overlap:
        raise ValueError(
            f"{len(overlap)} evaluation samples were also used for detection (e.g. {overlap[:3]}): detection and "
            "evaluation samples must be disjoint (use vrh_interp.splits or different seeds)"
        )
    geometry = vlm.geometry
    transfer = ranking.transfer_to(model_provenance(vlm)) if isinstance(ranking, HeadScores) else None
    if transfer is not None:
        warnings.warn(transfer["note"], ScoresTransferWarning, stacklevel=2)
    check_geometry(head_ranking, geometry)
    heads_source = head_ranking.source.to_dict() if isinstance(head_ranking, PublishedHeadSet) else transfer
    counts = parse_ks(ks, geometry.total_heads) if isinstance(ks, str) or any(isinstance(k, str) for k in ks) \
        else list(ks)
    conditions = sweep_conditions(head_ranking, geometry, counts, list(random_seeds),
                                  exclude_first_layer=exclude_first_layer, matched=matched, ablation=ablation,
                                  live=live)
    return run_conditions(vlm, eval_samples, conditions, iou_threshold=iou_threshold, batch_size=batch_size,
                          max_new_tokens=max_new_tokens, run_dir=run_dir, progress=progress,
                          shard=shard, ablation_values=ablation_values, max_batch_rows=max_batch_rows,
                          heads_source=heads_source)


def ablation_for(kind: str, values: AblationValues | None, geometry: HeadGeometry | None = None) -> Ablation:
    """The ``Ablation`` of ``kind`` (a name of the registry, ``core.ablation_kinds``): a kind without reference
    values ("zero") ignores ``values``; "mean" and "resample" need them (checked against ``geometry`` when given)."""
    if kind not in ABLATION_METHODS:
        raise ValueError(f"unknown ablation kind {kind!r}: use one of {', '.join(ABLATION_METHODS)}")
    if not ablation_method(kind).needs_reference_values:
        return ZERO_ABLATION if kind == ZERO_ABLATION.kind else Ablation(kind)
    if values is None:
        raise ValueError(f"{kind} ablation needs reference outputs: pass ablation_values=ablation_values(vlm, "
                         "detection_samples) (vrh_interp.evaluation.grounding; the CLI computes them for --ablation)")
    if geometry is not None:
        values.check(geometry)
    return Ablation(kind, values)


def head_signature(cond: Condition) -> tuple[Any, ...]:
    """What decides a condition's answers: its heads as a set and the ablation kind (not its name)."""
    return (frozenset(cond.heads), cond.ablation)


DEFAULT_BATCH_TOKENS = 1 << 16
"""Default memory budget of one condition-batched pass: rows x (prompt + new tokens) <= 65,536 tokens."""
DEFAULT_MAX_BATCH_ROWS = 256
"""... and at most this many rows, whatever the sequence length."""

S = TypeVar("S")
A = TypeVar("A")


def batch_rows(sequence_tokens: int, max_batch_rows: int | None = None) -> int:
    """Rows one condition-batched pass may hold: ``max_batch_rows`` when given, else as many as fit
    ``DEFAULT_BATCH_TOKENS`` tokens of ``sequence_tokens`` each (prompt + new tokens), at most
    ``DEFAULT_MAX_BATCH_ROWS``."""
    if max_batch_rows is not None:
        if max_batch_rows < 1:
            raise ValueError("max_batch_rows must be >= 1")
        return max_batch_rows
    return max(1, min(DEFAULT_MAX_BATCH_ROWS, DEFAULT_BATCH_TOKENS // max(1, sequence_tokens)))


def conditions_per_pass(samples: int, sequence_tokens: int, max_batch_rows: int | None = None) -> int:
    """Conditions packed into one generation over a batch of ``samples``: ``batch_rows // samples`` (at least 1:
    a batch bigger than the budget still runs one condition at a time)."""
    return max(1, batch_rows(sequence_tokens, max_batch_rows) // max(1, samples))


def condition_passes(chunks: Iterable[Sequence[S]], conditions: Sequence[Condition], *,
                     unit: Callable[[S], Hashable], done: set[tuple[Hashable, str]],
                     known: dict[tuple[Any, ...], dict[Hashable, A]],
                     answer: Callable[[Sequence[S], Sequence[Condition]], Sequence[Sequence[A]]],
                     per_pass: Callable[[Sequence[S]], int],
                     record: Callable[[S, Condition, A], dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """The experiment planner: every (sample, condition) answer, conditions packed into batched passes.

    For each chunk of samples (a batch, in order), the conditions still lacking records there are reduced to
    their distinct head signatures (``head_signature``: conditions masking the same heads the same way are
    answered once, also across resumes through ``known``) and packed, in order, ``per_pass(samples)`` at a
    time into passes; ``answer(samples, conditions)`` answers one pass (one batched generation: rows =
    conditions x samples) and returns, per condition, one answer per sample. After each pass this yields the
    records that became complete, conditions in order (``record(sample, condition, answer)``), so a caller that
    appends each yielded list to its log in one write loses at most one pass when killed. ``done`` holds the
    (``unit(sample)``, condition key) pairs already recorded; ``known`` maps signatures to answers by unit and
    is filled in."""
    signature = {c.key: head_signature(c) for c in conditions}
    for chunk in chunks:
        todo = {c.key: [s for s in chunk if (unit(s), c.key) not in done] for c in conditions}
        pending = [c for c in conditions if todo[c.key]]
        if not pending:
            continue
        fresh: dict[tuple[Any, ...], list[S]] = {}  # signature -> samples to answer, in chunk order
        first: dict[tuple[Any, ...], Condition] = {}
        for cond in pending:
            sig = signature[cond.key]
            first.setdefault(sig, cond)
            have = known.setdefault(sig, {})
            wanted = {unit(s) for s in fresh.get(sig, [])} | {unit(s) for s in todo[cond.key] if unit(s) not in have}
            fresh[sig] = [s for s in chunk if unit(s) in wanted]
        passes: list[tuple[list[S], list[tuple[Any, ...]]]] = []
        for sig, samples in fresh.items():
            if not samples:
                continue
            same = bool(passes) and [unit(s) for s in passes[-1][0]] == [unit(s) for s in samples]
            if same and len(passes[-1][1]) < max(1, per_pass(samples)):
                passes[-1][1].append(sig)
            else:
                passes.append((samples, [sig]))
        emitted = 0

        def complete() -> list[dict[str, Any]]:
            nonlocal emitted
            out = []
            while emitted < len(pending):
                cond = pending[emitted]
                have = known[signature[cond.key]]
                if any(unit(s) not in have for s in todo[cond.key]):
                    break
                out += [record(s, cond, have[unit(s)]) for s in todo[cond.key]]
                emitted += 1
            return out

        for samples, sigs in passes:
            answers = answer(samples, [first[sig] for sig in sigs])
            for sig, block in zip(sigs, answers):
                known[sig].update({unit(s): a for s, a in zip(samples, block)})
            yield complete()
        tail = complete()
        if tail:
            yield tail
        assert emitted == len(pending), "condition_passes: a condition was left unanswered"


class _GroundingPasses:
    """``answer`` / ``per_pass`` of ``condition_passes`` for grounding: each chunk is encoded once and replicated
    per condition of a pass (``ground_conditions``)."""

    def __init__(self, vlm: VLM, ablations: Mapping[str, Ablation], *, max_new_tokens: int,
                 max_batch_rows: int | None) -> None:
        self.vlm, self.ablations, self.max_new_tokens = vlm, ablations, max_new_tokens
        self.max_batch_rows = max_batch_rows
        self._key: tuple[str, ...] | None = None
        self._batch: GroundingBatch | None = None

    def _encode(self, samples: Sequence[GroundingSampleLike]) -> GroundingBatch:
        key = tuple(s.sample_id for s in samples)
        if key != self._key or self._batch is None:
            self._batch, self._key = encode_samples(self.vlm, samples), key
        return self._batch

    def per_pass(self, samples: Sequence[GroundingSampleLike]) -> int:
        return conditions_per_pass(len(samples), self._encode(samples).prompt_length + self.max_new_tokens,
                                   self.max_batch_rows)

    def split(self, chunk: Sequence[GroundingSampleLike], signatures: int) -> list[list[GroundingSampleLike]]:
        """The chunk as the batches its passes run on. Where the backend shares layers (``shares_layers``: a
        condition's layers below its first masked layer come from the unmasked rows of the same pass) and the chunk
        is too big for all its ``signatures`` (distinct head sets) to fit one pass, it is cut into whole images (a
        scene's referents stay together: they share their image prefix) packed while all the conditions still fit
        one pass: few images x many conditions, so each pass holds its unmasked rows and shares from them, where a
        big chunk would run one condition per pass and share nothing. Answers do not depend on the cut (every row's
        answer is its own; tested)."""
        kinds = sorted({a.kind for a in self.ablations.values()})
        if len(chunk) < 2 or not backend_for(self.vlm).shares_layers(kinds) or self.per_pass(chunk) >= signatures:
            return [list(chunk)]
        batch = self._encode(chunk)
        prefix = shared_image_prefix(self.vlm, batch.encoding)
        image_of = prefix.image_of if prefix is not None else list(range(len(chunk)))
        groups: dict[int, list[GroundingSampleLike]] = {}
        for sample, image in zip(chunk, image_of):
            groups.setdefault(image, []).append(sample)
        tokens = batch.prompt_length + self.max_new_tokens  # the chunk's: no cut is longer
        out: list[list[GroundingSampleLike]] = []
        for group in groups.values():
            if out and conditions_per_pass(len(out[-1]) + len(group), tokens, self.max_batch_rows) >= signatures:
                out[-1].extend(group)
            else:
                out.append(list(group))
        return out

    def answer(self, samples: Sequence[GroundingSampleLike],
               conditions: Sequence[Condition]) -> list[list[dict[str, Any]]]:
        outcomes = ground_conditions(self.vlm, samples, [(c.heads, self.ablations[c.ablation]) for c in conditions],
                                     max_new_tokens=self.max_new_tokens,
                                     batch=self._encode(samples))
        return [[{**o.as_dict(), "other_object_iou": other_object_iou(s, o.box)} for s, o in zip(samples, block)]
                for block in outcomes]


def canonical_log_order(log: RecordLog, key: Callable[[Mapping[str, Any]], Any]) -> None:
    """Rewrite ``log`` (atomically: a temporary file, then a rename) in the order ``key`` gives, when its records
    are not in that order already. Condition-batched runs append pass by pass (chunk, then condition); a finished
    run folder keeps the order of a one-condition-at-a-time run (condition, then sample), so folders do not
    depend on packing, interruptions or shards (``merge_runs`` writes the same bytes)."""
    records = log.read()
    ordered = sorted(records, key=key)
    if ordered == records:
        return
    tmp = log.path.with_name(log.path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(dict(r), sort_keys=True) + "\n" for r in ordered))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, log.path)


def run_passes(log: RecordLog | None, chunks: Sequence[Sequence[S]], conditions: Sequence[Condition], *,
               unit: Callable[[S], Hashable], record_unit: Callable[[Mapping[str, Any]], Hashable],
               answer_of: Callable[[Mapping[str, Any]], A], passes: Any,
               record: Callable[[S, Condition, A], dict[str, Any]],
               canonical: Callable[[Mapping[str, Any]], Any], desc: str, progress: bool,
               skip: frozenset[tuple[Hashable, str]] = frozenset()) -> list[dict[str, Any]]:
    """The loop every condition experiment runs (grounding sweeps, design space, head scan, cross-masking, the VQA
    sweep): the records already in ``log`` are kept (resume) and their answers reused by every condition masking
    the same heads (``head_signature``); the rest are answered pass by pass (``condition_passes`` with
    ``passes.answer`` / ``passes.per_pass``) and appended after each pass; the finished log and the returned
    records are in ``canonical`` order (``canonical_log_order``). ``unit`` names a sample, ``record_unit`` the
    same name read from a record, ``answer_of`` what ``record`` was made from. ``passes.split(chunk, distinct)``
    cuts a chunk into the batches its passes run on (``_GroundingPasses.split``), given the number of distinct head
    sets. ``skip``: (unit, condition key) pairs the design does not ask for (a condition answered on some samples
    only: ``run_conditions``' ``items_of``)."""
    records: list[dict[str, Any]] = log.read() if log else []
    signature = {c.key: head_signature(c) for c in conditions}
    done = {(record_unit(r), r["condition"]) for r in records}
    recorded = len(done)
    done |= skip
    known: dict[tuple[Any, ...], dict[Hashable, A]] = {}
    for row in records:
        if row["condition"] in signature:
            known.setdefault(signature[row["condition"]], {})[record_unit(row)] = answer_of(row)
    bar = tqdm(total=len(conditions) * sum(map(len, chunks)) - len(skip), initial=recorded, desc=desc,
               disable=not progress, unit="answer", leave=False)  # one line while it runs, none after
    distinct = len(set(signature.values()))
    batches = (part for chunk in chunks for part in passes.split(chunk, distinct))
    for new in condition_passes(batches, conditions, unit=unit, done=done, known=known, answer=passes.answer,
                                per_pass=passes.per_pass, record=record):
        if log is not None:
            log.append(new)
        records.extend(new)
        bar.update(len(new))
    bar.close()
    if log is not None:
        canonical_log_order(log, canonical)
    return sorted(records, key=canonical)


def run_conditions(vlm: VLM, eval_samples: Sequence[GroundingSampleLike], conditions: Sequence[Condition], *,
                   iou_threshold: float = 0.5, batch_size: int = 8, max_new_tokens: int = 24,
                   run_dir: str | Path | None = None, progress: bool = True, shard: Shard | None = None,
                   ablation_values: AblationValues | None = None,
                   max_batch_rows: int | None = None, heads_source: Mapping[str, Any] | None = None,
                   items_of: Mapping[str, Sequence[str]] | None = None) -> SweepResult:
    """Greedy grounding of every sample under every condition, resumable through ``run_dir``.

    Each condition masks its heads with its ``ablation`` kind; "mean" and "resample" need ``ablation_values``
    (the reference outputs, ``evaluation.grounding.ablation_values`` on the detection samples), whose
    fingerprint the run folder records, so resuming with other values is refused.

    Condition batching (``condition_passes``): samples go in batches of ``batch_size``; each batch is encoded
    once and replicated across as many conditions as fit ``max_batch_rows`` rows (default: ``batch_rows``, a
    65,536-token budget, at most 256 rows), every row masked with its own condition's heads and kind
    (``templates.ablation.RowHeadAblation``), and one greedy generation answers them all. The answers equal
    those of one condition at a time (tested exactly); ``max_batch_rows=batch_size`` runs one condition per
    generation. Where the backend shares layers below each condition's first masked layer (``core.layer_sharing``)
    and a batch cannot hold all the conditions in one pass, it is cut into whole images first
    (``_GroundingPasses.split``), so that the passes hold few images and many conditions. Records are appended
    after every pass (a killed run redoes at most one pass) and the finished
    log is put in condition, then sample order (``canonical_log_order``).

    Conditions that mask the same head set with the same ablation (independent control draws repeat sets
    on small models) are answered once: a later one's records copy the earlier one's answers. Each record
    also stores ``other_object_iou`` (``other_object_iou``) for the failure decomposition.

    With ``shard``, only that shard's samples (``Shard.select``) are grounded and the result holds their
    records only; merge the shard folders with ``vrh_interp.experiments.merge.merge_runs`` and read the merged folder
    with ``sweep_from_run`` for the full result. ``heads_source`` (where the masked heads come from, e.g. a
    published list: ``PublishedSource.to_dict``) is recorded in the manifest when given.

    The handle's backend (``vlm.on(backend=...)``; ``backend_for``) generates the answers; one other than nnsight is
    recorded in the manifest, so a run folder never mixes backends.

    ``items_of`` (condition key -> sample ids) answers those conditions on those samples only (the clustered
    design: one fresh control set per scene, ``experiments.designs``); the others on every sample. It is part of
    the run's manifest, so a folder is resumed only with the same assignment.
    """
    check_samples(eval_samples, minimum=1, what="evaluation samples")
    check_prompts_fit(vlm, eval_samples, max_new_tokens)
    if not 0 < iou_threshold <= 1:
        raise ValueError("iou_threshold must be in (0, 1]")
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    if max_batch_rows is not None and max_batch_rows < 1:
        raise ValueError("max_batch_rows must be >= 1")
    keys = [c.key for c in conditions]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate conditions: {keys}")
    if "baseline:k=0" not in keys:
        raise ValueError("conditions must include the unmasked baseline (Condition('baseline', 0, None, HeadSet()))")
    check_ablation_kinds(backend_type(vlm), [c.ablation for c in conditions if len(c.heads)])  # before any copy
    all_ids = [s.sample_id for s in eval_samples]
    items_of = {key: sorted(set(ids)) for key, ids in (items_of or {}).items()}
    unknown = sorted(set(items_of) - set(keys)) + sorted({i for ids in items_of.values() for i in ids} - set(all_ids))
    if unknown:
        raise ValueError(f"items_of names conditions or samples the sweep does not have: {unknown[:5]}")
    if any(not ids for ids in items_of.values()):
        raise ValueError("items_of gives a condition no samples: leave the condition out instead")
    runner = backend_for(vlm)
    ablations = {kind: ablation_for(kind, ablation_values, vlm.geometry)
                 for kind in sorted({c.ablation for c in conditions})}
    config = {"kind": SWEEP.name, "model": model_provenance(vlm), "sample_ids": [s.sample_id for s in eval_samples],
              "conditions": {c.key: c.heads.to_list() for c in conditions}, "max_new_tokens": max_new_tokens,
              "libraries": {k: v for k, v in library_versions().items() if k in ("transformers", "torch")}}
    if ablation_values is not None:  # only when given: folders of zero-ablation runs keep their manifests
        config["ablation_values"] = ablation_values.fingerprint()
    if heads_source is not None:
        config["heads_source"] = dict(heads_source)
    if items_of:
        config["items_of"] = items_of
    config.update(backend_config(runner))
    folder = RunFolder(run_dir, shard_config(config, shard, batch_size)) if run_dir is not None else None
    mine = shard.select(eval_samples, batch_size) if shard is not None else list(eval_samples)
    outcome_fields = ("sample_id", "answer", "parsed", "box", "iou", "other_object_iou")

    def make_record(sample: GroundingSampleLike, cond: Condition, known: Mapping[str, Any]) -> dict[str, Any]:
        return {**{f: known.get(f) for f in outcome_fields}, "condition": cond.key, "kind": cond.kind, "k": cond.k,
                "seed": cond.seed}

    passes = _GroundingPasses(vlm, ablations, max_new_tokens=max_new_tokens,
                              max_batch_rows=max_batch_rows)
    chunks = [mine[start: start + batch_size] for start in range(0, len(mine), batch_size)]
    order = {c.key: i for i, c in enumerate(conditions)}
    position = {s.sample_id: i for i, s in enumerate(eval_samples)}
    records = run_passes(SWEEP.open_log(folder) if folder else None, chunks, conditions,
                         unit=lambda s: s.sample_id, record_unit=lambda r: r["sample_id"], answer_of=lambda r: r,
                         passes=passes, record=make_record,
                         canonical=lambda r: (order[r["condition"]], position[r["sample_id"]]),
                         desc="sweep: masked grounding", progress=progress,
                         skip=frozenset((s.sample_id, key) for key, ids in items_of.items() for s in mine
                                        if s.sample_id not in set(ids)))
    return SweepResult(records=_records_frame(records, conditions, [s.sample_id for s in eval_samples]),
                       conditions=list(conditions), iou_threshold=iou_threshold,
                       total_heads=vlm.geometry.total_heads)


def total_heads_of(config: Mapping[str, Any]) -> int | None:
    """The head count a run folder's manifest records (``model.geometry``), None when it does not."""
    geometry = (config.get("model") or {}).get("geometry") or {}
    return geometry["layers"] * geometry["heads"] if {"layers", "heads"} <= set(geometry) else None


def sweep_from_run(run_dir: str | Path, *, iou_threshold: float = 0.5) -> SweepResult:
    """The result of a complete sweep run folder (e.g. merged shards), read without the model: what ``sweep``
    or ``run_conditions`` on the same samples and conditions returns. Every condition's heads come from the
    manifest, every answer from the records: the whole summary is recomputed from them."""
    run_dir = Path(run_dir)
    config = whole_run_manifest(run_dir, SWEEP.name, "a sweep")
    records = SWEEP.read_log(run_dir).read()
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
                       iou_threshold=iou_threshold, total_heads=total_heads_of(config))


def condition_order(records: Sequence[dict[str, Any]]) -> list[str]:
    """Condition keys in the order a run evaluated them: first appearance in its log (a run folder's manifest
    keeps conditions as a key-sorted mapping; a run appends condition after condition, also when resumed)."""
    return list(dict.fromkeys(r["condition"] for r in records))


def _records_frame(records: Sequence[dict[str, Any]], conditions: Sequence[Condition],
                   sample_ids: Sequence[str]) -> pd.DataFrame:
    """Records as a frame in condition order, then sample order (the order does not depend on resumes).
    Records written before ``other_object_iou`` existed read as NaN there."""
    frame = pd.DataFrame(list(records), columns=RECORD_COLUMNS)
    frame["box"] = frame["box"].map(lambda b: None if b is None else tuple(float(v) for v in b))
    frame["other_object_iou"] = pd.to_numeric(frame["other_object_iou"], errors="coerce").astype(float)
    order = {c.key: i for i, c in enumerate(conditions)}
    ids = {sample_id: i for i, sample_id in enumerate(sample_ids)}
    frame = frame.assign(_c=frame["condition"].map(order), _s=frame["sample_id"].map(ids))
    return frame.sort_values(["_c", "_s"]).drop(columns=["_c", "_s"]).reset_index(drop=True)
