"""``vrh demo``: the paper's protocol end to end on a (toy) model, on CPU, next to a positive control.

Steps (each writes its records into the run folder, so rerunning resumes):

1. positive control: the same detection and causal sweep on ``toy:planted``, whose retrieval heads are known
   (``vrh_interp.experiments.positive_control``; skipped, saying why, where the checkpoint is not shipped), so a
   negative verdict below sits next to a pipeline that demonstrably finds planted heads;
2. detection on ``detect_scenes`` held-out scenes (one referent per scene), scores of the paper's design;
3. the causal k-sweep on ALL referents of ``eval_scenes`` evaluation scenes (planned: up to 152 scenes, 502 items;
   disjoint from detection; the printed interval widths say what that buys);
4. the causal verdict at k* again with mean and resample ablation (reference outputs from the detection
   samples), compared with zero ablation on the same items;
5. the single-head causal scan (each head masked alone: all heads, or on models over 48 heads the top k* and a
   random sample, 32 in all) and the rank correlation of score and damage;
6. design space, 7. sparsity and stability, 8. transfer to a second model sharing the backbone (score maps and
   cross-masking), 9. cross-task VQA on the eval scenes' synthetic questions (judged only on the question kinds
   the model answers above the majority-answer level), 10. attention overlays of the top heads and the report.

k values (``demo_ks``). The paper masks 20 of 784-1152 heads (1.7-2.6 %). The demo's grid is derived from
the model's head count: 0.5 %, 1 %, 1.7 %, 2.6 %, 5 % and 10 % of all heads (``experiments.sweep.parse_ks``:
rounded half up, at least 1 head) capped at a quarter of the heads, plus k*; claims are judged at k*, the
count inside the paper's 1.7-2.6 % nearest 2.15 % of the heads, or where no count falls inside (models under
~60 heads) round(2.15 %) but at least 1 head: k* = 1 on a 32-head toy.

Sizes: planned from a time budget (``--budget-seconds``, default 180 s: the full claims table in about three
minutes on a quiet 2-core machine; a target, not a guarantee). Step 0 calibrates the costs on the actual models
with short timed calls, exactly as the steps run them (``calibrate``: a few head-mask conditions over a few
items through ``run_conditions``, so batching many conditions into one generation is measured, not assumed; a
few detection samples; a few VQA questions; the positive control's model). ``choose_sizes`` then picks the
sample counts between ``MINIMUM_SIZES`` and ``FULL_SIZES`` (one interpolation for all of them) so that the
estimate (``plan_steps``: greedy answers x measured seconds per answer, per step) fits ``PLAN_MARGIN`` (92 %)
of the budget; sizes given
explicitly (``--eval``, ``--check-items``, ...) are kept and the others planned around them; budget 0 means the
full sizes. The plan is printed before step 1 (answers and estimated seconds per step, the expected 95 %
interval half-widths), each step prints the time elapsed and the time left (re-estimated from the measured
rate), and after the k-sweep the sizes not used yet (check items, VQA scenes) are re-planned for the time
actually left. ``demo.json`` and ``timing.csv`` (shown in the report) hold each step's planned, re-estimated and
measured seconds; ``plan.json`` keeps the sizes, so rerunning the same command into the same folder resumes
with them. Verdicts are only judged where the full control is measured:

* main k-sweep on all referents of the evaluation scenes (``FULL_SIZES``: 152 scenes, 502 items): at k*,
  ``random_sets`` (20, never fewer unless asked) random and 20 layer-matched sets (the causal verdict); at the
  grid's other k, ``curve_sets`` (2) sets of each kind, enough to show where the controls lie on the curve, not
  to judge (no verdict reads them). The control sets are the same draws as with 20 sets per k (seeds 0 and 1);
* ``check_items`` fixed items (every n-th of the evaluation items, spread over the scenes) for the checks that
  multiply the cost: mean/resample ablation at k* (20 + 20 sets each, compared with zero ablation restricted to
  the same items), the single-head scan (33 conditions on a 128-head model: ``scan_heads``), the design space and
  cross-masking at k*;
* VQA on the questions of the first ``vqa_scenes`` evaluation scenes, at k* with 20 + 20 sets.

Models: ``toy:c`` (128 heads) with ``toy:d`` for transfer where their checkpoints are shipped, else ``toy:a``
with ``toy:b`` (``resolve_models``); any model by name with ``--model``.

Controls and verdict rules (fixed in advance, printed with the numbers). A causal claim "holds" only when
the drop vs the unmasked baseline is significant (McNemar) and the top-k is more harmful than the sets of
EACH control by the set-level rule (empirical p-value <= 0.05: ``evaluation.statistics.set_level_verdict``);
no verdict uses an interval of pooled samples. "Score predicts causal importance" holds when the Spearman
correlation of head score and single-head accuracy drop is positive with a one-sided permutation p < 0.05
(``statistics.spearman_permutation_p``, 10,000 shuffles). "Ablation kinds agree" holds when the causal verdict
at k* is the same under zero, mean and resample ablation.
"""

from __future__ import annotations

import dataclasses
import json
import math
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from vrh_interp.core.backends.base import Backend
from vrh_interp.core.backends.select import get_backend
from vrh_interp.experiments.sweep import (CONTROL_KINDS, Condition, SweepResult, head_signature, parse_ks,
                                         run_conditions, summary_verdict, sweep_conditions)
from vrh_interp.core.provenance import library_versions, model_provenance, now_utc
from vrh_interp.apps.report import read_grading, write_report
from vrh_interp.experiments.design_space import design_space, stability, token_choice_stability
from vrh_interp.scoring.detect import collect_detection_stats, scores_from_stats
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.experiments.transfer import compare_scores, cross_masking, masking_drops, same_grid

ANSWER_TOKENS = 24


PAPER_FRACTION_RANGE = (0.017, 0.026)  # 20 of 1152 .. 20 of 784 heads
DEMO_GRID = ("0.5%", "1%", "1.7%", "2.6%", "5%", "10%")


def demo_ks(total_heads: int) -> tuple[list[int], int]:
    """``(ks, k_star)`` for a model with ``total_heads`` heads (module doc): the grid ``DEMO_GRID`` as counts,
    capped at a quarter of the heads (room for the controls outside the detected set), plus 0 and k*."""
    low = math.ceil(PAPER_FRACTION_RANGE[0] * total_heads)
    high = math.floor(PAPER_FRACTION_RANGE[1] * total_heads)
    middle = sum(PAPER_FRACTION_RANGE) / 2 * total_heads
    if low <= high:
        k_star = min(range(low, high + 1), key=lambda k: (abs(k - middle), k))
    else:
        k_star = max(1, math.floor(middle + 0.5))
    cap = max(1, total_heads // 4)
    ks = sorted({0, k_star, *(k for k in parse_ks(DEMO_GRID, total_heads) if k <= cap)})
    return ks, k_star


def _control_numbers(judged: dict[str, Any]) -> str:
    parts = []
    for kind, row in judged["controls"].items():
        if row is None:
            parts.append(f"{kind}: no sets")
            continue
        parts.append(f"{kind} sets ({int(row['sets'])}) mean {row['accuracy']:.3f} [{row['accuracy_ci_low']:.3f}, "
                     f"{row['accuracy_ci_high']:.3f}], 5-95% {row['accuracy_q05']:.3f}-{row['accuracy_q95']:.3f}, "
                     f"p={judged['target'][f'p_vs_{kind}']:.3g}")
    return "; ".join(parts)


def verdicts(summary: pd.DataFrame, k_star: int, scores: Any, stab: pd.DataFrame, design: pd.DataFrame,
             transfer: pd.DataFrame | None, cross: pd.DataFrame | None, vqa: pd.DataFrame | None,
             kinds: pd.DataFrame | None = None, scan: dict[str, Any] | None = None) -> pd.DataFrame:
    """The claims table. Causal claims use ``summary_verdict`` (set-level rule against both controls);
    ``kinds`` is ``ablation_kind_table``, ``scan`` the facts of ``head_scan.write_head_scan`` (module doc: rules)."""
    rows = []
    base = summary[summary["condition"] == "baseline"].iloc[0]
    judged = summary_verdict(summary, k_star, controls=CONTROL_KINDS)
    top = judged["target"]
    rows.append({"claim": "causal: masking top-k VRHs hurts more than k random heads (uniform and layer-matched)",
                 "verdict": judged["verdict"],
                 "numbers": f"k={k_star} ({_heads(summary, k_star)}): baseline {base['accuracy']:.3f}, "
                            f"top-k {top['accuracy']:.3f} (McNemar p={top['p_value_vs_baseline']:.2g}); "
                            f"{_control_numbers(judged)} ({judged['reason']})"})
    flat = np.sort(scores.scores.ravel())[::-1]
    tenth = max(1, len(flat) // 10)
    share = float(flat[:tenth].sum() / flat.sum()) if flat.sum() > 0 else float("nan")
    rows.append({"claim": "sparse: a few heads carry the score",
                 "verdict": "holds" if share >= 0.3 else "does not hold",
                 "numbers": f"top 10% of heads ({tenth}) carry {share:.1%} of the total score "
                            "(rule: >= 30%, 3x uniform)"})
    ranked = design.dropna(subset=["drop"]).reset_index(drop=True)
    default_label = "Q=output, Phi=sum, Omega=mean"
    position = (int(ranked.index[ranked["variant"] == default_label][0]) + 1
                if (ranked["variant"] == default_label).any() else None)
    default_row = ranked.iloc[position - 1] if position is not None else None
    design_holds = (default_row is not None and position <= 3 and default_row["drop"] > 0
                    and default_row["p_value_vs_baseline"] < 0.05 and default_row.get("p_vs_random", 1.0) <= 0.05)
    rows.append({"claim": "design space: (output, sum, mean) is among the 3 most causal variants and beats random sets",
                 "verdict": "holds" if design_holds else "does not hold",
                 "numbers": f"default ranks {position} of {len(ranked)} by accuracy drop"
                            + ("" if default_row is None else
                               f" (p={default_row.get('p_vs_random', float('nan')):.3g} vs "
                               f"{int(default_row.get('random_sets', 0))} random sets of mean accuracy "
                               f"{default_row.get('random_mean_accuracy', float('nan')):.3f})")
                            + f"; best: {ranked.iloc[0]['variant']} (drop {ranked.iloc[0]['drop']:.3f})"})
    parse_increase = top["parse_failure_rate"] - base["parse_failure_rate"]
    misloc_increase = top["mislocation_rate"] - base["mislocation_rate"]
    split = "" if pd.isna(top.get("other_object_rate", float("nan"))) else (
        f"; of the mislocations: boxed another object {base['other_object_rate']:.3f} -> "
        f"{top['other_object_rate']:.3f}, boxed no object {base['no_object_rate']:.3f} -> {top['no_object_rate']:.3f}")
    rows.append({"claim": "functionally specific: masking causes mislocation, not parse failure",
                 "verdict": "holds" if misloc_increase > 0 and misloc_increase > parse_increase else "does not hold",
                 "numbers": f"k={k_star}: mislocation {base['mislocation_rate']:.3f} -> {top['mislocation_rate']:.3f}, "
                            f"parse failure {base['parse_failure_rate']:.3f} -> "
                            f"{top['parse_failure_rate']:.3f}{split}"})
    small = None
    if not stab.empty:  # the paper's point: ~20 samples suffice; judge there (or at the largest size below it)
        sizes = stab["samples"]
        chosen = 20 if (sizes == 20).any() else int(sizes[sizes <= 20].max() if (sizes <= 20).any() else sizes.min())
        small = stab[sizes == chosen].iloc[0]
    rows.append({"claim": "stable: few samples recover the top-k",
                 "verdict": "holds" if small is not None and small["mean_overlap"] >= 0.8 else "inconclusive",
                 "numbers": "" if small is None else f"{int(small['samples'])} samples: mean top-{int(small['k'])} "
                                                      f"overlap {small['mean_overlap']:.2f}"})
    if transfer is not None and cross is not None:
        first = transfer.iloc[0]
        cross_ok = bool((cross["transferred_verdict"] == "holds").all())
        rows.append({"claim": "shared: heads transfer between models sharing the backbone",
                     "verdict": "holds" if first["p_value"] < 0.05 and cross_ok else "does not hold",
                     "numbers": f"{first['statistic']} {first['value']:.2f} (chance {first['chance_mean']:.2f}, "
                                f"p={first['p_value']:.3g}); cross-masking drops: "
                                + "; ".join(f"{r.direction}: transferred {r.transferred_drop:.3f} vs random "
                                            f"{r.random_drop:.3f} (p={r.transferred_p_vs_random:.3g} vs "
                                            f"{r.random_sets} random sets: {r.transferred_verdict})"
                                            for r in cross.itertuples())})
    else:
        rows.append({"claim": "shared: heads transfer between models sharing the backbone", "verdict": "not measured",
                     "numbers": "no second model"})
    rows.append(vqa_verdict(vqa, k_star))
    rows.append(ablation_agreement(kinds, k_star))
    rows.append(score_predicts_damage(scan))
    return pd.DataFrame(rows)


def ablation_agreement(kinds: pd.DataFrame | None, k_star: int) -> dict[str, str]:
    """The claim "the causal verdict at k* does not depend on the ablation kind" from ``ablation_kind_table``."""
    claim = "ablation kinds agree: the causal verdict at k* is the same under zero, mean and resample ablation"
    if kinds is None or kinds.empty:
        return {"claim": claim, "verdict": "not measured", "numbers": "ablation kinds not compared"}
    agree = kinds["verdict"].nunique() == 1
    numbers = "; ".join(f"{r.ablation}: top-{k_star} {r.top_accuracy:.3f} vs random {r.random_mean:.3f} "
                        f"(p={r.p_vs_random:.3g}), matched {r.matched_mean:.3f} (p={r.p_vs_matched:.3g}): {r.verdict}"
                        for r in kinds.itertuples())
    return {"claim": claim, "verdict": "holds" if agree else "does not hold",
            "numbers": f"n={int(kinds['n'].iloc[0])} items, baseline {kinds['baseline'].iloc[0]:.3f}; {numbers}"}


def score_predicts_damage(scan: dict[str, Any] | None) -> dict[str, str]:
    """The claim "a head's score predicts how much masking it alone hurts" (rule in the module doc)."""
    claim = "score predicts causal importance: Spearman(score, single-head accuracy drop) > 0"
    if not scan:
        return {"claim": claim, "verdict": "not measured", "numbers": "no single-head scan"}
    rho, p = scan["spearman"], scan["p_value"]
    holds = bool(np.isfinite(rho) and rho > 0 and p < 0.05)
    return {"claim": claim, "verdict": "holds" if holds else "does not hold",
            "numbers": f"Spearman {rho:.3f} over {scan['heads']} heads{_scan_sample(scan)} (one-sided permutation "
                       f"p={p:.3g}; rule: > 0 "
                       f"with p < 0.05), n={scan['n']} items, baseline {scan['baseline_accuracy']:.3f}; the top-scored "
                       f"head {scan['top_head']} ranks {scan['top_head_damage_rank']} of {scan['heads']} by damage"}


TERMINAL_WIDTH = 100


def claims_text(table: pd.DataFrame, width: int = TERMINAL_WIDTH) -> str:
    """The verdicts table for a terminal: per claim, its verdict and the claim on one line, then its numbers
    wrapped and indented (the whole table is in demo.json and the report)."""
    blocks = []
    for row in table.to_dict(orient="records"):
        head = textwrap.fill(f"{str(row['verdict']).upper():>15}  {row['claim']}", width, subsequent_indent=" " * 17,
                             break_on_hyphens=False)
        body = textwrap.fill(str(row.get("numbers", "")), width, initial_indent=" " * 17, subsequent_indent=" " * 17,
                             break_on_hyphens=False)
        blocks.append(f"{head}\n{body}")
    return "\n".join(blocks)


def _scan_sample(scan: dict[str, Any]) -> str:
    """' of 128 (a sample: ...)' when the scan masked a sample of the heads (``scan_heads``), else ''."""
    return f" of {scan['total_heads']} ({scan['sampled']})" if scan.get("sampled") else ""


def _heads(summary: pd.DataFrame, k: int) -> str:
    """k as a share of all heads, from the summary's ``k_fraction`` (or '?' where unknown)."""
    fraction = summary.loc[summary["k"] == k, "k_fraction"] if "k_fraction" in summary else pd.Series(dtype=float)
    if len(fraction) and pd.notna(fraction.iloc[0]):
        return f"{float(fraction.iloc[0]):.1%} of the heads"
    return "? of the heads"


ANSWERS_VQA_MARGIN = 0.1  # a kind counts as answered when the unmasked model beats the majority answer by this


def vqa_verdict(vqa: pd.DataFrame | None, k_star: int) -> dict[str, str]:
    """The cross-task claim, judged per VQA kind the model actually answers, with the causal claim's rule
    (``summary_verdict`` against the random and the layer-matched sets).

    ``vqa`` is ``VQASweepResult.summary()`` plus a ``majority_baseline`` column. Kinds where the unmasked
    model does not beat always giving the most common answer by ``ANSWERS_VQA_MARGIN`` are reported but not
    judged (masking cannot show anything on a kind the model cannot do). Over the judged kinds: "holds" when
    it holds on every one, "does not hold" when it does not hold on any, else "inconclusive".
    """
    claim = "generalises to VQA: masking the top-k VRHs hurts VQA more than k random heads"
    if vqa is None or vqa.empty:
        return {"claim": claim, "verdict": "not measured", "numbers": "no VQA items"}
    parts, judged = [], []
    for benchmark, part in vqa.groupby("benchmark", sort=False):
        base = part[part["condition"] == "baseline"].iloc[0]
        k = int(part.loc[part["condition"] == "top", "k"].iloc[0])
        result = summary_verdict(part, k, controls=CONTROL_KINDS)
        top = result["target"]
        answered = base["accuracy"] >= base["majority_baseline"] + ANSWERS_VQA_MARGIN
        if answered:
            judged.append(result["verdict"])
        parts.append(f"{benchmark}: baseline {base['accuracy']:.3f} (majority answer {base['majority_baseline']:.3f}), "
                     f"top-{k} {top['accuracy']:.3f} (McNemar p={top['p_value_vs_baseline']:.2g}); "
                     f"{_control_numbers(result)}: {result['verdict']}"
                     + ("" if answered else " (not answered: not judged)"))
    if not judged:
        verdict = "not measured"
        parts.insert(0, "the model does not answer the VQA items above the majority-answer level")
    elif all(v == "holds" for v in judged):
        verdict = "holds"
    else:
        verdict = "does not hold" if all(v == "does not hold" for v in judged) else "inconclusive"
    return {"claim": claim, "verdict": verdict, "numbers": "; ".join(parts)}


def cross_task_vqa(vlm: Any, scores: Any, k_star: int, vqa_scenes: int, out: Path, batch_size: int,
                   random_sets: int = 20) -> pd.DataFrame:
    """VQA sweep on the synthetic VQA items of the first ``vqa_scenes`` eval scenes: unmasked, top-k* heads,
    ``random_sets`` random and as many layer-matched sets of k* heads."""
    from vrh_interp.data.datasets.synthetic_vqa import majority_answer_rate, synthetic_vqa
    from vrh_interp.experiments.vqa_sweep import vqa_sweep

    items = synthetic_vqa("eval", vqa_scenes)
    result = vqa_sweep(vlm, items, scores.top(k_star), random_seeds=range(random_sets), batch_size=batch_size,
                       run_dir=out / "vqa")
    summary = result.summary()
    majority = {b: majority_answer_rate([s for s in items if s.benchmark == b]) for b in result.benchmarks}
    summary["majority_baseline"] = summary["benchmark"].map(majority)
    return summary


def evaluation_items(scenes: int) -> list[Any]:
    """Every referent of the first ``scenes`` evaluation scenes (``data.grounding_samples``, level 1): several
    items per image, ids ``eval-<scene>-L1-o<object>`` (unique; disjoint from the ``detect-`` scenes)."""
    from vrh_interp.data import grounding_samples

    return [sample for index in range(scenes) for sample in grounding_samples("eval", index, 1)]


def check_subset(items: Sequence[Any], count: int) -> list[Any]:
    """``count`` items in whole scenes spread evenly over ``items`` (every n-th scene; a scene: consecutive items
    showing the same image object, so a scene's referents share their image prefix in a generation:
    ``interventions.shared_image_prefix``); the last scene cut to make ``count``. Fixed, spread over the scenes."""
    if count >= len(items):
        return list(items)
    scenes: list[list[Any]] = []
    for item in items:
        image = getattr(item, "image", None)
        if scenes and image is not None and getattr(scenes[-1][0], "image", None) is image:
            scenes[-1].append(item)
        else:
            scenes.append([item])
    wanted = min(len(scenes), math.ceil(count * len(scenes) / len(items)))
    picked = [item for i in range(wanted) for item in scenes[math.floor(i * len(scenes) / wanted)]]
    return picked[:count]


def main_conditions(ranking: Any, geometry: Any, ks: Sequence[int], k_star: int, random_sets: int,
                    curve_sets: int) -> list[Condition]:
    """``sweep_conditions`` with ``random_sets`` sets per control kind, keeping all of them at k* and the first
    ``curve_sets`` (seeds 0..curve_sets-1, the same draws) at every other k."""
    conditions = sweep_conditions(ranking, geometry, ks, list(range(random_sets)))
    return [c for c in conditions if c.kind not in CONTROL_KINDS or c.k == k_star or c.seed < curve_sets]


def restrict(result: SweepResult, sample_ids: Sequence[str], keep: Callable[[Condition], bool]) -> SweepResult:
    """The records of ``result`` on ``sample_ids`` under the conditions ``keep`` accepts (the baseline always)."""
    conditions = [c for c in result.conditions if c.kind == "baseline" or keep(c)]
    keys = {c.key for c in conditions}
    records = result.records
    records = records[records["sample_id"].isin(set(sample_ids)) & records["condition"].isin(keys)]
    return SweepResult(records.reset_index(drop=True), conditions, result.iou_threshold, result.total_heads)


def ablation_kind_table(summaries: dict[str, pd.DataFrame], k_star: int) -> pd.DataFrame:
    """One row per ablation kind: the k* numbers and the set-level verdict of its summary."""
    rows = []
    for kind, summary in summaries.items():
        judged = summary_verdict(summary, k_star)
        top, controls = judged["target"], judged["controls"]
        rows.append({"ablation": kind, "k": k_star, "n": int(top["n"]),
                     "baseline": float(summary[summary["condition"] == "baseline"]["accuracy"].iloc[0]),
                     "top_accuracy": float(top["accuracy"]), "p_value_vs_baseline": float(top["p_value_vs_baseline"]),
                     **{f"{c}_mean": float(controls[c]["accuracy"]) if controls.get(c) is not None else float("nan")
                        for c in CONTROL_KINDS},
                     **{f"p_vs_{c}": float(top[f"p_vs_{c}"]) for c in CONTROL_KINDS},
                     "verdict": judged["verdict"], "reason": judged["reason"]})
    return pd.DataFrame(rows)


def interval_widths(summary: pd.DataFrame, k_star: int) -> str:
    """What the sample size buys: the widths of the baseline's and top-k*'s bootstrap intervals and of each
    control's two-level interval at k*."""
    parts = []
    for label, rows in (("baseline", summary[summary["condition"] == "baseline"]),
                        (f"top-{k_star}", summary[(summary["condition"] == "top") & (summary["k"] == k_star)]),
                        *((f"{c} mean", summary[(summary["condition"] == c) & (summary["k"] == k_star)
                                                & (summary["seed"].astype(str) == "all")]) for c in CONTROL_KINDS)):
        if len(rows):
            row = rows.iloc[0]
            parts.append(f"{label} +/-{(row['accuracy_ci_high'] - row['accuracy_ci_low']) / 2:.3f}")
    return ", ".join(parts)


def planned_answers(conditions: Sequence[Condition], items: int) -> int:
    """Greedy answers a ``run_conditions`` call costs: distinct (heads, ablation) x items."""
    return len({head_signature(c) for c in conditions}) * items


# ------------------------------------------------------------------------------------------------------------------
# Planning: sample counts from a time budget (module doc, "Sizes")

DEFAULT_BUDGET_SECONDS = 180.0
# the single-head scan masks every head of a model up to SCAN_ALL_HEADS heads; above, the top k* heads plus a
# seeded uniform sample of the others, SCAN_SAMPLED_HEADS in all (``scan_heads``): the Spearman estimates the
# all-heads correlation from a random sample at a quarter of the cost on a 128-head model
SCAN_ALL_HEADS = 48
SCAN_SAMPLED_HEADS = 32
SCAN_SEED = 0


def scan_heads(ranking: Any, geometry: Any, k_star: int) -> Any:
    """The heads the demo's single-head scan masks (constants above): all of them, or the top ``k_star`` of
    ``ranking`` and a uniform sample (seed ``SCAN_SEED``) of the rest, in (layer, head) order."""
    from vrh_interp.core.heads import HeadSet

    everything = geometry.all_heads()
    if len(everything) <= SCAN_ALL_HEADS:
        return everything
    top = list(ranking[:k_star])
    rest = [h for h in everything if h not in set(top)]
    drawn = np.random.default_rng(SCAN_SEED).choice(len(rest), SCAN_SAMPLED_HEADS - len(top), replace=False)
    return HeadSet(sorted(top + [rest[i] for i in drawn], key=lambda h: (h.layer, h.head)))
ITEMS_PER_SCENE = 3.3  # referents per level-1 evaluation scene (502 items on 152 scenes)
QUESTIONS_PER_SCENE = 2.7  # synthetic VQA questions per evaluation scene (67 on 25)
CONTROL_DETECT_SCENES = 20  # the positive control's detection scenes (``run_positive_control``'s default)
CONTROL_RANDOM_SETS = 20  # ... and its random / layer-matched sets (its verdict rule needs them; fixed)
ABLATION_COST = 1.1  # a mean / resample-ablated answer vs a zero-ablated one (toy A: 0.6-1.0x measured, 1.5x once)
# a resample-ablated answer where a scene's referents otherwise share their image prefix (each row has its own
# donor, so nothing is shared): vs a shared zero-ablated answer
UNSHARED_COST = 3.0  # (toy C: 3.1x in a default demo run, 2.3x in a single 3-condition batch; toy A: 2.6x there)
# the plans aim at this share of the budget: on a quiet 2-core machine the default toy:c demo ran 8 % over its
# estimate (resample ablation and the VQA step cost more than their calibration says)
PLAN_MARGIN = 0.92
VALUES_COST = 0.5  # ``ablation_values`` per detection sample, in detection samples (toy A: 0.47)
DESIGN_VARIANT_SETS = 8  # distinct top-k* sets among the 15 design variants (toy A: 6 at k=1, 11 at k=3)
OVERLAY_ANSWERS = 10  # one overlay figure (three attention read-outs and a plot), in greedy answers
STABILITY_SECONDS = 1.0  # sparsity and stability: bootstrap on the detection statistics (toy A: 0.02 s / 60)
REPORT_SECONDS = 8.0  # the report: about ten matplotlib figures and the tables
VQA_KINDS = 3  # question kinds of the synthetic VQA items, each summarised on its own
CALIBRATION_ITEMS = 16  # grounding items x CALIBRATION_SETS head sets (baseline and random k* sets) timed: one
CALIBRATION_SETS = 8  # batched pass of 128 rows, as fast per answer as the steps' passes (toy A: ~30 ms per answer
# with 8 or 16 sets, ~55 ms with 3); then the summary of that result (bootstrap, set-level statistics) is timed
CALIBRATION_CONTROL_SETS = 8  # the same on the positive control's model
CALIBRATION_GROUP_SETS = 20  # one set-level bootstrap of 20 sets timed (a control group's cost in a summary)
CALIBRATION_SCORED = 8  # detection samples timed
CALIBRATION_VQA_SCENES = 5  # VQA scenes timed (baseline, top, one random and one matched set)
RETIME_RATIO = 2.0  # an answer timed slower than this many detection samples is timed again (toy A: ~0.5)


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What the demo runs on. ``BUDGETED`` fields are planned from the budget unless given; the control set
    counts are not (20 random and 20 layer-matched sets at k*: the verdict rule needs them)."""

    detect_scenes: int
    eval_scenes: int
    check_items: int
    vqa_scenes: int
    control_scenes: int  # the positive control's evaluation scenes (one item each)
    random_sets: int = 20
    curve_sets: int = 2


BUDGETED = ("detect_scenes", "eval_scenes", "check_items", "vqa_scenes", "control_scenes")
# the smallest plan the demo picks by itself (explicit sizes may go lower; about 2 minutes on toy:c on a quiet
# 2-core machine, with its wider intervals printed) and the largest (what the demo ran before it planned: >= 500
# evaluation items); detection stays >= 60 scenes so that the stability claim's 20-sample rankings are compared
# with a reference of three times as many samples
MINIMUM_SIZES = Sizes(detect_scenes=60, eval_scenes=16, check_items=12, vqa_scenes=6, control_scenes=16)
FULL_SIZES = Sizes(detect_scenes=200, eval_scenes=152, check_items=50, vqa_scenes=25, control_scenes=30)


@dataclasses.dataclass(frozen=True)
class Rates:
    """Measured seconds (``calibrate``): per greedy grounding answer (one head-mask condition on one item, as
    ``run_conditions`` answers it), per detection sample, per VQA answer (as ``vqa_sweep`` answers it), per
    answer of the positive control's model, per model load, per condition and per control group summarised."""

    answer: float
    scoring: float
    vqa: float
    control_answer: float
    load: float
    summary: float = 0.0  # s per condition of a result's ``summary()`` (bootstrap interval, rates, McNemar)
    group: float = 0.0  # s per control group (kind, k) there: the set-level two-level bootstrap

    def scaled(self, factor: float) -> "Rates":
        return Rates(*(value * factor for value in dataclasses.astuple(self)))


@dataclasses.dataclass(frozen=True)
class PlanFacts:
    """What a plan's cost depends on besides the sizes: head-set counts (distinct sets: ``run_conditions``
    answers a repeated set once) and which optional steps run."""

    model: str
    total_heads: int
    k_star: int
    main_sets: int  # the main k-sweep (``main_conditions``), baseline included
    main_conditions: int  # ... counting repeated sets (each is summarised)
    main_groups: int  # ... its control groups (kind, k), each with a set-level bootstrap in the summary
    kind_sets: int  # the k in (0, k*) part of it: ablation kinds (each kind), and the VQA sweep
    design_sets: int  # baseline, the variants' distinct top-k* sets, random sets
    cross_sets: int  # per model: baseline, own, transferred, random sets
    control_sets: int  # positive control: baseline, top, random and layer-matched sets, decoys
    positive_control: bool
    transfer: bool
    overlay_items: int = 3
    shared_prefix: bool = False  # the family shares a scene's image prefix (``FamilyAdapter.image_prefix_cache``)


@dataclasses.dataclass(frozen=True)
class StepPlan:
    number: int
    name: str
    work: str  # what the step runs, in words
    answers: int  # greedy answers (masked generations; VQA answers in step 9)
    scored: int  # detection samples scored (ablation reference outputs counted at VALUES_COST)
    seconds: float  # estimated


STEP_NAMES = {0: "start, calibration", 1: "positive control", 2: "detection", 3: "k-sweep", 4: "ablation kinds",
              5: "single-head scan", 6: "design space", 7: "sparsity, stability", 8: "transfer", 9: "cross-task VQA",
              10: "overlays, report"}


def _stand_in_ranking(geometry: Any) -> Any:
    """A ranking spread over the layers (L0H0, L1H0, ..., L0H1, ...): the detected sets' control draws, and so
    the count of distinct control sets, depend on the ranking only through its per-layer counts."""
    from vrh_interp.core.heads import HeadSet

    return HeadSet(sorted(geometry.all_heads(), key=lambda h: (h.head, h.layer)))


def plan_facts(geometry: Any, random_sets: int, curve_sets: int, *, model: str, positive_control: bool,
               transfer: bool, overlay_items: int = 3, shared_prefix: bool = False) -> PlanFacts:
    """``PlanFacts`` for a model of ``geometry`` (distinct head sets counted on a stand-in ranking)."""
    from vrh_interp.experiments.sweep import control_conditions

    ks, k_star = demo_ks(geometry.total_heads)
    ranking = _stand_in_ranking(geometry)
    conditions = main_conditions(ranking, geometry, ks, k_star, random_sets, curve_sets)
    at_k_star = [c for c in conditions if c.k in (0, k_star)]
    detected = ranking[: 2 * k_star]  # own and transferred top-k* (cross-masking draws outside both)
    cross = control_conditions(geometry, detected, k_star, None, range(random_sets), matched=False) \
        if geometry.total_heads - len(detected) >= k_star else []
    return PlanFacts(model=model, total_heads=geometry.total_heads, k_star=k_star,
                     main_sets=planned_answers(conditions, 1), main_conditions=len(conditions),
                     main_groups=len({(c.kind, c.k) for c in conditions if c.kind in CONTROL_KINDS}),
                     kind_sets=planned_answers(at_k_star, 1),
                     design_sets=1 + DESIGN_VARIANT_SETS + planned_answers(cross, 1),
                     cross_sets=3 + planned_answers(cross, 1), control_sets=3 + 2 * CONTROL_RANDOM_SETS,
                     positive_control=positive_control, transfer=transfer, overlay_items=overlay_items,
                     shared_prefix=shared_prefix)


def plan_steps(sizes: Sizes, facts: PlanFacts, rates: Rates) -> list[StepPlan]:
    """Steps 1-10 with their greedy answers and estimated seconds (module doc): answers x seconds per answer,
    samples scored x seconds per sample, conditions summarised x seconds per condition, plus the fixed costs
    (the cost model's constants are the module's ``*_COST``, ``*_SECONDS`` and ``*_PER_SCENE`` values)."""
    items = round(sizes.eval_scenes * ITEMS_PER_SCENE)
    checks = min(sizes.check_items, items)
    questions = round(sizes.vqa_scenes * QUESTIONS_PER_SCENE)
    scoring_per_answer = rates.scoring / rates.answer if rates.answer > 0 else 1.0
    at_k_star = 2 + 2 * sizes.random_sets  # baseline, top-k*, random and layer-matched sets
    steps = []

    def add(number: int, work: str, answers: int = 0, scored: float = 0, seconds: float = 0.0) -> None:
        steps.append(StepPlan(number, STEP_NAMES[number], work, int(answers), int(round(scored)), float(seconds)))

    if facts.positive_control:
        answers = facts.control_sets * sizes.control_scenes
        add(1, f"toy:planted: {CONTROL_DETECT_SCENES} detect + {sizes.control_scenes} eval scenes x "
               f"{facts.control_sets} sets", answers, CONTROL_DETECT_SCENES,
            rates.load + rates.control_answer * (answers + scoring_per_answer * CONTROL_DETECT_SCENES)
            + rates.summary * facts.control_sets + rates.group * 2)
    else:
        add(1, "skipped")
    add(2, f"{sizes.detect_scenes} scenes scored", 0, sizes.detect_scenes, rates.scoring * sizes.detect_scenes)
    answers = facts.main_sets * items
    add(3, f"~{items} items ({sizes.eval_scenes} scenes) x {facts.main_sets} sets", answers, 0,
        rates.answer * answers + rates.summary * facts.main_conditions + rates.group * facts.main_groups)
    answers = 2 * facts.kind_sets * checks
    resample = UNSHARED_COST if facts.shared_prefix else 1.0  # mean rows share the prefix, resample rows cannot
    add(4, f"{checks} items x {facts.kind_sets} sets x (mean, resample)", answers,
        VALUES_COST * sizes.detect_scenes,
        rates.answer * ABLATION_COST * answers * (1 + resample) / 2 + rates.scoring * VALUES_COST * sizes.detect_scenes
        + (rates.summary * at_k_star + rates.group * 2) * 3)
    scanned = min(facts.total_heads, SCAN_SAMPLED_HEADS) if facts.total_heads > SCAN_ALL_HEADS else facts.total_heads
    answers = (scanned + 1) * checks
    add(5, f"{checks} items x {scanned + 1} sets (each head alone)", answers, 0, rates.answer * answers)
    answers = facts.design_sets * checks
    add(6, f"{checks} items x ~{facts.design_sets} sets", answers, 0,
        rates.answer * answers + rates.summary * (1 + DESIGN_VARIANT_SETS + sizes.random_sets) + rates.group)
    add(7, "bootstrap on the detection scores", 0, 0, STABILITY_SECONDS)
    if facts.transfer:
        answers = 2 * facts.cross_sets * checks
        add(8, f"{sizes.detect_scenes} scenes scored; {checks} items x {facts.cross_sets} sets x 2 models",
            answers, sizes.detect_scenes, rates.load + rates.scoring * sizes.detect_scenes + rates.answer * answers
            + (rates.summary * (3 + sizes.random_sets) + rates.group) * 2)
    else:
        add(8, "skipped (no second model)")
    answers = facts.kind_sets * questions
    add(9, f"~{questions} questions ({sizes.vqa_scenes} scenes) x {facts.kind_sets} sets", answers, 0,
        rates.vqa * answers + (rates.summary * at_k_star + rates.group * 2) * VQA_KINDS)
    answers = OVERLAY_ANSWERS * facts.overlay_items
    add(10, f"{facts.overlay_items} overlays; report", answers, 0, rates.answer * answers + REPORT_SECONDS)
    return steps


def planned_seconds(steps: Sequence[StepPlan], from_step: int = 1) -> float:
    return float(sum(s.seconds for s in steps if s.number >= from_step))


def sizes_at(fraction: float, fixed: dict[str, int] | None = None) -> Sizes:
    """The sizes ``fraction`` of the way from ``MINIMUM_SIZES`` to ``FULL_SIZES`` (rounded), ``fixed`` kept."""
    fixed = fixed or {}
    values = {}
    for field in dataclasses.fields(Sizes):
        name = field.name
        low, high = getattr(MINIMUM_SIZES, name), getattr(FULL_SIZES, name)
        planned = int(math.floor(low + fraction * (high - low) + 0.5))
        values[name] = int(fixed[name]) if fixed.get(name) is not None else planned
    return Sizes(**values)


def choose_sizes(budget: float | None, facts: PlanFacts, rates: Rates, fixed: dict[str, int] | None = None, *,
                 from_step: int = 1) -> tuple[Sizes, bool]:
    """The largest sizes (one fraction between ``MINIMUM_SIZES`` and ``FULL_SIZES``; ``fixed`` kept) whose
    estimated seconds for steps ``from_step``.. fit ``budget``, and whether they fit. Never below the minimum
    (then ``fits`` is False), never above the full sizes; ``budget`` None: no budget, the full sizes."""
    fixed = fixed or {}

    def cost(fraction: float) -> float:
        return planned_seconds(plan_steps(sizes_at(fraction, fixed), facts, rates), from_step)

    if budget is None or cost(1.0) <= budget:
        return sizes_at(1.0, fixed), True
    if cost(0.0) > budget:
        return sizes_at(0.0, fixed), False
    low, high = 0.0, 1.0  # cost is non-decreasing in the fraction (rounded sizes only grow)
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (middle, high) if cost(middle) <= budget else (low, middle)
    return sizes_at(low, fixed), True


def half_width(n: int, p: float = 0.5) -> float:
    """The 95 % normal-approximation half-width of a proportion ``p`` measured on ``n`` items."""
    return 1.96 * math.sqrt(p * (1 - p) / n) if n > 0 else float("nan")


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value < 120 else f"{value:.0f} s ({value / 60:.1f} min)"


def format_plan(steps: Sequence[StepPlan], sizes: Sizes, facts: PlanFacts, rates: Rates, *, budget: float | None,
                calibration_seconds: float, fits: bool = True) -> str:
    """The plan as printed before step 1: per step what runs, its greedy answers and estimated seconds; the
    total against the budget; what the sizes buy (expected 95 % half-widths of an accuracy)."""
    control = f"; toy:planted {1000 * rates.control_answer:.0f} ms per answer" if facts.positive_control else ""
    width = 54
    lines = [f"plan for {facts.model} ({facts.total_heads} heads, k* = {facts.k_star}) from the calibration:",
             f"  {1000 * rates.answer:.0f} ms per masked answer, {1000 * rates.scoring:.0f} ms per detection sample, "
             f"{1000 * rates.vqa:.0f} ms per VQA answer{control}; summaries: {1000 * rates.summary:.0f} ms per "
             f"condition, {1000 * rates.group:.0f} ms per control group",
             f"  {'step':<22} {'work':<{width}} {'answers':>8} {'est.':>6}",
             f"  {'0 ' + STEP_NAMES[0]:<22} {'imports, model load, timed calls on each model (done)':<{width}} {'':>8} "
             f"{calibration_seconds:>5.0f}s"]
    for step in steps:
        answers = f"{step.answers:,}" if step.answers else ""
        lines.append(f"  {f'{step.number} {step.name}':<22} {step.work:<{width}} {answers:>8} {step.seconds:>5.0f}s")
    total = calibration_seconds + planned_seconds(steps)
    answers = sum(s.answers for s in steps)
    target = "no budget: the full sizes" if not budget or budget <= 0 else \
        f"budget {budget:.0f} s" + ("" if fits else ": even the smallest plan does not fit; running it")
    lines.append(f"  {'total':<22} {'at the load the calibration saw':<{width}} {answers:>8,} {total:>5.0f}s  "
                 f"({target})")
    items = round(sizes.eval_scenes * ITEMS_PER_SCENE)
    checks = min(sizes.check_items, items)
    questions = round(sizes.vqa_scenes * QUESTIONS_PER_SCENE)
    lines.append(f"  sizes: {sizes.eval_scenes} evaluation scenes (~{items} items: 95 % half-width of an accuracy "
                 f"+/-{half_width(items):.3f} at 0.5, +/-{half_width(items, 0.9):.3f} at 0.9); {checks} check items "
                 f"(+/-{half_width(checks):.2f} at 0.5);")
    lines.append(f"         {sizes.detect_scenes} detection scenes; {sizes.vqa_scenes} VQA scenes (~{questions} "
                 f"questions); {sizes.random_sets} random + {sizes.random_sets} layer-matched sets at k*, "
                 f"{sizes.curve_sets} of each at the other k"
                 + (f"; positive control on {sizes.control_scenes} scenes" if facts.positive_control else ""))
    return "\n".join(lines)


def calibrate(vlm: Any, *, batch_size: int, positive_control: bool, device: str | None, load_seconds: float,
              start_seconds: float = 0.0, backend: str | Backend = "nnsight") -> tuple[Rates, dict[str, Any]]:
    """Step 0: time the pieces the steps are made of, on the actual models, as the steps run them (the answers
    are thrown away): ``CALIBRATION_SETS`` head-mask conditions (the baseline and random k* sets) over
    ``CALIBRATION_ITEMS`` items through ``run_conditions`` (so a batched run of many conditions is measured at
    its real cost) and that result's ``summary()``, one set-level bootstrap of ``CALIBRATION_GROUP_SETS`` sets
    (a summary costs per condition and per control group: ``Rates.summary``, ``Rates.group``),
    ``CALIBRATION_SCORED`` detection samples, a VQA sweep on ``CALIBRATION_VQA_SCENES`` scenes, and the same
    grounding call on the positive control's model. A one-item call first pays the one-off costs of the first
    generation, which the run pays anyway but the rates must not include. Grounding and scoring are timed on
    ``backend`` (the steps that run on it), VQA on nnsight (``BACKEND_STEPS``)."""
    from vrh_interp.data.datasets.synthetic_vqa import synthetic_vqa
    from vrh_interp.experiments.vqa_sweep import vqa_sweep
    from vrh_interp.evaluation.statistics import two_level_bootstrap_ci
    from vrh_interp.evaluation.controls import random_control
    from vrh_interp.core.heads import HeadSet

    def grounding_rate(model: Any, k: int, sets: int, scenes: bool = True) -> tuple[float, int, float]:
        """Seconds per answer on items as the steps have them: a scene's referents (``scenes``: the main model's
        steps) or one item per scene (the positive control)."""
        runner = get_backend(backend if model is vlm else getattr(backend, "name", backend), model)  # planted: own
        geometry = model.geometry
        detected = _stand_in_ranking(geometry)[:k]
        conditions = [Condition("baseline", 0, None, HeadSet())]
        conditions += [Condition("random", k, seed, random_control(geometry, detected, k, seed))
                       for seed in range(sets - 1)]
        items = evaluation_items(math.ceil(CALIBRATION_ITEMS / ITEMS_PER_SCENE) + 1)[:CALIBRATION_ITEMS] if scenes \
            else synthetic_samples("eval", CALIBRATION_ITEMS)
        run_conditions(model, items[:1], conditions[:1], batch_size=batch_size, max_new_tokens=ANSWER_TOKENS,
                       progress=False, backend=runner)
        answers = planned_answers(conditions, len(items))
        clock = time.perf_counter()
        result = run_conditions(model, items, conditions, batch_size=batch_size, max_new_tokens=ANSWER_TOKENS,
                                progress=False, backend=runner)
        rate = (time.perf_counter() - clock) / answers
        clock = time.perf_counter()
        result.summary()  # its conditions and one control group (the random sets)
        return rate, answers, time.perf_counter() - clock

    parts = {"start_s": start_seconds, "load_s": load_seconds}
    clock = time.perf_counter()
    k_star = demo_ks(vlm.geometry.total_heads)[1]
    answer, answers, summarised = grounding_rate(vlm, k_star, CALIBRATION_SETS)
    parts["grounding_s"] = time.perf_counter() - clock
    clock = time.perf_counter()
    two_level_bootstrap_ci(np.ones((CALIBRATION_GROUP_SETS, CALIBRATION_ITEMS)))
    group = time.perf_counter() - clock
    parts["bootstrap_s"] = group
    summary = max(summarised - group, 0.0) / CALIBRATION_SETS
    detect = synthetic_samples("detect", CALIBRATION_SCORED)
    clock = time.perf_counter()
    collect_detection_stats(vlm, detect, batch_size=batch_size, max_new_tokens=ANSWER_TOKENS, progress=False,
                            backend=backend)
    scoring = (time.perf_counter() - clock) / len(detect)
    parts["scoring_s"] = scoring * len(detect)
    # a greedy answer costs less than a scored sample on nnsight: the timing was disturbed (on the uncached
    # transformer-lens bridge a batched masked answer costs more by design: not retimed)
    if answer > RETIME_RATIO * scoring and getattr(backend, "name", backend) == "nnsight":
        clock = time.perf_counter()  # (another process took the CPU): time it again, keep the faster
        again, _, summarised_again = grounding_rate(vlm, k_star, CALIBRATION_SETS)
        answer = min(answer, again)
        summary = max(min(summarised, summarised_again) - group, 0.0) / CALIBRATION_SETS
        parts["grounding_again_s"] = time.perf_counter() - clock
    questions = synthetic_vqa("eval", CALIBRATION_VQA_SCENES)
    clock = time.perf_counter()
    vqa = vqa_sweep(vlm, questions, _stand_in_ranking(vlm.geometry)[:k_star], random_seeds=[0], batch_size=batch_size,
                    progress=False)
    vqa_answers = planned_answers(vqa.conditions, len(questions))
    parts["vqa_s"] = time.perf_counter() - clock
    vqa_rate = parts["vqa_s"] / vqa_answers
    control_answer, control_answers, load = answer, 0, load_seconds
    if positive_control:
        from vrh_interp.experiments import positive_control as pc

        clock = time.perf_counter()
        planted = pc.load_planted(device)
        load = time.perf_counter() - clock
        control_answer, control_answers, _ = grounding_rate(planted, len(pc.declared()[0]), CALIBRATION_CONTROL_SETS,
                                                          scenes=False)
        parts["control_s"] = time.perf_counter() - clock
        del planted
    facts = {"answers": answers, "scored": len(detect), "vqa_answers": vqa_answers,
             "control_answers": control_answers, **{k: round(v, 2) for k, v in parts.items()}}
    print(f"      start-up {start_seconds:.1f} s (imports, loading the model: {load_seconds:.1f} s), calibration: "
          + ", ".join(f"{k[:-2]} {v:.1f} s" for k, v in parts.items() if k not in ("start_s", "load_s")), flush=True)
    return Rates(answer=answer, scoring=scoring, vqa=vqa_rate, control_answer=control_answer, load=load,
                 summary=summary, group=group), facts


class StepClock:
    """Per-step timing and progress. Each step keeps its estimate at the calibrated rate (``base_s``: from the
    plan, updated when the sizes are re-planned); ``factor`` is measured / base seconds over the finished steps,
    so ``left`` and each step's ``estimated_s`` (fixed when it begins) follow the rate actually measured. The
    table has the plan's seconds (``planned_s``, as printed first), ``estimated_s`` and the measured ``seconds``."""

    def __init__(self, started: float, budget: float | None, calibration_seconds: float,
                 steps: Sequence[StepPlan]) -> None:
        self.started, self.budget = started, budget
        self.rows: dict[int, dict[str, Any]] = {0: {
            "step": 0, "name": STEP_NAMES[0], "work": "imports, model load, timed calls", "answers": 0,
            "planned_s": calibration_seconds, "estimated_s": calibration_seconds, "seconds": calibration_seconds,
            "base_s": calibration_seconds}}
        for step in steps:
            self.rows[step.number] = {"step": step.number, "name": step.name, "work": step.work,
                                      "answers": step.answers, "planned_s": step.seconds, "estimated_s": step.seconds,
                                      "seconds": None, "base_s": step.seconds}
        self.current: int | None = None
        self.began = 0.0

    def replan(self, steps: Sequence[StepPlan]) -> None:
        """New sizes for the steps that have not begun: their work, answers and estimates at the calibrated
        rate (``plan_steps`` with the calibration's rates)."""
        for step in steps:
            row = self.rows[step.number]
            if row["seconds"] is None and step.number != self.current:
                row.update(work=step.work, answers=step.answers, base_s=step.seconds, estimated_s=step.seconds)

    def factor(self) -> float:
        """Measured / calibrated-estimate seconds over the finished steps 1.. (1 before any), in [0.2, 5]."""
        done = [r for r in self.rows.values() if r["step"] > 0 and r["seconds"] is not None]
        base = sum(r["base_s"] for r in done)
        if base < 1.0:
            return 1.0
        return min(5.0, max(0.2, sum(r["seconds"] for r in done) / base))

    def left(self) -> float:
        """Estimated seconds for the steps not finished (the current one counted in full)."""
        return self.factor() * sum(r["base_s"] for r in self.rows.values() if r["seconds"] is None)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def begin(self, number: int, text: str) -> None:
        self.end()
        row = self.rows[number]
        row["estimated_s"] = self.factor() * row["base_s"]
        elapsed, left = self.elapsed(), self.left()
        budget = f", budget {self.budget:.0f} s" if self.budget else ""
        print(f"[{number}/{STEPS}] {text}  ({elapsed:.0f} s elapsed; this step ~{row['estimated_s']:.0f} s, "
              f"~{left:.0f} s left: ~{elapsed + left:.0f} s in all{budget})", flush=True)
        self.current, self.began = number, time.perf_counter()

    def end(self) -> None:
        if self.current is None:
            return
        row = self.rows[self.current]
        row["seconds"] = time.perf_counter() - self.began
        print(f"      step {self.current} took {row['seconds']:.1f} s (estimated {row['estimated_s']:.1f} s)",
              flush=True)
        self.current = None

    def table(self) -> pd.DataFrame:
        """One row per step and a total: ``planned_s`` (the plan printed first), ``estimated_s`` (when the step
        began), measured ``seconds`` (the running step: so far), all rounded to 0.1 s."""
        rows = [{k: v for k, v in r.items() if k != "base_s"} for _, r in sorted(self.rows.items())]
        if self.current is not None:
            rows[[r["step"] for r in rows].index(self.current)]["seconds"] = time.perf_counter() - self.began
        frame = pd.DataFrame(rows)
        total = {"step": "total", "name": "all steps",
                 "work": f"budget {self.budget:.0f} s" if self.budget else "no budget",
                 "answers": int(frame["answers"].sum()), "planned_s": frame["planned_s"].sum(),
                 "estimated_s": frame["estimated_s"].sum(), "seconds": frame["seconds"].astype(float).sum(min_count=1)}
        frame = pd.concat([frame, pd.DataFrame([total])], ignore_index=True)
        for column in ("planned_s", "estimated_s", "seconds"):
            frame[column] = frame[column].astype(float).round(1)
        frame["step"] = frame["step"].astype(str)
        return frame


MODEL_PAIRS = {"toy:a": "toy:b", "toy:b": "toy:a", "toy:c": "toy:d", "toy:d": "toy:c"}


def shipped(spec: str) -> bool:
    """A toy model whose checkpoint is in this installation (any non-toy spec counts as available)."""
    if not spec.startswith("toy:"):
        return True
    from vrh_interp.toy import CHECKPOINT_ROOT

    return (CHECKPOINT_ROOT / spec.split(":", 1)[1] / "model.safetensors").exists()


def resolve_models(model_spec: str | None, transfer_model: str | None = "auto") -> tuple[str, str | None, str]:
    """``(main, transfer, why)``. No ``model_spec``: ``toy:c`` (128 heads, the paper's regime) where its
    checkpoint is shipped, else ``toy:a``. ``transfer_model`` "auto": the main model's partner sharing its
    backbone (``MODEL_PAIRS``: C with D, A with B), None where it has none; None or "": no transfer."""
    if model_spec is None:
        if shipped("toy:c"):
            main, why = "toy:c", "toy:c is shipped (128 heads, spare capacity: the paper's regime)"
        else:
            main, why = "toy:a", ("toy:c is not shipped in this installation (no vrh_interp/toy/checkpoints/c/"
                                  "model.safetensors), so the 32-head toy:a")
    else:
        main, why = model_spec, "--model"
    if transfer_model == "auto":
        transfer = MODEL_PAIRS.get(main)
        why += f"; transfer to {transfer}, which shares its backbone" if transfer else \
            "; no known partner sharing its backbone: transfer not measured (--transfer-model)"
    elif transfer_model:
        transfer, why = transfer_model, why + f"; transfer to {transfer_model} (--transfer-model)"
    else:
        transfer, why = None, why + "; transfer skipped (--transfer-model '')"
    return main, transfer, why


def write_overlays(vlm: Any, samples: Sequence[Any], heads: Any, out: Path) -> list[Path]:
    """Attention overlays (all heads, the top heads, all but the top heads) on ``samples``: one PNG per sample
    with the three panels side by side (``overlays.prediction_overlays``), under ``out/overlays``."""
    from vrh_interp.viz.overlays import prediction_overlays
    from vrh_interp.viz.plots import overlay_panels

    folder = out / "overlays"
    folder.mkdir(exist_ok=True)
    paths = []
    for sample in samples:
        result = prediction_overlays(vlm, sample, heads, max_new_tokens=ANSWER_TOKENS)
        fig = overlay_panels(result, title=f"{sample.sample_id}: \"{sample.expression}\" (answer {result.answer!r})")
        path = folder / f"{sample.sample_id}.png"
        fig.savefig(path)
        paths.append(path)
    return paths


def _available(spec: str) -> bool:
    """False (with a message) for a shipped toy model whose checkpoint is not in this installation."""
    if shipped(spec):
        return True
    print(f"      transfer skipped: {spec} has no shipped checkpoint in this installation")
    return False


def _load(spec: str, device: str | None, dtype: str | None) -> Any:
    from vrh_interp.specs import load_spec

    return load_spec(spec, device, dtype)


def _detect(vlm: Any, samples: list[Any], out: Path, batch_size: int,
            backend: str | Backend = "nnsight") -> tuple[list[Any], Any]:
    stats = collect_detection_stats(vlm, samples, batch_size=batch_size, max_new_tokens=ANSWER_TOKENS,
                                    run_dir=out, dataset=f"synthetic:detect:{len(samples)}", backend=backend)
    provenance = {"model": model_provenance(vlm), "dataset": f"synthetic:detect:{len(samples)}",
                  "libraries": library_versions(), "created": now_utc(),
                  "sample_ids": [s.sample_id for s in samples]}
    return stats, scores_from_stats(stats, "vrh", provenance)


def positive_control_step(out: Path, device: str | None, batch_size: int,
                          eval_scenes: int = 30, backend: str = "nnsight") -> dict[str, Any] | None:
    """Step 1: the positive control on ``toy:planted`` into ``out/positive_control`` (None, with the reason
    printed, where its checkpoint is not shipped)."""
    from vrh_interp.experiments import positive_control as pc

    if not pc.available():
        print(f"      positive control skipped: the {pc.SPEC} checkpoint is not shipped in this installation "
              "(vrh_interp/toy/checkpoints/planted); the verdicts below then have no known-positive reference")
        return None
    outcome = pc.run_positive_control(out / "positive_control", device=device, batch_size=batch_size,
                                      detect_scenes=CONTROL_DETECT_SCENES, eval_scenes=eval_scenes,
                                      random_sets=CONTROL_RANDOM_SETS, backend=backend)
    print("      " + pc.describe(outcome))
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        print(read_grading(out / "positive_control" / "grading.csv").to_string(index=False))
    return outcome


STEPS = 10
PLAN_FILE = "plan.json"
# with --backend transformer-lens: what runs on it, and what stays on nnsight and why (printed, and in demo.json)
BACKEND_STEPS = {
    "transformer-lens": "calibration, 1 positive control, 2 detection, 3 k-sweep, 4 zero ablation, 5 single-head scan, "
                        "6 design space",
    "nnsight": "4 mean / resample ablation (the transformer-lens backend masks by zero ablation only), 8 transfer "
               "(TransformerLens 4.3 has no InternVL adapter, toy:b / toy:d's family), 9 VQA and 10 overlays (not "
               "routed through the backend seam yet)",
}


def _stored_plan(out: Path, request: dict[str, Any]) -> dict[str, Any] | None:
    """The plan of an earlier run of the same request into ``out`` (resumed with the same sizes), None when
    there is none; a plan for another request is refused (its step folders would refuse to resume anyway)."""
    path = out / PLAN_FILE
    if not path.exists():
        return None
    stored = json.loads(path.read_text(encoding="utf-8"))
    if stored.get("request") != json.loads(json.dumps(request)):
        differing = sorted(k for k in set(stored.get("request", {})) | set(request)
                           if stored.get("request", {}).get(k) != request.get(k))
        raise ValueError(f"{out} holds a demo planned for another request (differs in {', '.join(differing)}): "
                         "rerun with the same arguments to resume it, or use a new --out folder")
    return stored


def _save_plan(out: Path, request: dict[str, Any], sizes: Sizes, rates: Rates, replanned: bool) -> None:
    (out / PLAN_FILE).write_text(json.dumps({"request": request, "sizes": dataclasses.asdict(sizes),
                                             "rates": dataclasses.asdict(rates), "replanned": replanned}, indent=2))


def run_demo(*, model_spec: str | None = None, out: Path = Path("runs/demo"), detect_scenes: int | None = None,
             eval_scenes: int | None = None, device: str | None = None, dtype: str | None = None,
             transfer_model: str | None = "auto", as_json: bool = False, batch_size: int = 256,
             random_sets: int | None = None, curve_sets: int | None = None, check_items: int | None = None,
             vqa_scenes: int | None = None, control_scenes: int | None = None, overlay_items: int = 3,
             positive_control: bool = True, budget_seconds: float | None = DEFAULT_BUDGET_SECONDS,
             plan_only: bool = False, backend: str = "nnsight") -> int:
    """The whole demo into ``out`` (module doc: steps, sizes, rules). Sizes left None are planned from
    ``budget_seconds`` (None or 0: the full sizes); ``model_spec`` None: ``resolve_models``; ``plan_only``:
    calibrate, print the plan and stop (nothing is written). ``backend``: "nnsight" or "transformer-lens"
    (``BACKEND_STEPS``: the steps that run on it; the others on nnsight, said in the output). Returns the exit
    status."""
    started = time.perf_counter()
    model_spec, transfer_model, why = resolve_models(model_spec, transfer_model)
    print(f"main model {model_spec}: {why}", flush=True)
    from vrh_interp.experiments import positive_control as pc

    run_control = positive_control and pc.available()
    transfer_ready = bool(transfer_model) and _available(transfer_model)
    explicit = {name: value for name, value in (("detect_scenes", detect_scenes), ("eval_scenes", eval_scenes),
                                                ("check_items", check_items), ("vqa_scenes", vqa_scenes),
                                                ("control_scenes", control_scenes), ("random_sets", random_sets),
                                                ("curve_sets", curve_sets)) if value is not None}
    budget = float(budget_seconds) if budget_seconds and budget_seconds > 0 else None
    request = {"model": model_spec, "transfer_model": transfer_model if transfer_ready else None,
               "positive_control": run_control, "budget_seconds": budget, "explicit": explicit,
               "overlay_items": overlay_items}
    if backend != "nnsight":  # folders of nnsight demos keep their plans
        request["backend"] = backend
    stored = _stored_plan(out, request)
    if not plan_only:
        out.mkdir(parents=True, exist_ok=True)

    print(f"[0/{STEPS}] calibration: loading {model_spec}"
          + (", resuming the run folder's plan (no calibration)" if stored is not None else
             " and timing short calls on it" + (" and on toy:planted" if run_control else "")), flush=True)
    clock = time.perf_counter()
    vlm = _load(model_spec, device, dtype)
    load_seconds = time.perf_counter() - clock
    runner = get_backend(backend, vlm)
    if backend != "nnsight":
        where = f"backend {backend}: {BACKEND_STEPS[backend]}; on nnsight: {BACKEND_STEPS['nnsight']}"
        print(textwrap.fill(where, TERMINAL_WIDTH, initial_indent="      ", subsequent_indent="      "), flush=True)
    geometry = vlm.geometry
    fixed_sets = {"random_sets": explicit.get("random_sets", FULL_SIZES.random_sets),
                  "curve_sets": explicit.get("curve_sets", FULL_SIZES.curve_sets)}
    if fixed_sets["random_sets"] < 20:
        print(f"      {fixed_sets['random_sets']} random sets per control kind (--random-sets): the set-level rule's "
              f"empirical p cannot go below 1/{fixed_sets['random_sets'] + 1}")
    facts = plan_facts(geometry, fixed_sets["random_sets"], fixed_sets["curve_sets"], model=model_spec,
                       positive_control=run_control, transfer=transfer_ready, overlay_items=overlay_items,
                       shared_prefix=vlm.adapter.image_prefix_cache)
    if stored is None:
        rates, calibration = calibrate(vlm, batch_size=batch_size, positive_control=run_control, device=device,
                                       load_seconds=load_seconds, start_seconds=time.perf_counter() - started,
                                       backend=runner)
        calibration_seconds = time.perf_counter() - started
        left = None if budget is None else PLAN_MARGIN * budget - calibration_seconds
        sizes, fits = choose_sizes(left if left is None else max(left, 0.0), facts, rates, explicit)
        replanned = False
    else:
        rates, sizes, fits = Rates(**stored["rates"]), Sizes(**stored["sizes"]), True
        replanned, calibration = bool(stored.get("replanned")), {}
        calibration_seconds = time.perf_counter() - started
        print(f"      resuming {out}: the sizes and rates of its plan ({PLAN_FILE}); finished steps are read back")
    steps = plan_steps(sizes, facts, rates)
    print(format_plan(steps, sizes, facts, rates, budget=budget, calibration_seconds=calibration_seconds, fits=fits),
          flush=True)
    if plan_only:
        return 0
    if stored is None:
        _save_plan(out, request, sizes, rates, replanned)
    timer = StepClock(started, budget, calibration_seconds, steps)
    first_plan = {"sizes": dataclasses.asdict(sizes), "seconds": calibration_seconds + planned_seconds(steps),
                  "fits": fits}

    if run_control:
        timer.begin(1, "positive control: the same pipeline on toy:planted, whose retrieval heads are known")
        outcome = positive_control_step(out, device, batch_size, sizes.control_scenes, backend=backend)
    else:
        timer.begin(1, "positive control skipped" + (" (--no-positive-control)" if not positive_control else ""))
        if positive_control:
            positive_control_step(out, device, batch_size)  # prints why it is skipped
        outcome = None
    detect = synthetic_samples("detect", sizes.detect_scenes)
    evals = evaluation_items(sizes.eval_scenes)
    timer.begin(2, f"detecting heads of {model_spec} on {len(detect)} held-out scenes")
    stats, scores = _detect(vlm, detect, out / "detect", batch_size, backend=runner)
    scores.save(out / "scores-vrh.json")
    overlap = sorted({s.sample_id for s in detect} & {s.sample_id for s in evals})
    if overlap:
        raise ValueError(f"detection and evaluation items overlap (e.g. {overlap[:3]})")
    ks, k_star = demo_ks(geometry.total_heads)
    ranking = scores.ranking()
    random_sets, curve_sets = sizes.random_sets, sizes.curve_sets
    conditions = main_conditions(ranking, geometry, ks, k_star, random_sets, curve_sets)
    kind_conditions = [c for c in conditions if c.k in (0, k_star)]
    timer.begin(3, f"k-sweep on all {len(evals)} referents of {sizes.eval_scenes} disjoint scenes, ks={ks} "
                   f"(k*={k_star}): {random_sets} random and {random_sets} layer-matched sets at k*, {curve_sets} of "
                   f"each at the other k: {planned_answers(conditions, len(evals)):,} answers")
    result = run_conditions(vlm, evals, conditions, batch_size=batch_size, max_new_tokens=ANSWER_TOKENS,
                            run_dir=out / "sweep", backend=runner)
    summary = result.summary()
    summary.to_csv(out / "sweep_summary.csv", index=False)
    widths = interval_widths(summary, k_star)
    print(f"      95% interval half-widths at k* on {len(evals)} items: {widths}")
    timer.end()
    if stored is None and not replanned:  # the sizes not used yet, for the time actually left
        factor = timer.factor()
        left = None if budget is None else max(PLAN_MARGIN * budget - timer.elapsed(), 0.0)
        keep = {**explicit, "detect_scenes": sizes.detect_scenes, "eval_scenes": sizes.eval_scenes,
                "control_scenes": sizes.control_scenes}
        new_sizes, _ = choose_sizes(left, facts, rates.scaled(factor), keep, from_step=4)
        replanned = True
        if new_sizes != sizes:
            print(f"      re-planned for the {'time' if left is None else f'{left:.0f} s'} left at the measured rate "
                  f"({factor:.2f}x the calibration's): check items {sizes.check_items} -> {new_sizes.check_items}, "
                  f"VQA scenes {sizes.vqa_scenes} -> {new_sizes.vqa_scenes}")
        sizes = new_sizes
        _save_plan(out, request, sizes, rates, replanned)
        timer.replan(plan_steps(sizes, facts, rates))
    checks = check_subset(evals, sizes.check_items)
    check_items, vqa_scenes = len(checks), sizes.vqa_scenes

    timer.begin(4, f"ablation kinds at k*={k_star} on {len(checks)} fixed items: zero vs mean vs resample")
    from vrh_interp.evaluation.grounding import ablation_values

    values = ablation_values(vlm, detect, batch_size=batch_size)
    values.save(out / "ablation_values.pt")
    check_ids = [s.sample_id for s in checks]
    kind_summaries = {"zero": restrict(result, check_ids, lambda c: c.k == k_star).summary()}
    for kind in ("mean", "resample"):
        masked = [c if c.kind == "baseline" else dataclasses.replace(c, ablation=kind) for c in kind_conditions]
        kind_summaries[kind] = run_conditions(vlm, checks, masked, batch_size=batch_size, max_new_tokens=ANSWER_TOKENS,
                                              run_dir=out / f"ablation_{kind}", ablation_values=values).summary()
    kinds = ablation_kind_table(kind_summaries, k_star)
    kinds.to_csv(out / "ablation_kinds.csv", index=False)

    scanned = scan_heads(scores.ranking(), geometry, k_star)
    sampled = "" if len(scanned) == geometry.total_heads else \
        f" (a sample: the top {k_star} and {len(scanned) - k_star} drawn at random)"
    timer.begin(5, f"single-head causal scan: each of {len(scanned)} of the {geometry.total_heads} heads{sampled} "
                   f"masked alone on the "
                   f"{len(checks)} fixed items")
    from vrh_interp.experiments.head_scan import write_head_scan
    from vrh_interp.experiments.head_scan import head_scan

    scan = write_head_scan(head_scan(vlm, checks, scores, heads=scanned, batch_size=batch_size,
                                     max_new_tokens=ANSWER_TOKENS, run_dir=out / "scan", backend=runner), out)
    scan["total_heads"], scan["sampled"] = geometry.total_heads, sampled.strip(" ()")

    timer.begin(6, f"design space at k={k_star} on the {len(checks)} fixed items")
    seeds = range(random_sets)
    design = design_space(vlm, stats, checks, k=k_star, random_seeds=seeds, batch_size=batch_size,
                          max_new_tokens=ANSWER_TOKENS, run_dir=out, backend=runner)
    design.to_csv(out / "design_space.csv", index=False)
    timer.begin(7, "sparsity and stability")
    scores.sparsity().to_csv(out / "sparsity.csv", index=False)
    stab = stability(stats, k=k_star, sizes=(2, 5, 10, 20, 50, 100, 200))
    stab.to_csv(out / "stability.csv", index=False)
    token_choice_stability(stats, k=k_star).to_csv(out / "token_stability.csv", index=False)
    transfer = cross = None
    if transfer_ready:
        timer.begin(8, f"transfer to {transfer_model}: score maps, cross-masking at k*={k_star} on the {len(checks)} "
                       "fixed items")
        vlm_b = _load(transfer_model, device, dtype)
        if same_grid(geometry, vlm_b.geometry):
            _, scores_b = _detect(vlm_b, detect, out / "detect_b", batch_size)
            scores_b.save(out / "scores-vrh-b.json")
            transfer = compare_scores(scores, scores_b, ks=sorted({k_star, 2 * k_star, 3 * k_star}))
            transfer.to_csv(out / "transfer.csv", index=False)
            curves = cross_masking(vlm, vlm_b, scores, scores_b, checks, ks=[0, k_star], random_seeds=seeds,
                                   labels=(f"A ({model_spec})", f"B ({transfer_model})"), batch_size=batch_size,
                                   max_new_tokens=ANSWER_TOKENS, run_dir=out / "cross").summary()
            curves.to_csv(out / "cross_masking.csv", index=False)
            cross = masking_drops(curves, k_star)
            cross.to_csv(out / "transfer_masking.csv", index=False)
        else:
            print("      the two models do not share a head grid: transfer skipped")
        del vlm_b
    else:
        timer.begin(8, "transfer skipped (no second model)")
    timer.begin(9, f"cross-task VQA on the questions of {vqa_scenes} eval scenes (top-{k_star} vs random and "
                   "layer-matched sets)")
    vqa = cross_task_vqa(vlm, scores, k_star, vqa_scenes, out, batch_size, random_sets)
    vqa.to_csv(out / "vqa_summary.csv", index=False)
    table = verdicts(summary, k_star, scores, stab, design, transfer, cross, vqa, kinds, scan)
    table.to_csv(out / "verdicts.csv", index=False)
    shown_heads = scores.top(max(k_star, 3))
    timer.begin(10, f"attention overlays of the top {len(shown_heads)} heads on {overlay_items} evaluation images; "
                    "report")
    write_overlays(vlm, check_subset(evals, overlay_items), shown_heads, out)
    timer.table().to_csv(out / "timing.csv", index=False)  # step 10 measured up to the report
    paths = write_report(out)
    timer.end()
    elapsed = time.perf_counter() - started
    timing = timer.table()
    (out / "demo.json").write_text(json.dumps({
        "model": model_spec, "transfer_model": transfer_model if transfer_ready else None, "model_choice": why,
        "backend": backend, "backend_steps": dict(BACKEND_STEPS) if backend != "nnsight" else None,
        "seconds": elapsed, "budget_seconds": budget, "k_star": k_star, "ks": ks, "random_sets": random_sets,
        "curve_sets": curve_sets, "detect_scenes": len(detect), "evaluation_scenes": sizes.eval_scenes,
        "evaluation_items": len(evals), "check_items": check_items, "vqa_scenes": vqa_scenes,
        "control_scenes": sizes.control_scenes if outcome is not None else None,
        "interval_half_widths": widths, "rates": dataclasses.asdict(rates), "calibration": calibration,
        "plan": first_plan, "steps": timing.to_dict(orient="records"),
        "top_heads": scores.top(k_star).to_list(), "positive_control": outcome,
        "head_scan": scan, "verdicts": table.to_dict(orient="records")}, indent=2, default=str))
    if as_json:
        print(json.dumps({"verdicts": table.to_dict(orient="records"), "report": str(paths["html"]),
                          "positive_control": None if outcome is None else outcome["verdict"],
                          "seconds": round(elapsed, 1)}, default=str))
    else:
        with pd.option_context("display.width", TERMINAL_WIDTH, "display.precision", 3):
            print(f"\nSummary (k-sweep; every column and the per-set rows: {out / 'sweep_summary.csv'}):")
            shown = summary[summary["seed"].isna() | (summary["seed"].astype(str) == "all")]  # per-set rows: CSV
            print(shown[["condition", "k", "sets", "accuracy", "accuracy_ci_low", "accuracy_ci_high",
                         "p_vs_random", "p_vs_matched"]].to_string(index=False))
            if outcome is not None:
                from vrh_interp.experiments.positive_control import describe

                print("\n" + textwrap.fill("Positive control: " + describe(outcome), TERMINAL_WIDTH))
            print("\nThe paper's claims on this model:")
            print(claims_text(table))
            print("\nTime per step (seconds):")
            print(timing[["step", "name", "answers", "planned_s", "estimated_s", "seconds"]].to_string(index=False))
        budget_text = f" of a {budget:.0f} s budget" if budget else ""
        print(f"\nreport: {paths['html']}  ({elapsed:.0f} s{budget_text})")
    return 0
