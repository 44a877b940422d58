"""``vrh demo``: the paper's protocol end to end on a (toy) model, in a few minutes on CPU.

Detect on held-out synthetic scenes, k-sweep with seeded random controls on DISJOINT scenes, the
failure split, design-space ranking, sparsity, stability, transfer to a second model sharing the
backbone (score-map comparison and the cross-masking k-sweep of ``vrh_interp.transfer.cross_masking``),
cross-task VQA on the eval scenes' synthetic questions (``vrh_interp.datasets.synthetic_vqa``; judged only
on the question kinds the model answers above the majority-answer level) and a report folder. Every step writes its records into the run folder, so rerunning resumes.

k values (``demo_ks``). The paper masks 20 of 784-1152 heads (1.7-2.6 %). The demo's grid is derived from
the model's head count: 0.5 %, 1 %, 1.7 %, 2.6 %, 5 % and 10 % of all heads (``evaluation.sweep.parse_ks``:
rounded half up, at least 1 head) capped at a quarter of the heads, plus k*; claims are judged at k*, the
count inside the paper's 1.7-2.6 % nearest 2.15 % of the heads, or where no count falls inside (models under
~60 heads) round(2.15 %) but at least 1 head: k* = 1 on a 32-head toy.

Controls and verdict rules (fixed in advance, printed with the numbers). Every sweep masks ``random_sets``
(default 20) random head sets and, for the grounding and VQA sweeps, as many layer-matched sets per k. A
causal claim "holds" only when the drop vs the unmasked baseline is significant (McNemar) and the top-k is
more harmful than the sets of EACH control by the set-level rule (empirical p-value <= 0.05:
``evaluation.statistics.set_level_verdict``); no verdict uses an interval of pooled samples.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vrh_interp.evaluation.sweep import CONTROL_KINDS, parse_ks, summary_verdict, sweep
from vrh_interp.provenance import library_versions, model_provenance, now_utc
from vrh_interp.report import write_report
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
             transfer: pd.DataFrame | None, cross: pd.DataFrame | None, vqa: pd.DataFrame | None) -> pd.DataFrame:
    """The claims table. Causal claims use ``summary_verdict`` (set-level rule against both controls)."""
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
    return pd.DataFrame(rows)


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


def cross_task_vqa(vlm: Any, scores: Any, k_star: int, eval_scenes: int, out: Path, batch_size: int,
                   random_sets: int = 20) -> pd.DataFrame:
    """VQA sweep on the eval scenes' synthetic VQA items: unmasked, top-k* heads, ``random_sets`` random and as
    many layer-matched sets of k* heads."""
    from vrh_interp.datasets.synthetic_vqa import majority_answer_rate, synthetic_vqa
    from vrh_interp.datasets.vqa_sweep import vqa_sweep

    items = synthetic_vqa("eval", eval_scenes)
    result = vqa_sweep(vlm, items, scores.top(k_star), random_seeds=range(random_sets), batch_size=batch_size,
                       run_dir=out / "vqa")
    summary = result.summary()
    majority = {b: majority_answer_rate([s for s in items if s.benchmark == b]) for b in result.benchmarks}
    summary["majority_baseline"] = summary["benchmark"].map(majority)
    return summary


def _available(spec: str) -> bool:
    """False (with a message) for a shipped toy model whose checkpoint is not in this installation."""
    if not spec.startswith("toy:"):
        return True
    from vrh_interp.toy import checkpoint_dir

    if (checkpoint_dir(spec.split(":", 1)[1]) / "config.json").exists():
        return True
    print(f"[5/7] transfer skipped: {spec} has no shipped checkpoint in this installation")
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


def run_demo(*, model_spec: str = "toy:a", out: Path = Path("runs/demo"), detect_scenes: int = 200,
             eval_scenes: int = 100, device: str | None = None, dtype: str | None = None,
             transfer_model: str | None = "toy:b", as_json: bool = False, batch_size: int = 50,
             random_sets: int = 20) -> int:
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    vlm = _load(model_spec, device, dtype)
    detect = synthetic_samples("detect", detect_scenes)
    evals = synthetic_samples("eval", eval_scenes)
    print(f"[1/7] detecting heads of {model_spec} on {len(detect)} held-out scenes")
    stats, scores = _detect(vlm, detect, out / "detect", batch_size)
    scores.save(out / "scores-vrh.json")
    ks, k_star = demo_ks(vlm.geometry.total_heads)
    seeds = range(random_sets)
    print(f"[2/7] k-sweep on {len(evals)} disjoint scenes, ks={ks} (k*={k_star}), {random_sets} random and "
          f"{random_sets} layer-matched head sets per k")
    result = sweep(vlm, evals, scores, ks=ks, random_seeds=seeds, batch_size=batch_size,
                   max_new_tokens=ANSWER_TOKENS, run_dir=out / "sweep")
    summary = result.summary()
    summary.to_csv(out / "sweep_summary.csv", index=False)
    print(f"[3/7] design space at k={k_star}")
    design = design_space(vlm, stats, evals, k=k_star, random_seeds=seeds, batch_size=batch_size,
                          max_new_tokens=ANSWER_TOKENS, run_dir=out)
    design.to_csv(out / "design_space.csv", index=False)
    print("[4/7] sparsity and stability")
    scores.sparsity().to_csv(out / "sparsity.csv", index=False)
    stab = stability(stats, k=k_star, sizes=(2, 5, 10, 20, 50, 100, 200))
    stab.to_csv(out / "stability.csv", index=False)
    token_choice_stability(stats, k=k_star).to_csv(out / "token_stability.csv", index=False)
    transfer = cross = None
    if transfer_model and _available(transfer_model):
        print(f"[5/7] transfer to {transfer_model}")
        vlm_b = _load(transfer_model, device, dtype)
        if same_grid(vlm.geometry, vlm_b.geometry):
            _, scores_b = _detect(vlm_b, detect, out / "detect_b", batch_size)
            scores_b.save(out / "scores-vrh-b.json")
            transfer = compare_scores(scores, scores_b, ks=sorted({k_star, 2 * k_star, 3 * k_star}))
            transfer.to_csv(out / "transfer.csv", index=False)
            curves = cross_masking(vlm, vlm_b, scores, scores_b, evals, ks=ks, random_seeds=seeds,
                                   labels=(f"A ({model_spec})", f"B ({transfer_model})"), batch_size=batch_size,
                                   max_new_tokens=ANSWER_TOKENS, run_dir=out / "cross").summary()
            curves.to_csv(out / "cross_masking.csv", index=False)
            cross = masking_drops(curves, k_star)
            cross.to_csv(out / "transfer_masking.csv", index=False)
        else:
            print("      the two models do not share a head grid: transfer skipped")
    print(f"[6/7] cross-task VQA on the eval scenes' questions (top-{k_star} vs random and layer-matched sets)")
    vqa = cross_task_vqa(vlm, scores, k_star, eval_scenes, out, batch_size, random_sets)
    vqa.to_csv(out / "vqa_summary.csv", index=False)
    table = verdicts(summary, k_star, scores, stab, design, transfer, cross, vqa)
    table.to_csv(out / "verdicts.csv", index=False)
    print("[7/7] report")
    paths = write_report(out)
    elapsed = time.perf_counter() - started
    (out / "demo.json").write_text(json.dumps({"model": model_spec, "seconds": elapsed, "k_star": k_star, "ks": ks,
                                               "random_sets": random_sets,
                                               "top_heads": scores.top(k_star).to_list(),
                                               "verdicts": table.to_dict(orient="records")}, indent=2))
    if as_json:
        print(json.dumps({"verdicts": table.to_dict(orient="records"), "report": str(paths["html"])}))
    else:
        with pd.option_context("display.width", 200, "display.max_colwidth", 120):
            print("\nSummary (k-sweep):")
            shown = summary[summary["seed"].isna() | (summary["seed"].astype(str) == "all")]  # per-set rows: CSV
            print(shown[["condition", "k", "k_fraction", "seed", "sets", "accuracy", "accuracy_ci_low",
                         "accuracy_ci_high", "accuracy_q05", "accuracy_q95", "parse_failure_rate",
                         "other_object_rate", "no_object_rate", "p_value_vs_baseline", "p_vs_random",
                         "p_vs_matched"]].to_string(index=False))
            print("\nThe paper's claims on this model:")
            print(table.to_string(index=False))
        print(f"\nreport: {paths['html']}  ({elapsed:.0f} s)")
    return 0
