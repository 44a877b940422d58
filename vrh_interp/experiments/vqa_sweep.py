"""``vqa_sweep``: VQA accuracy per benchmark with a head set masked vs control head sets (the paper's Table 3).

Conditions: the unmasked baseline, the given head set (``heads``, e.g. the top-20 VRHs detected on RefCOCO)
and, per seed (default 20 seeds), ``len(heads)`` random heads (``evaluation.controls.random_control``, optionally
excluding layer 0) and, with ``matched``, as many heads per layer as ``heads`` has
(``evaluation.controls.layer_matched_control``), all drawn outside ``detected`` (default: ``heads``). Heads are
ablated at every generation step (zero by default; ``ablation="mean" | "resample"`` with ``ablation_values``;
greedy decoding, the model's chat template via ``vqa_prompt``); each response is scored by the sample's
deterministic scorer (``vrh_interp.data.datasets.vqa``). Conditions masking the same head set are answered once
(the later ones copy the answers). Conditions are batched like the grounding sweep's
(``experiments.passes.condition_passes``): each batch of one benchmark's questions is encoded once and replicated
across as many conditions as ``max_batch_rows`` allows, each row masked with its own heads, one generation per
pass; answers equal one condition at a time exactly.

Every (benchmark, sample, condition) answer is a record in ``run_dir`` (resumable like the grounding sweep).
``summary()`` gives one row per benchmark x condition with bootstrap CIs and an exact McNemar test against
the baseline on the same samples, plus per benchmark and control kind a ``seed="all"`` row with the
set-level statistics of the grounding sweep (mean, sd and quantiles of the sets' accuracies, two-level
bootstrap interval) and, on the ``top`` row, the empirical p-values ``p_vs_random`` / ``p_vs_matched``;
``table()`` lays the numbers out as Table 3: rows Baseline / Random / Layer-matched / VRH (control rows:
mean set accuracy and its two-level interval), columns benchmarks, values in percent.

``shard=Shard(i, n)`` answers one shard of every benchmark's questions (``Shard.select`` on each benchmark's
list, so batches stay those of an unsharded run); ``vrh_interp.experiments.merge.merge_runs`` joins the shard folders
and ``vqa_sweep_from_run`` reads the merged folder without the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.execution.backends.base import backend_config, check_ablation_kinds
from vrh_interp.core.execution.backends.select import backend_for, backend_type
from vrh_interp.data.datasets.samples import VQASample
from vrh_interp.data.datasets.vqa import score_response
from vrh_interp.data.datasets.vqa_prompt import vqa_prompt
from vrh_interp.evaluation.controls import CONTROL_KINDS, DEFAULT_RANDOM_SEEDS
from vrh_interp.experiments.conditions import Condition, ablation_for, control_conditions
from vrh_interp.experiments.sweep import condition_order, total_heads_of
from vrh_interp.experiments.condition_stats import condition_rows, set_level_rows
from vrh_interp.experiments.passes import conditions_per_pass, run_passes
from vrh_interp.core.description.heads import HeadGeometry, HeadSet
from vrh_interp.core.description.model import VLM
from vrh_interp.core.bookkeeping.provenance import model_provenance
from vrh_interp.core.bookkeeping.runs import RunFolder, whole_run_manifest
from vrh_interp.experiments.declared import experiment
from vrh_interp.core.bookkeeping.shards import Shard, shard_config
from vrh_interp.core.execution.templates.ablation import ZERO_ABLATION, Ablation, AblationValues

VQA_SWEEP = experiment("vqa_sweep")  # its declaration: record log, record key, merge order

TABLE_ROWS: dict[str, str] = {"baseline": "Baseline", "random": "Random", "matched": "Layer-matched", "top": "VRH"}
RECORD_COLUMNS: list[str] = ["benchmark", "sample_id", "condition", "kind", "k", "seed", "response", "prediction",
                             "correct"]


def vqa_conditions(geometry: HeadGeometry, heads: HeadSet, random_seeds: Sequence[int] = DEFAULT_RANDOM_SEEDS, *,
                   detected: HeadSet | None = None, exclude_first_layer: bool = False,
                   matched: bool = True, ablation: str = "zero") -> list[Condition]:
    """Baseline, ``heads`` ("top"), then the random and (``matched``) layer-matched sets, one per seed, masked
    with ``ablation`` (the baseline masks nothing)."""
    heads = geometry.validate(heads)
    conditions = [Condition("baseline", 0, None, HeadSet())]
    if len(heads):
        excluded = heads.union(detected) if detected is not None else heads
        conditions.append(Condition("top", len(heads), None, heads, ablation))
        try:
            conditions += control_conditions(geometry, excluded, len(heads), heads, random_seeds, matched=matched,
                                             exclude_first_layer=exclude_first_layer, ablation=ablation)
        except ValueError as error:
            raise ValueError(f"VQA controls for {len(heads)} masked heads: {error}. Mask fewer heads"
                             + (", or leave the layer-matched control out (matched=False)" if matched else "")
                             ) from None
    return conditions


def answer_batch(vlm: VLM, samples: Sequence[VQASample], heads: HeadSet, *, max_new_tokens: int,
                 ablation: Ablation = ZERO_ABLATION) -> list[str]:
    """Greedy responses to one batch of VQA samples with ``heads`` ablated (``ablation``) at every step. Mean
    and resample ablation replace outputs per position segment; the visual segment comes from the family's
    layout of each row's image (``interventions.encoding_segments``)."""
    return answer_conditions(vlm, samples, [(heads, ablation)], max_new_tokens=max_new_tokens)[0]


def encode_vqa(vlm: VLM, samples: Sequence[VQASample]) -> Any:
    """The left-padded encoding of ``samples``' prompts (``vqa_prompt``) with their images."""
    prompts = [vqa_prompt(vlm, s) for s in samples]
    return vlm.adapter.encode(vlm.processor, [s.image for s in samples], prompts).to(vlm.device)


def answer_conditions(vlm: VLM, samples: Sequence[VQASample], conditions: Sequence[tuple[HeadSet, Ablation]], *,
                      max_new_tokens: int, encoding: Any = None) -> list[list[str]]:
    """Greedy responses under each condition ``(heads, ablation)``, all in one batched generation (condition
    batching, ``interventions.generate_conditions``, on the handle's backend): per condition, what ``answer_batch``
    gives (equal exactly).
    ``encoding`` is the samples' ``encode_vqa`` when already made."""
    if encoding is None:
        encoding = encode_vqa(vlm, samples)
    segments = None
    if any(len(h) and a.replaces_by_segment for h, a in conditions):
        segments = iv.encoding_segments(vlm, encoding, [s.image.size for s in samples])
    ids = backend_for(vlm).generate_conditions(encoding, conditions, max_new_tokens=max_new_tokens,
                                               segments=segments, sample_ids=[s.sample_id for s in samples])
    prompt_length = int(encoding["input_ids"].shape[1])
    return [vlm.decode_answers(block, prompt_length) for block in ids]


class _VQAPasses:
    """``answer`` / ``per_pass`` of ``experiments.passes.condition_passes`` for VQA: each chunk encoded once."""

    def __init__(self, vlm: VLM, ablation: Ablation, *, max_batch_rows: int | None) -> None:
        self.vlm, self.ablation, self.max_batch_rows = vlm, ablation, max_batch_rows
        self._key: tuple[tuple[str, str], ...] | None = None
        self._encoding: Any = None

    def _encode(self, samples: Sequence[VQASample]) -> Any:
        key = tuple((s.benchmark, s.sample_id) for s in samples)
        if key != self._key or self._encoding is None:
            self._encoding, self._key = encode_vqa(self.vlm, samples), key
        return self._encoding

    def split(self, chunk: Sequence[VQASample], signatures: int) -> list[list[VQASample]]:
        return [list(chunk)]  # not cut (grounding batches are: ``sweep._GroundingPasses.split``)

    def per_pass(self, samples: Sequence[VQASample]) -> int:
        tokens = int(self._encode(samples)["input_ids"].shape[1]) + max(s.max_new_tokens for s in samples)
        return conditions_per_pass(len(samples), tokens, self.max_batch_rows)

    def answer(self, samples: Sequence[VQASample], conditions: Sequence[Condition]) -> list[list[str]]:
        return answer_conditions(self.vlm, samples, [(c.heads, self.ablation) for c in conditions],
                                 max_new_tokens=max(s.max_new_tokens for s in samples),
                                 encoding=self._encode(samples))


@dataclass
class VQASweepResult:
    records: pd.DataFrame
    conditions: list[Condition]
    benchmarks: list[str]
    total_heads: int | None = None  # for ``k_fraction``; NaN when unknown

    def summary(self, *, bootstrap_seed: int = 0, resamples: int = 2000) -> pd.DataFrame:
        """One row per benchmark x condition, then the set-level rows (module doc); fractions, not percent."""
        rows: list[dict[str, Any]] = []
        for benchmark in self.benchmarks:
            part = self.records[self.records["benchmark"] == benchmark].assign(
                correct=lambda frame: frame["correct"].astype(bool))
            base = part[part["kind"] == "baseline"].set_index("sample_id")["correct"]
            parts = {c.key: part[part["condition"] == c.key] for c in self.conditions}
            own = [{"benchmark": benchmark, **row, "delta_vs_baseline": row["accuracy"] - float(base.mean()),
                    "p_value_vs_baseline": paired["p_value"]}
                   for _, row, paired in condition_rows(parts, self.conditions, base, self.total_heads,
                                                        bootstrap_seed=bootstrap_seed, resamples=resamples)]
            rows += set_level_rows(own, parts, self.conditions, bootstrap_seed=bootstrap_seed, resamples=resamples,
                                   pooled=lambda records, base=base: {  # per answer: sets crossed or clustered
                                       "n": len(records),
                                       "delta_vs_baseline": float(records["correct"].mean()
                                                                  - base.loc[records["sample_id"]].mean())})
        return pd.DataFrame(rows)

    def table(self, *, bootstrap_seed: int = 0) -> pd.DataFrame:
        """Table 3: rows Baseline / Random / Layer-matched / VRH; columns (benchmark, stat), stat one of accuracy,
        ci_low, ci_high, delta (vs baseline); values in percent. Control rows: the mean accuracy of the sets and
        its two-level bootstrap interval."""
        summary = self.summary(bootstrap_seed=bootstrap_seed)
        pooled = summary[~summary["condition"].isin(CONTROL_KINDS) | (summary["seed"].astype(str) == "all")]
        cells: dict[tuple[str, str], dict[str, float]] = {}
        for row in pooled.itertuples():
            label = f"{TABLE_ROWS[row.condition]} (k={row.k})"
            for stat, value in (("accuracy", row.accuracy), ("ci_low", row.accuracy_ci_low),
                                ("ci_high", row.accuracy_ci_high), ("delta", row.delta_vs_baseline)):
                cells.setdefault((row.benchmark, stat), {})[label] = 100 * value
        labels = {c.kind: f"{TABLE_ROWS[c.kind]} (k={c.k})" for c in self.conditions}
        order = [labels[kind] for kind in TABLE_ROWS if kind in labels]
        table = pd.DataFrame(cells).reindex(order)
        table.columns = pd.MultiIndex.from_tuples(table.columns, names=["benchmark", "stat"])
        return table


def vqa_item(sample: VQASample) -> str:
    """A VQA item's name in a design and in the verdicts: ``benchmark/sample_id`` (ids are unique per benchmark)."""
    return f"{sample.benchmark}/{sample.sample_id}"


def vqa_sweep(vlm: VLM, samples: Sequence[VQASample], heads: HeadSet, *,
              random_seeds: Sequence[int] = DEFAULT_RANDOM_SEEDS, matched: bool = True,
              detected: HeadSet | None = None, exclude_first_layer: bool = False, batch_size: int = 8,
              run_dir: str | Path | None = None, progress: bool = True, shard: Shard | None = None,
              ablation: str = "zero",
              ablation_values: AblationValues | None = None, max_batch_rows: int | None = None) -> VQASweepResult:
    """Answer every sample unmasked, with ``heads`` masked and with the controls; resumable via ``run_dir``.

    ``ablation``: "zero" (the paper's), "mean" or "resample"; the latter two need ``ablation_values``
    (``evaluation.grounding.ablation_values`` on the grounding detection samples: a head's mean output per
    segment while grounding; its fingerprint goes into the run folder's manifest).

    With ``shard``, only that shard of each benchmark's samples is answered and the result holds those records.
    The model runs on the handle's backend (``vlm.on(backend=...)``); one other than nnsight is recorded in the
    manifest, and an ablation kind it cannot mask with is refused before any work.
    """
    conditions = vqa_conditions(vlm.geometry, heads, random_seeds, detected=detected,
                                exclude_first_layer=exclude_first_layer, matched=matched, ablation=ablation)
    return run_vqa_conditions(vlm, samples, conditions, batch_size=batch_size, run_dir=run_dir, progress=progress,
                              shard=shard, ablation=ablation, ablation_values=ablation_values,
                              max_batch_rows=max_batch_rows)


def run_vqa_conditions(vlm: VLM, samples: Sequence[VQASample], conditions: Sequence[Condition], *,
                       items_of: Mapping[str, Sequence[str]] | None = None, batch_size: int = 8,
                       run_dir: str | Path | None = None, progress: bool = True, shard: Shard | None = None,
                       ablation: str = "zero", ablation_values: AblationValues | None = None,
                       max_batch_rows: int | None = None) -> VQASweepResult:
    """``vqa_sweep`` on given ``conditions`` (the baseline first; masked with ``ablation``). ``items_of``
    (condition key -> ``vqa_item`` names) answers those conditions on those items only: the clustered design,
    one fresh control set per scene (``experiments.designs.vqa_scene_design``); it is part of the manifest, so a
    folder resumes only with the same assignment."""
    if not samples:
        raise ValueError("vqa_sweep needs at least one VQA sample")
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    keys = [(s.benchmark, s.sample_id) for s in samples]
    if len(set(keys)) != len(keys):
        raise ValueError("VQA samples must have unique (benchmark, sample_id) pairs")
    if not conditions or conditions[0].kind != "baseline":
        raise ValueError("the VQA conditions must start with the unmasked baseline")
    names = {vqa_item(s) for s in samples}
    items_of = {key: sorted(set(ids)) for key, ids in (items_of or {}).items()}
    unknown = sorted(set(items_of) - {c.key for c in conditions}) + sorted(
        {i for ids in items_of.values() for i in ids} - names)
    if unknown or any(not ids for ids in items_of.values()):
        raise ValueError(f"items_of names conditions or items the VQA sweep does not have, or gives a condition no "
                         f"items: {unknown[:5] or 'an empty list'}")
    masking = ablation_for(ablation, ablation_values, vlm.geometry)
    check_ablation_kinds(backend_type(vlm), [ablation])
    benchmarks = list(dict.fromkeys(s.benchmark for s in samples))
    config = {"kind": VQA_SWEEP.name, "model": model_provenance(vlm),
              "samples": {b: [s.sample_id for s in samples if s.benchmark == b] for b in benchmarks},
              "conditions": {c.key: c.heads.to_list() for c in conditions},
              **backend_config(backend_for(vlm))}  # nothing for nnsight: earlier folders resume
    if ablation_values is not None:
        config["ablation_values"] = ablation_values.fingerprint()
    if items_of:
        config["items_of"] = items_of
    assigned = {key: set(ids) for key, ids in items_of.items()}
    log = VQA_SWEEP.open_log(RunFolder(run_dir, shard_config(config, shard, batch_size))) \
        if run_dir is not None else None
    mine = {b: [s for s in samples if s.benchmark == b] for b in benchmarks}
    if shard is not None:
        mine = {b: shard.select(part, batch_size) for b, part in mine.items()}

    def make_record(sample: VQASample, condition: Condition, response: str) -> dict[str, Any]:
        scored = score_response(sample, response)
        return {"benchmark": sample.benchmark, "sample_id": sample.sample_id, "condition": condition.key,
                "kind": condition.kind, "k": condition.k, "seed": condition.seed, "response": response,
                "prediction": scored.prediction, "correct": scored.correct}

    chunks = [part[start: start + batch_size] for b in benchmarks for part in (mine[b],)
              for start in range(0, len(part), batch_size)]
    # the one-condition-at-a-time order (condition, benchmark, sample), for the result and a finished folder
    order = {c.key: i for i, c in enumerate(conditions)}
    bench = {b: i for i, b in enumerate(benchmarks)}
    position = {(s.benchmark, s.sample_id): i for i, s in enumerate(samples)}

    def canonical(r: Mapping[str, Any]) -> tuple[int, int, int]:
        return order[r["condition"]], bench[r["benchmark"]], position[(r["benchmark"], r["sample_id"])]

    records = run_passes(log, chunks, conditions, unit=lambda s: (s.benchmark, s.sample_id),
                         record_unit=lambda r: (r["benchmark"], r["sample_id"]), answer_of=lambda r: r["response"],
                         passes=_VQAPasses(vlm, masking, max_batch_rows=max_batch_rows),
                         record=make_record, canonical=canonical, desc="vqa sweep: masked answers",
                         progress=progress,
                         skip=frozenset(((s.benchmark, s.sample_id), key) for key, ids in assigned.items()
                                        for part in mine.values() for s in part if vqa_item(s) not in ids))
    return VQASweepResult(records=pd.DataFrame(records, columns=RECORD_COLUMNS), conditions=conditions,
                          benchmarks=benchmarks, total_heads=vlm.geometry.total_heads)


def vqa_sweep_from_run(run_dir: str | Path) -> VQASweepResult:
    """The result of a complete VQA sweep folder (e.g. merged shards), read without the model: what
    ``vqa_sweep`` on the same samples returns."""
    run_dir = Path(run_dir)
    config = whole_run_manifest(run_dir, VQA_SWEEP.name, "a VQA sweep")
    records = VQA_SWEEP.read_log(run_dir).read()
    skipped = sum(len(ids) for ids in config["samples"].values()) * len(config.get("items_of", {})) - sum(
        len(ids) for ids in config.get("items_of", {}).values())
    expected = len(config["conditions"]) * sum(map(len, config["samples"].values())) - skipped
    if len({(r["benchmark"], r["sample_id"], r["condition"]) for r in records}) != expected:
        raise ValueError(f"{run_dir} is incomplete: {expected - len(records)} answers are missing; rerun its command "
                         "to resume it")
    # the manifest keeps mappings key-sorted; the log keeps the run's order (condition, then benchmark)
    conditions = [Condition.from_key(key, HeadSet(config["conditions"][key])) for key in condition_order(records)]
    benchmarks = list(dict.fromkeys(r["benchmark"] for r in records))
    return VQASweepResult(records=pd.DataFrame(records, columns=RECORD_COLUMNS), conditions=conditions,
                          benchmarks=benchmarks, total_heads=total_heads_of(config))


def run(spec: Any, vlm: VLM, folder: Path) -> VQASweepResult:
    """``vrh vqa-sweep`` / a grid's VQA cell / ``vrh reproduce``'s Table 3 (``builtin_specs.VQASweepSpec``): the top
    ``vqa_k`` heads of the scores masked on every benchmark's questions against the control sets (seeds ``seeds``,
    else 0 .. ``random_sets`` - 1), ``vqa_summary.csv`` in ``folder``."""
    from vrh_interp.core.bookkeeping.runs import write_atomic
    from vrh_interp.data.sources import load_vqa
    from vrh_interp.scoring.scores import HeadScores

    samples: list[VQASample] = []
    for data in spec.vqa:
        loaded = list(load_vqa(data))
        samples += loaded[: spec.limit] if spec.limit is not None else loaded
    heads = HeadScores.load(spec.scores).top(spec.vqa_k)
    result = vqa_sweep(vlm, samples, heads, random_seeds=spec.control_seeds(), matched=spec.matched,
                       batch_size=spec.batch_size, run_dir=folder, progress=spec.progress, shard=spec.shard,
                       max_batch_rows=spec.max_batch_rows)
    if spec.shard is None:
        write_atomic(folder / "vqa_summary.csv", result.summary().to_csv(index=False))
    return result


ANSWERS_VQA_MARGIN = 0.1  # a VQA kind counts as answered when the unmasked model beats the majority answer by this


def vqa_answered(summary: pd.DataFrame) -> list[str]:
    """The VQA kinds whose unmasked accuracy beats the majority answer by ``ANSWERS_VQA_MARGIN``."""
    base = summary[summary["condition"] == "baseline"]
    return [r.benchmark for r in base.itertuples() if r.accuracy >= r.majority_baseline + ANSWERS_VQA_MARGIN]
