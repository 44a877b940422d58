"""``vrh demo``: the paper's protocol end to end on a (toy) model, on CPU, next to a positive control.

Steps (each writes its records into the run folder, so rerunning resumes):

1. positive control: the same detection and causal sweep on ``toy:planted``, whose retrieval heads are known
   (``vrh_interp.positive_control``; skipped, saying why, where the checkpoint is not shipped), so a negative
   verdict below sits next to a pipeline that demonstrably finds planted heads;
2. detection on ``detect_scenes`` held-out scenes (one referent per scene), scores of the paper's design;
3. the causal k-sweep on ALL referents of ``eval_scenes`` evaluation scenes (152 scenes: >= 500 items, disjoint
   from detection; the printed interval widths say what that buys);
4. the causal verdict at k* again with mean and resample ablation (reference outputs from the detection
   samples), compared with zero ablation on the same items;
5. the single-head causal scan (every head masked alone) and the rank correlation of score and damage;
6. design space, 7. sparsity and stability, 8. transfer to a second model sharing the backbone (score maps and
   cross-masking), 9. cross-task VQA on the eval scenes' synthetic questions (judged only on the question kinds
   the model answers above the majority-answer level), 10. attention overlays of the top heads and the report.

k values (``demo_ks``). The paper masks 20 of 784-1152 heads (1.7-2.6 %). The demo's grid is derived from
the model's head count: 0.5 %, 1 %, 1.7 %, 2.6 %, 5 % and 10 % of all heads (``evaluation.sweep.parse_ks``:
rounded half up, at least 1 head) capped at a quarter of the heads, plus k*; claims are judged at k*, the
count inside the paper's 1.7-2.6 % nearest 2.15 % of the heads, or where no count falls inside (models under
~60 heads) round(2.15 %) but at least 1 head: k* = 1 on a 32-head toy.

Sizes. About 24,600 greedy answers on toy A (a condition is answered on every item; ~45 ms of CPU time per
answer, mean / resample ablation ~1.5x the wall time of zero ablation): measured 41 min while a training run
and the test suite shared the 2 cores (1,660 CPU-seconds), estimated 12-15 min on a quiet 2-core machine;
``--check-items 30 --vqa-scenes 15`` brings that near 10 min at the cost of thinner checks. The >= 500-item
k-sweep alone is 14,000 answers. Verdicts are only judged where the full control is measured:

* main k-sweep, >= 500 items: at k*, ``random_sets`` (20) random and 20 layer-matched sets (the causal
  verdict); at the grid's other k, ``curve_sets`` (2) sets of each kind, enough to show where the controls
  lie on the curve, not to judge (no verdict reads them). The control sets are the same draws as with 20 sets
  per k (seeds 0 and 1 of them). The full 20 + 20 sets at every k would cost 94 distinct head sets x 502
  items = 47,000 answers on the 32-head toy, twice the whole demo (24,600);
* ``check_items`` (50) fixed items (every n-th of the evaluation items, spread over the scenes) for the
  checks that multiply the cost: mean/resample ablation at k* (20 + 20 sets each, compared with zero
  ablation restricted to the same items), the single-head scan, the design space and cross-masking at k*;
* VQA on the questions of the first ``vqa_scenes`` (25) evaluation scenes, at k* with 20 + 20 sets.

Controls and verdict rules (fixed in advance, printed with the numbers). A causal claim "holds" only when
the drop vs the unmasked baseline is significant (McNemar) and the top-k is more harmful than the sets of
EACH control by the set-level rule (empirical p-value <= 0.05: ``evaluation.statistics.set_level_verdict``);
no verdict uses an interval of pooled samples. "Score predicts causal importance" holds when the Spearman
correlation of head score and single-head accuracy drop is positive with a one-sided permutation p < 0.05
(``transfer.spearman_permutation_p``, 10,000 shuffles). "Ablation kinds agree" holds when the causal verdict
at k* is the same under zero, mean and resample ablation.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from vrh_interp.evaluation.sweep import (CONTROL_KINDS, Condition, SweepResult, head_signature, parse_ks,
                                         run_conditions, summary_verdict, sweep_conditions)
from vrh_interp.provenance import library_versions, model_provenance, now_utc
from vrh_interp.report import read_grading, write_report
from vrh_interp.scoring.analysis import design_space, stability, token_choice_stability
from vrh_interp.scoring.detect import collect_detection_stats, scores_from_stats
from vrh_interp.sources import synthetic_samples
from vrh_interp.transfer import compare_scores, cross_masking, masking_drops, same_grid

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
    ``kinds`` is ``ablation_kind_table``, ``scan`` the facts of ``cli.write_head_scan`` (module doc: rules)."""
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
    rows.append({"claim": "sparse: a few heads carry the score", "verdict": "holds" if share >= 0.3 else "does not hold",
                 "numbers": f"top 10% of heads ({tenth}) carry {share:.1%} of the total score (rule: >= 30%, 3x uniform)"})
    ranked = design.dropna(subset=["drop"]).reset_index(drop=True)
    default_label = "Q=output, Phi=sum, Omega=mean"
    position = int(ranked.index[ranked["variant"] == default_label][0]) + 1 if (ranked["variant"] == default_label).any() else None
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
                            f"parse failure {base['parse_failure_rate']:.3f} -> {top['parse_failure_rate']:.3f}{split}"})
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
            "numbers": f"Spearman {rho:.3f} over {scan['heads']} heads (one-sided permutation p={p:.3g}; rule: > 0 "
                       f"with p < 0.05), n={scan['n']} items, baseline {scan['baseline_accuracy']:.3f}; the top-scored "
                       f"head {scan['top_head']} ranks {scan['top_head_damage_rank']} of {scan['heads']} by damage"}


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
    from vrh_interp.datasets.synthetic_vqa import majority_answer_rate, synthetic_vqa
    from vrh_interp.datasets.vqa_sweep import vqa_sweep

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
    """``count`` items spread evenly over ``items`` (every n-th, n = len / count): fixed, covers all scenes."""
    if count >= len(items):
        return list(items)
    return [items[math.floor(i * len(items) / count)] for i in range(count)]


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


def write_overlays(vlm: Any, samples: Sequence[Any], heads: Any, out: Path) -> list[Path]:
    """Attention overlays (all heads, the top heads, all but the top heads) on ``samples``: one PNG per sample
    with the three panels side by side (``overlays.prediction_overlays``), under ``out/overlays``."""
    from vrh_interp.overlays import prediction_overlays
    from vrh_interp.plots import overlay_panels

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
    if not spec.startswith("toy:"):
        return True
    from vrh_interp.toy import checkpoint_dir

    if (checkpoint_dir(spec.split(":", 1)[1]) / "config.json").exists():
        return True
    print(f"      transfer skipped: {spec} has no shipped checkpoint in this installation")
    return False


def _load(spec: str, device: str | None, dtype: str | None) -> Any:
    from vrh_interp.cli import _load_model

    return _load_model(spec, device, dtype)


def _detect(vlm: Any, samples: list[Any], out: Path, batch_size: int) -> tuple[list[Any], Any]:
    stats = collect_detection_stats(vlm, samples, batch_size=batch_size, max_new_tokens=ANSWER_TOKENS,
                                    run_dir=out, dataset=f"synthetic:detect:{len(samples)}")
    provenance = {"model": model_provenance(vlm), "dataset": f"synthetic:detect:{len(samples)}",
                  "libraries": library_versions(), "created": now_utc(),
                  "sample_ids": [s.sample_id for s in samples]}
    return stats, scores_from_stats(stats, "vrh", provenance)


def positive_control_step(out: Path, device: str | None, batch_size: int) -> dict[str, Any] | None:
    """Step 1: the positive control on ``toy:planted`` into ``out/positive_control`` (None, with the reason
    printed, where its checkpoint is not shipped)."""
    from vrh_interp import positive_control as pc

    if not pc.available():
        print(f"      positive control skipped: the {pc.SPEC} checkpoint is not shipped in this installation "
              "(vrh_interp/toy/checkpoints/planted); the verdicts below then have no known-positive reference")
        return None
    outcome = pc.run_positive_control(out / "positive_control", device=device, batch_size=batch_size)
    print("      " + pc.describe(outcome))
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        print(read_grading(out / "positive_control" / "grading.csv").to_string(index=False))
    return outcome


STEPS = 10


def run_demo(*, model_spec: str = "toy:a", out: Path = Path("runs/demo"), detect_scenes: int = 200,
             eval_scenes: int = 152, device: str | None = None, dtype: str | None = None,
             transfer_model: str | None = "toy:b", as_json: bool = False, batch_size: int = 256,
             random_sets: int = 20, curve_sets: int = 2, check_items: int = 50, vqa_scenes: int = 25,
             overlay_items: int = 3, positive_control: bool = True) -> int:
    """The whole demo into ``out`` (module doc: steps, sizes, rules). Returns the exit status."""
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)

    def step(number: int, text: str) -> None:
        print(f"[{number}/{STEPS}] {text}  ({time.perf_counter() - started:.0f} s so far)", flush=True)

    if positive_control:
        step(1, "positive control: the same pipeline on toy:planted, whose retrieval heads are known")
        outcome = positive_control_step(out, device, batch_size)
    else:
        step(1, "positive control skipped (--no-positive-control)")
        outcome = None
    vlm = _load(model_spec, device, dtype)
    detect = synthetic_samples("detect", detect_scenes)
    evals = evaluation_items(eval_scenes)
    checks = check_subset(evals, check_items)
    step(2, f"detecting heads of {model_spec} on {len(detect)} held-out scenes")
    stats, scores = _detect(vlm, detect, out / "detect", batch_size)
    scores.save(out / "scores-vrh.json")
    overlap = sorted({s.sample_id for s in detect} & {s.sample_id for s in evals})
    if overlap:
        raise ValueError(f"detection and evaluation items overlap (e.g. {overlap[:3]})")
    ks, k_star = demo_ks(vlm.geometry.total_heads)
    ranking = scores.ranking()
    conditions = main_conditions(ranking, vlm.geometry, ks, k_star, random_sets, curve_sets)
    kind_conditions = [c for c in conditions if c.k in (0, k_star)]
    main_answers = planned_answers(conditions, len(evals))
    # then two ablation kinds and the scan, and roughly: design space and cross-masking (a random set per seed
    # plus a few variants, in each model) and VQA (~2.7 questions per scene, 2 + 2 x random_sets sets)
    later = (2 * planned_answers(kind_conditions, len(checks)) + (vlm.geometry.total_heads + 1) * len(checks)
             + (random_sets + 8) * len(checks) * (3 if transfer_model else 1)
             + round(2.7 * vqa_scenes) * (2 + 2 * random_sets))
    print(f"      about {main_answers + later:,} greedy answers planned ({main_answers:,} in the k-sweep)")
    step(3, f"k-sweep on all {len(evals)} referents of {eval_scenes} disjoint scenes, ks={ks} (k*={k_star}): "
            f"{random_sets} random and {random_sets} layer-matched sets at k*, {curve_sets} of each at the other k")
    sweep_started = time.perf_counter()
    result = run_conditions(vlm, evals, conditions, batch_size=batch_size, max_new_tokens=ANSWER_TOKENS,
                            run_dir=out / "sweep")
    per_answer = (time.perf_counter() - sweep_started) / main_answers
    if per_answer > 0.002:  # a resumed sweep took no time: no estimate
        print(f"      {1000 * per_answer:.0f} ms per answer: the remaining ~{later:,} answers take ~"
              f"{later * per_answer / 60:.0f} min (longer while other processes share the CPU)")
    summary = result.summary()
    summary.to_csv(out / "sweep_summary.csv", index=False)
    print(f"      95% interval half-widths at k* on {len(evals)} items: {interval_widths(summary, k_star)}")

    step(4, f"ablation kinds at k*={k_star} on {len(checks)} fixed items: zero vs mean vs resample")
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

    step(5, f"single-head causal scan: each of the {vlm.geometry.total_heads} heads masked alone on the "
            f"{len(checks)} fixed items")
    from vrh_interp.cli import write_head_scan
    from vrh_interp.evaluation.head_scan import head_scan

    scan = write_head_scan(head_scan(vlm, checks, scores, batch_size=batch_size, max_new_tokens=ANSWER_TOKENS,
                                     run_dir=out / "scan"), out)

    step(6, f"design space at k={k_star} on the {len(checks)} fixed items")
    seeds = range(random_sets)
    design = design_space(vlm, stats, checks, k=k_star, random_seeds=seeds, batch_size=batch_size,
                          max_new_tokens=ANSWER_TOKENS, run_dir=out)
    design.to_csv(out / "design_space.csv", index=False)
    step(7, "sparsity and stability")
    scores.sparsity().to_csv(out / "sparsity.csv", index=False)
    stab = stability(stats, k=k_star, sizes=(2, 5, 10, 20, 50, 100, 200))
    stab.to_csv(out / "stability.csv", index=False)
    token_choice_stability(stats, k=k_star).to_csv(out / "token_stability.csv", index=False)
    transfer = cross = None
    if transfer_model and _available(transfer_model):
        step(8, f"transfer to {transfer_model}: score maps, cross-masking at k*={k_star} on the {len(checks)} "
                "fixed items")
        vlm_b = _load(transfer_model, device, dtype)
        if same_grid(vlm.geometry, vlm_b.geometry):
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
    else:
        step(8, "transfer skipped (no second model)")
    step(9, f"cross-task VQA on the questions of {vqa_scenes} eval scenes (top-{k_star} vs random and layer-matched "
            "sets)")
    vqa = cross_task_vqa(vlm, scores, k_star, vqa_scenes, out, batch_size, random_sets)
    vqa.to_csv(out / "vqa_summary.csv", index=False)
    table = verdicts(summary, k_star, scores, stab, design, transfer, cross, vqa, kinds, scan)
    table.to_csv(out / "verdicts.csv", index=False)
    shown_heads = scores.top(max(k_star, 3))
    step(10, f"attention overlays of the top {len(shown_heads)} heads on {overlay_items} evaluation images; report")
    write_overlays(vlm, check_subset(evals, overlay_items), shown_heads, out)
    paths = write_report(out)
    elapsed = time.perf_counter() - started
    (out / "demo.json").write_text(json.dumps({
        "model": model_spec, "seconds": elapsed, "k_star": k_star, "ks": ks, "random_sets": random_sets,
        "curve_sets": curve_sets, "evaluation_items": len(evals), "check_items": len(checks),
        "vqa_scenes": vqa_scenes, "top_heads": scores.top(k_star).to_list(), "positive_control": outcome,
        "head_scan": scan, "verdicts": table.to_dict(orient="records")}, indent=2, default=str))
    if as_json:
        print(json.dumps({"verdicts": table.to_dict(orient="records"), "report": str(paths["html"]),
                          "positive_control": None if outcome is None else outcome["verdict"]}, default=str))
    else:
        with pd.option_context("display.width", 200, "display.max_colwidth", 160):
            print("\nSummary (k-sweep):")
            shown = summary[summary["seed"].isna() | (summary["seed"].astype(str) == "all")]  # per-set rows: CSV
            print(shown[["condition", "k", "k_fraction", "seed", "sets", "accuracy", "accuracy_ci_low",
                         "accuracy_ci_high", "accuracy_q05", "accuracy_q95", "parse_failure_rate",
                         "other_object_rate", "no_object_rate", "p_value_vs_baseline", "p_vs_random",
                         "p_vs_matched"]].to_string(index=False))
            if outcome is not None:
                from vrh_interp.positive_control import describe

                print("\nPositive control: " + describe(outcome))
            print("\nThe paper's claims on this model:")
            print(table.to_string(index=False))
        print(f"\nreport: {paths['html']}  ({elapsed:.0f} s)")
    return 0
