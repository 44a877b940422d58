"""Causal designs: which control sets are answered on which items, for as few answers as the verdict needs.

The causal claim (``evaluation.claims.causal_test``) has three parts, and each gets the design that answers it
with the fewest answers (``docs/results/calibration.md`` measures the rule and the answers under each):

* **the effect** (mean control-set accuracy minus the top-k's): ``scene_design`` answers ONE fresh set of each
  kind per scene, on that scene's referents only, where the crossed design (``conditions.sweep_conditions``) answered
  every set on every item. Each item's set is a fresh draw, so the mean difference is unbiased for the same
  estimand, and the scenes are independent clusters (``inference.cluster_effect``): the set part of the error
  shrinks with the scenes instead of being fixed by 20 sets, at 1/20 of the answers.
* **the drop** (against the unmasked model): the baseline and the top-k on every item, exact McNemar.
* **specialness** (the top-k more harmful than the sets including its own draw): ``curtailed_rank`` answers up to
  199 sets of each kind on a few common items, drawn in blocks (Besag and Clifford 1991, stopped once h sets were
  as harmful), each set answered item by item only until its comparison with the top-k is decided (curtailment:
  a set whose correct answers already exceed the top-k's cannot become as harmful, one whose correct answers
  plus its unanswered items cannot exceed them already is). The rank statistic is exactly the one the full table
  gives; a set that is clearly less harmful than the top-k costs one or two answers.

Stopping depends only on the outcomes, in a fixed item and set order, so every p-value keeps its level, and a
rerun resumes each piece from its run folder.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import pandas as pd

from vrh_interp.core.description.heads import HeadSet
from vrh_interp.experiments.conditions import Condition, control_conditions
from vrh_interp.experiments.sweep import SweepResult, run_conditions

if TYPE_CHECKING:
    from vrh_interp.experiments.demo_plan import DemoRun

RANK_H = 5
"""Besag-Clifford's h: a sequential rank test stops once h sets were at least as harmful as the target."""
SCENE_SEEDS = 500
"""Scene j's sets use seed ``first + j`` (fewer than this many scenes); the rank test's sets ``first + SCENE_SEEDS``
onwards, so the two never share a draw."""


def scenes_of(items: Sequence[Any], key: Callable[[Any], Any] | None = None) -> list[list[Any]]:
    """Consecutive items of one scene, in order: showing the same image object (a scene's referents), or with
    equal ``key(item)`` where given (a VQA scene's questions: their image source)."""
    scenes: list[list[Any]] = []
    for item in items:
        if key is not None:
            same = bool(scenes) and key(scenes[-1][0]) == key(item)
        else:
            image = getattr(item, "image", None)
            same = bool(scenes) and image is not None and getattr(scenes[-1][0], "image", None) is image
        if same:
            scenes[-1].append(item)
        else:
            scenes.append([item])
    return scenes


def check_subset(items: Sequence[Any], count: int) -> list[Any]:
    """``count`` items in whole scenes spread evenly over ``items`` (a scene's referents share their image prefix
    in a generation); the last scene cut to make ``count``. Fixed, spread over the scenes."""
    if count >= len(items):
        return list(items)
    scenes = scenes_of(items)
    wanted = min(len(scenes), math.ceil(count * len(scenes) / len(items)))
    picked = [item for i in range(wanted) for item in scenes[math.floor(i * len(scenes) / wanted)]]
    return picked[:count]


def scene_design(ranking: HeadSet, geometry: Any, ks: Sequence[int], items: Sequence[Any], first_seed: int, *,
                 live: HeadSet | None = None, matched: bool = True,
                 ablation: str = "zero") -> tuple[list[Condition], dict[str, list[str]]]:
    """``(conditions, items_of)`` of the clustered design (module doc): the baseline and the top-k at every k on
    every item; per scene j (``scenes_of``) and k > 0 one set of each control kind drawn with seed
    ``first_seed + j`` (nested in k, so a scene's sets along the k-curve are prefixes of one draw), answered on
    that scene's items (``items_of``, for ``run_conditions``). Conditions in scene order, so a backend that does
    not cut batches by image still packs a scene's sets into one pass."""
    from vrh_interp.experiments.conditions import sweep_conditions

    scenes = scenes_of(items)
    if len(scenes) > SCENE_SEEDS:
        raise ValueError(f"{len(scenes)} scenes: the clustered design draws at most {SCENE_SEEDS} (one seed each)")
    positive = sorted(k for k in ks if k > 0)
    detected = ranking[: max(ks)] if ks else HeadSet()
    conditions = sweep_conditions(ranking, geometry, ks, [], matched=matched, ablation=ablation)
    items_of: dict[str, list[str]] = {}
    for j, scene in enumerate(scenes):
        ids = [s.sample_id for s in scene]
        for k in positive:
            for cond in control_conditions(geometry, detected, k, ranking[:k], [first_seed + j], matched=matched,
                                           ablation=ablation, live=live):
                conditions.append(cond)
                items_of[cond.key] = ids
    return conditions, items_of


def vqa_scene_design(heads: HeadSet, geometry: Any, items: Sequence[Any], first_seed: int, *,
                     detected: HeadSet | None = None, live: HeadSet | None = None, matched: bool = True,
                     ablation: str = "zero") -> tuple[list[Condition], dict[str, list[str]]]:
    """``scene_design`` for a VQA sweep (``vqa_sweep.run_vqa_conditions``): the baseline and ``heads`` on every
    question; per scene (consecutive questions on one image source) one set of each control kind, drawn outside
    ``detected`` (default ``heads``) with seed ``first_seed + j``, answered on that scene's questions (named
    ``vqa_sweep.vqa_item``). The causal claim on VQA takes its specialness from the grounding rank test (the same
    top-k), so the VQA sets serve the effect alone, and one per scene estimates it."""
    from vrh_interp.experiments.vqa_sweep import vqa_conditions, vqa_item

    scenes = scenes_of(items, key=lambda item: item.image_source)
    if len(scenes) > SCENE_SEEDS:
        raise ValueError(f"{len(scenes)} scenes: the clustered design draws at most {SCENE_SEEDS} (one seed each)")
    conditions = vqa_conditions(geometry, heads, [], detected=detected, matched=matched, ablation=ablation)
    excluded = heads.union(detected) if detected is not None else heads
    items_of: dict[str, list[str]] = {}
    for j, scene in enumerate(scenes):
        for cond in control_conditions(geometry, excluded, len(heads), heads, [first_seed + j], matched=matched,
                                       ablation=ablation, live=live):
            conditions.append(cond)
            items_of[cond.key] = [vqa_item(s) for s in scene]
    return conditions, items_of


def restrict_design(conditions: Sequence[Condition], items_of: dict[str, list[str]], ids: Sequence[str],
                    keep: Callable[[Condition], bool]) -> tuple[list[Condition], dict[str, list[str]]]:
    """The design on the items ``ids`` only, with the conditions ``keep`` accepts (the baseline always): a
    clustered set whose scene has none of those items is left out."""
    wanted = set(ids)
    out, where = [], {}
    for cond in conditions:
        if cond.kind != "baseline" and not keep(cond):
            continue
        if cond.key in items_of:
            mine = [i for i in items_of[cond.key] if i in wanted]
            if not mine:
                continue
            where[cond.key] = mine
        out.append(cond)
    return out, where


def rank_blocks(total: int, first: int = 20) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of a sequential rank test's blocks: ``first`` sets, then doubling, up to ``total``
    (a null top-k stops in the first block or two; a special one needs all, in few blocks)."""
    blocks, start, size = [], 0, first
    while start < total:
        blocks.append((start, min(total, start + size)))
        start, size = start + size, size * 2
    return blocks


def sequential_sets(streams: Sequence[tuple[str, str]], answer: Callable[[list[int], set[str], Path], Any],
                    folder: Path, *, k: int, target: str, total: int, first: int, block: int,
                    h: int) -> dict[str, SweepResult] | None:
    """A rank test's control sets, drawn sequentially (Besag-Clifford): seeds from ``first`` in ``rank_blocks``
    up to ``total``, each block answered by ``answer(seeds, kinds, folder)`` -> ``{unit: SweepResult}`` on the rank
    items; a ``(unit, kind)`` stream stops once ``h`` of its sets are at least as harmful as the ``target`` set at
    ``k`` (its p-value is then decided, and large) or all are drawn. Stopping depends only on the outcomes, so a
    rerun resumes block by block. None: no sets asked for."""
    from vrh_interp.evaluation.inference import sequential_rank_p
    from vrh_interp.experiments.verdicts import rank_data

    if total <= 0:
        return None
    running, parts, conditions = set(streams), {}, {}
    merged: dict[str, SweepResult] = {}
    for start, stop in rank_blocks(total, block):
        if not running:
            break
        seeds = list(range(first + start, first + stop))
        for unit, result in answer(seeds, {kind for _, kind in running}, folder / f"block-{start:04d}").items():
            parts.setdefault(unit, []).append(result.records)
            conditions.setdefault(unit, {}).update({c.key: c for c in result.conditions})
        merged = {unit: _merged(parts[unit], conditions[unit]) for unit in parts}
        for unit, kind in sorted(running):
            ranked = rank_data(merged.get(unit), k, kind, "zero", target, 0.5)
            if ranked is None:
                running.discard((unit, kind))
                continue
            _, used = sequential_rank_p(*ranked, h=h)
            if used < len(ranked[1]) or len(ranked[1]) >= total:
                running.discard((unit, kind))
    return merged or None


def _merged(parts: list[pd.DataFrame], conditions: dict[str, Condition]) -> SweepResult:
    records = pd.concat(parts, ignore_index=True).drop_duplicates(["condition", "sample_id"])
    ordered = sorted(conditions.values(), key=lambda c: (c.kind != "baseline", c.kind != "top", c.kind,
                                                         c.seed if isinstance(c.seed, int) else 0))
    return SweepResult(records.reset_index(drop=True), ordered, 0.5, None)


def comparison_open(correct: int, target_correct: int, left: int) -> bool:
    """Curtailment's rule: a set with ``correct`` right answers so far and ``left`` items unanswered may still end
    either side of the target's ``target_correct`` (not yet above it, and able to get above it)."""
    return target_correct - left < correct <= target_correct


def curtailed_rank(vlm: Any, items: Sequence[Any], baseline: Condition, target: Condition,
                   sets: Sequence[Condition], folder: Path, *, batch_size: int, max_new_tokens: int,
                   target_folder: Path | None = None) -> SweepResult:
    """The rank test's sets answered with curtailment (module doc): the ``target`` (and the baseline) on every
    item first (in ``target_folder``, default ``folder / "target"``), then item by item the sets whose comparison
    with it is still open (one pass per item, in ``folder / "item-NNN"``). The records of a set stop where its
    comparison was decided; ``experiments.verdicts.rank_data`` reads a set as at least as harmful exactly when
    its correct answers plus its unanswered items are at most the target's correct answers."""
    where = target_folder if target_folder is not None else folder / "target"
    first = run_conditions(vlm, items, [baseline, target], batch_size=batch_size, max_new_tokens=max_new_tokens,
                           run_dir=where, progress=False)
    correct = first.records.assign(ok=first.records["iou"].astype(float) >= first.iou_threshold)
    wins = int(correct.loc[correct["condition"] == target.key, "ok"].sum())
    counts = {c.key: 0 for c in sets}
    parts = [first.records]
    open_sets = list(sets)
    for j, item in enumerate(items):
        if not open_sets:
            break
        result = run_conditions(vlm, [item], [baseline, *open_sets], batch_size=batch_size,
                                max_new_tokens=max_new_tokens, run_dir=folder / f"item-{j:03d}", progress=False)
        answered = result.records[result.records["condition"] != baseline.key]
        parts.append(answered)
        for row in answered.itertuples():
            counts[row.condition] += int(float(row.iou) >= result.iou_threshold)
        left = len(items) - j - 1
        open_sets = [c for c in open_sets if comparison_open(counts[c.key], wins, left)]
    records = pd.concat(parts, ignore_index=True)
    return SweepResult(records, [baseline, target, *sets], first.iou_threshold, first.total_heads)


def clustered_sweep(vlm: Any, ranking: HeadSet, ks: Sequence[int], items: Sequence[Any], folder: Path, *,
                    kinds: Sequence[str] = ("random", "matched"), live: HeadSet | None = None,
                    extra: Sequence[Condition] = (), rank_sets: int = 199, rank_items: int = 12,
                    first_seed: int = 0, batch_size: int = 60, max_new_tokens: int = 24, progress: bool = True,
                    rank_ks: Sequence[int] | None = None) -> tuple[SweepResult, dict[int, SweepResult | None]]:
    """The causal k-sweep in this module's designs, whole: ``scene_design`` on ``items`` (plus the ``extra``
    conditions on every item) into ``folder / "sweep"``, then at every k > 0 the rank test's sets
    (``sequential_sets`` of ``curtailed_rank`` on ``rank_items`` items, into ``folder / "rank-k{k}"``; only at
    ``rank_ks`` where given, e.g. k* alone, whose rank test the other claims take). Returns the
    sweep and the rank sweep per k, for ``verdicts.causal_evidence(rank=...)`` / ``verdicts.sweep_claims``."""
    geometry = vlm.geometry
    matched = "matched" in kinds
    conditions, items_of = scene_design(ranking, geometry, ks, items, first_seed, live=live, matched=matched)
    kinds = [kind for kind in kinds if any(c.kind == kind for c in conditions)]  # live: only with a pool
    conditions = [c for c in conditions if c.kind in ("baseline", "top") or c.kind in kinds] + list(extra)
    items_of = {key: ids for key, ids in items_of.items() if any(c.key == key for c in conditions)}
    result = run_conditions(vlm, items, conditions, batch_size=batch_size, max_new_tokens=max_new_tokens,
                            run_dir=folder / "sweep", progress=progress, items_of=items_of)
    baseline, rank_on = conditions[0], check_subset(items, rank_items)
    detected = ranking[: max(ks)]
    ranks: dict[int, SweepResult | None] = {}
    for k in sorted(k for k in (ks if rank_ks is None else rank_ks) if k > 0):
        top = next(c for c in conditions if c.kind == "top" and c.k == k)

        def sets(seeds: list[int], running: set[str], top: Condition = top, k: int = k) -> list[Condition]:
            return [c for c in control_conditions(geometry, detected, k, top.heads, seeds,
                                                  matched="matched" in running,
                                                  live=live if "live" in running else None) if c.kind in running]

        ranks[k] = rank_test(vlm, rank_on, baseline, top, sets, kinds, folder / f"rank-k{k}", total=rank_sets,
                             first_seed=first_seed + SCENE_SEEDS, batch_size=batch_size,
                             max_new_tokens=max_new_tokens)
    return result, ranks


def rank_test(vlm: Any, items: Sequence[Any], baseline: Condition, target: Condition,
              sets: Callable[[list[int], set[str]], list[Condition]], kinds: Sequence[str], folder: Path, *,
              total: int, first_seed: int, batch_size: int, max_new_tokens: int) -> SweepResult | None:
    """The rank test of ``target`` (module doc): ``sequential_sets`` of ``curtailed_rank`` on ``items``, the
    sets of each block ``sets(seeds, running kinds)``, into ``folder``; None where no sets were asked for."""
    def answer(seeds: list[int], running: set[str], block_folder: Path) -> dict[str, SweepResult]:
        return {"grounding": curtailed_rank(vlm, items, baseline, target, sets(seeds, running), block_folder,
                                            batch_size=batch_size, max_new_tokens=max_new_tokens,
                                            target_folder=folder / "target")}

    found = sequential_sets([("grounding", kind) for kind in kinds], answer, folder, k=target.k, target=target.kind,
                            total=total, first=first_seed, block=20, h=RANK_H)
    return None if found is None else found["grounding"]


# ---------------------------------------------- the demo's k-sweep and VQA steps: these designs (``vrh demo``)
# (here rather than in ``sweep`` / ``vqa_sweep``: this module runs on theirs)


def sweep_step(run: DemoRun) -> None:
    """Step 3: the causal k-sweep; evidence of the causal, k-curve and specificity claims."""
    answers = sum(len(run.items_of.get(c.key, run.evals)) for c in run.conditions)
    if not run.steps.open(3, f"k-sweep on all {len(run.evals)} referents of {run.sizes.eval_scenes} disjoint scenes, "
                             f"ks={run.ks} (k*={run.k_star}), one fresh control set of each kind per scene "
                             f"({answers} answers); the rank test at k*"):
        return
    from vrh_interp.experiments import verdicts as ev
    from vrh_interp.experiments.demo_plan import ANSWER_TOKENS, SEED_STRIDE

    kinds = sorted({c.kind for c in run.conditions if c.kind in ev.CONTROL_KINDS})
    detected = run.ranking[: max(run.ks)]
    pool = run.pool.control_pool(detected, max(run.ks)) if run.pool is not None else None  # as the detection step's
    result, ranks = clustered_sweep(run.placed, run.ranking, run.ks, run.evals, run.out, kinds=kinds, live=pool,
                                    rank_sets=run.sizes.rank_sets, rank_items=run.sizes.rank_items,
                                    first_seed=run.seed * SEED_STRIDE, batch_size=run.batch_size,
                                    max_new_tokens=ANSWER_TOKENS, rank_ks=[run.k_star])
    run.result = result
    result.summary(bootstrap_seed=run.seed).to_csv(run.out / "sweep_summary.csv", index=False)
    rank = ranks.get(run.k_star)
    if rank is not None:
        sets = {kind: sum(1 for c in rank.conditions if c.kind == kind) for kind in kinds}
        print(f"      rank test: {', '.join(f'{n} {kind}' for kind, n in sets.items())} sets on "
              f"{rank.records['sample_id'].nunique()} items, {len(rank.records)} answers (stopped once {RANK_H} were "
              "as harmful as the top-k)", flush=True)
    run.evidence["causal"] = ev.causal_evidence(result.records, run.conditions, run.k_star, seed=run.seed, rank=rank)
    run.evidence["causal_curve"] = ev.curve_evidence(result.records, run.conditions, seed=run.seed,
                                                     special=run.evidence["causal"])
    run.evidence["specific"] = ev.specificity_evidence(result.records, run.k_star)


def vqa_step(run: DemoRun) -> None:
    """Step 9: cross-task VQA with the top k* heads masked, in the clustered design (one fresh control set of each
    kind per scene, on its questions; specialness from the grounding rank test)."""
    run.evidence["vqa"] = None
    if not run.steps.open(9, f"cross-task VQA on the questions of {run.sizes.vqa_scenes} eval scenes, one fresh "
                             "control set of each kind per scene"):
        return
    from vrh_interp.data.datasets.synthetic_vqa import majority_answer_rate, synthetic_vqa
    from vrh_interp.evaluation.claims import Evidence
    from vrh_interp.experiments import verdicts as ev
    from vrh_interp.experiments.demo_plan import SEED_STRIDE
    from vrh_interp.experiments.vqa_sweep import run_vqa_conditions, vqa_answered

    items = synthetic_vqa("eval", run.sizes.vqa_scenes)
    detected = run.ranking[: max(run.ks)]
    pool = run.pool.control_pool(detected, max(run.ks)) if run.pool is not None else None  # as the k-sweep step's
    conditions, items_of = vqa_scene_design(run.scores.top(run.k_star), run.vlm.geometry, items,
                                            run.seed * SEED_STRIDE, detected=detected, live=pool)
    vqa = run_vqa_conditions(run.vlm, items, conditions, items_of=items_of, batch_size=run.batch_size,
                             run_dir=run.out / "vqa")
    summary = vqa.summary(bootstrap_seed=run.seed)
    majority = {b: majority_answer_rate([s for s in items if s.benchmark == b]) for b in vqa.benchmarks}
    summary["majority_baseline"] = summary["benchmark"].map(majority)
    summary.to_csv(run.out / "vqa_summary.csv", index=False)
    answered = vqa_answered(summary)
    run.evidence["vqa"] = ev.vqa_evidence(vqa, answered, run.k_star, seed=run.seed,
                                          special=run.evidence.get("causal")) if answered else \
        Evidence.categorical("not measured", "the model answers no VQA kind above the majority-answer level")
