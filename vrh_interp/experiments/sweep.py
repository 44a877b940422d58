"""``sweep``: grounding accuracy with the top-k heads masked vs control head sets (the paper's causal test).

Controls. Per k, ``random_seeds`` (default 20) head sets of each control kind, every one drawn with its own
seeded generator from the heads OUTSIDE the detected set (the top max(ks) heads of the ranking):

* ``random`` (the paper's): k heads uniformly, optionally also excluding first-layer heads (the paper's DPO
  control). For one seed the sets are nested in k (the first k of one seeded permutation), as the top-k are.
* ``matched`` (``layer_matched_control``): as many heads in each layer as the top-k set has there. Early
  layers can be the most harmful to mask whatever the heads do, so a uniform control mixes "retrieval" with
  "breaks everything"; the layer-matched one separates them.

Statistics (``experiments.condition_stats``, over ``evaluation.statistics``). The unit of a control is the head
set: ``SweepResult.summary`` has a row per set and, per (control kind, k), a ``seed="all"`` row with the
distribution of the sets' accuracies (mean, sd, quantiles) and a two-level bootstrap interval for their mean; each
top-k row carries the empirical p-value against each control's sets at its k (``p_vs_random``, ``p_vs_matched``).
``condition_stats.summary_verdict`` judges "top-k is more harmful than both controls" with
``statistics.set_level_verdict``; no verdict uses an interval of pooled samples.

k as a fraction. ``ks`` takes counts or percentages of all heads (``experiments.ks.parse_ks``: ``"0,1%,2.5%,5"``); the
summary shows ``k`` and ``k_fraction``.

Protocol. Detection and evaluation samples must be disjoint: passing the ``HeadScores`` (which carries
its sample ids) or ``detection_ids`` makes an overlap an error. Every (sample, condition) outcome is a
record in the run folder (``manifest.json`` maps each condition key to its heads), so the sweep resumes
after interruption and the summary is recomputed from records + manifest (``sweep_from_run``): accuracy
with bootstrap CI, mean IoU, the failure decomposition (parse failure / boxed another known object / boxed
no object, or parse failure / mislocation where the samples do not list their objects) and an exact McNemar
test of each masked condition against the unmasked baseline on the same samples.

Scale-out. ``shard=Shard(i, n)`` grounds one shard's samples (``vrh_interp.core.bookkeeping.shards``) into its own run
folder; ``vrh_interp.experiments.merge.merge_runs`` joins the shards' folders and ``sweep_from_run`` reads the merged
folder (equal to the unsharded run's) without the model.

This module is the grounding sweep only; what other condition experiments share with it lives apart: the
conditions and their controls (``experiments.conditions``), the pass engine (``experiments.passes``) and the
statistics over condition outcomes (``experiments.condition_stats``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from vrh_interp.core.execution.backends.base import backend_config, check_ablation_kinds
from vrh_interp.core.execution.backends.select import backend_for, backend_type
from vrh_interp.core.description.boxes import Box
from vrh_interp.core._display import card_html, card_text
from vrh_interp.evaluation.grounding import encode_samples, ground_conditions
from vrh_interp.core.execution.interventions import shared_image_prefix
from vrh_interp.core.description.heads import HeadGeometry, HeadSet, HeadsLike
from vrh_interp.core.execution.limits import check_prompts_fit
from vrh_interp.experiments.ks import check_ks, parse_ks
from vrh_interp.core.description.model import VLM, GroundingBatch
from vrh_interp.core.bookkeeping.provenance import library_versions, model_provenance
from vrh_interp.core.description.published import PublishedHeadSet, check_geometry
from vrh_interp.core.bookkeeping.runs import RunFolder, whole_run_manifest, write_atomic
from vrh_interp.experiments.conditions import Condition, ablation_for, largest_usable_k, sweep_conditions
from vrh_interp.experiments.condition_stats import condition_rows, set_level_rows
from vrh_interp.experiments.declared import experiment
from vrh_interp.experiments.builtin_specs import DEFAULT_KS, SweepSpec, needs_reference_values
from vrh_interp.experiments.passes import conditions_per_pass, run_passes
from vrh_interp.data.checks import GroundingSampleLike, as_box, check_samples
from vrh_interp.scoring.scores import HeadScores, ScoresTransferWarning
from vrh_interp.core.bookkeeping.shards import Shard, shard_config
from vrh_interp.core.execution.templates.ablation import Ablation, AblationValues
from vrh_interp.evaluation.controls import DEFAULT_RANDOM_SEEDS

SWEEP = experiment("sweep")  # its declaration: record log, record key, merge order

RECORD_COLUMNS: list[str] = ["sample_id", "condition", "kind", "k", "seed", "answer", "parsed", "box", "iou",
                             "other_object_iou"]


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
    published ranking (``vrh_interp.core.description.published``) is checked against the model's grid
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
    generation. Where the backend shares layers below each condition's first masked layer
    (``core.execution.layer_sharing``) and a batch cannot hold all the conditions in one pass, it is cut into whole
    images first (``_GroundingPasses.split``), so that the passes hold few images and many conditions. Records are
    appended after every pass (a killed run redoes at most one pass) and the finished
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


# ---------------------------------------------------------------------------------------- the `sweep` experiment

def reference_values(spec: Any, vlm: VLM, scores: HeadScores | None, folder: Path) -> Any:
    """Mean / resample ablation: the reference outputs on the detection samples the scores were computed on (those
    of ``spec.detect_data`` whose ids the scores file lists; all of them for heads given without a scores file),
    saved as ``folder/ablation_values.pt``; None for zero ablation."""
    if not needs_reference_values(spec.ablation):
        return None
    from vrh_interp.data.sources import load_data
    from vrh_interp.evaluation.grounding import ablation_values

    detection = list(load_data(spec.detect_data))
    if scores is not None:
        wanted = set(scores.sample_ids)
        detection = [s for s in detection if s.sample_id in wanted]
        if not wanted or len(detection) != len(wanted):
            raise ValueError(f"--ablation {spec.ablation} takes its reference outputs from the detection samples, "
                             f"but --detect-data {spec.detect_data} holds {len(detection)} of the {len(wanted)} "
                             f"samples the scores file {spec.scores} was computed on: pass the --data of its `vrh "
                             "detect` run as --detect-data")
    values = ablation_values(vlm, detection, batch_size=spec.batch_size, progress=spec.progress)
    folder.mkdir(parents=True, exist_ok=True)
    values.save(folder / "ablation_values.pt")
    return values


def fitted_ks(spec: SweepSpec, ranking: HeadSet, geometry: HeadGeometry) -> str:
    """``spec.ks``, or the default grid without the k whose controls cannot be drawn on this model (too few heads
    outside the top k, ``conditions.largest_usable_k``), saying so on stderr."""
    if spec.ks is not None:
        return spec.ks
    usable = largest_usable_k(ranking, geometry, matched=spec.matched, exclude_first_layer=spec.exclude_first_layer)
    ks = [k for k in map(int, DEFAULT_KS.split(",")) if k <= usable]
    if len(ks) < len(DEFAULT_KS.split(",")):
        import sys
        import textwrap

        print(textwrap.fill(f"note: default --ks {DEFAULT_KS} trimmed to {','.join(map(str, ks))}: on this model "
                            f"({geometry.total_heads} heads) the largest k whose random and layer-matched sets fit "
                            f"outside the top k is {usable}; pass --ks to choose", 100), file=sys.stderr)
    return ",".join(map(str, ks))


def live_pool_for(vlm: VLM, samples: Sequence[Any], ranking: HeadSet, ks: str | Sequence[int], folder: Path, *,
                  random_seeds: Sequence[int], matched: bool = True, exclude_first_layer: bool = False,
                  max_new_tokens: int = 24, say: Callable[[str], None] | None = None) -> Any:
    """The live heads outside the top max(k) for the live-head control sets: the census of the first evaluation
    samples (``evaluation.census.live_pool``), kept in ``folder`` so a rerun or another shard reads the same pool.
    None on a remote model (the census runs the model here; said), when no k > 0 is asked, or when the ranking's
    heads are off the model's grid (the sweep refuses them with its own message). A k whose random or matched sets
    cannot be drawn fails here, as in the sweep, before the census runs or writes. The one place the CLI, the
    grid and ``reproduce`` draw the pool."""
    from vrh_interp.evaluation.census import live_pool

    say = say or (lambda line: None)
    if vlm.remote:
        say("note: no live-head control on a remote model (the head census runs the model here)")
        return None
    counts = parse_ks(ks, vlm.geometry.total_heads) if isinstance(ks, str) else list(ks)
    if max(counts, default=0) == 0:
        return None
    try:
        check_geometry(ranking, vlm.geometry)
    except ValueError:
        return None
    sweep_conditions(ranking, vlm.geometry, counts, random_seeds, matched=matched,
                     exclude_first_layer=exclude_first_layer)
    return live_pool(vlm, samples, ranking, max(counts), folder, max_new_tokens=max_new_tokens, say=say)[1]


def run(spec: SweepSpec, vlm: VLM, folder: Path) -> SweepResult:
    """``vrh sweep`` / a grid's sweep cell: the sweep of ``spec`` into ``folder`` (and ``sweep_summary.csv``)."""
    import sys

    from vrh_interp.core.description.published import parse_heads
    from vrh_interp.data.sources import load_data

    heads = parse_heads(spec.vrhs) if spec.vrhs else None
    scores = HeadScores.load(spec.scores) if heads is None else None
    samples = load_data(spec.data)
    values = reference_values(spec, vlm, scores, folder)
    ranking = heads if heads is not None else scores.ranking()
    ks = fitted_ks(spec, ranking, vlm.geometry)
    live = None
    if spec.live:
        def say(line: str) -> None:  # the census lines: to stderr, or stdout after the spec's prefix
            if spec.progress and spec.note_prefix is None:
                print(line, file=sys.stderr)
            elif spec.progress:
                print(spec.note_prefix + line)

        live = live_pool_for(vlm, samples, ranking, ks, Path(spec.census or folder), random_seeds=spec.control_seeds(),
                             matched=spec.matched, exclude_first_layer=spec.exclude_first_layer,
                             max_new_tokens=spec.max_new_tokens, say=say)
    result = sweep(vlm, samples, heads if heads is not None else scores, ks=ks, random_seeds=spec.control_seeds(),
                   matched=spec.matched, exclude_first_layer=spec.exclude_first_layer, iou_threshold=spec.iou,
                   batch_size=spec.batch_size, max_new_tokens=spec.max_new_tokens, run_dir=folder, shard=spec.shard,
                   ablation=spec.ablation, ablation_values=values, live=live, progress=spec.progress,
                   max_batch_rows=spec.max_batch_rows)
    if spec.shard is None:
        write_atomic(folder / "sweep_summary.csv", result.summary().to_csv(index=False))
    return result


def restrict(result: SweepResult, sample_ids: Sequence[str], keep: Callable[[Condition], bool]) -> SweepResult:
    """The records of ``result`` on ``sample_ids`` under the conditions ``keep`` accepts (the baseline always); a
    condition with no records there (a scene's own set, ``designs.scene_design``) is left out."""
    records = result.records
    records = records[records["sample_id"].isin(set(sample_ids))]
    present = set(records["condition"])
    conditions = [c for c in result.conditions if c.kind == "baseline" or (keep(c) and c.key in present)]
    records = records[records["condition"].isin({c.key for c in conditions})]
    return SweepResult(records.reset_index(drop=True), conditions, result.iou_threshold, result.total_heads)
