"""The pipeline on a model whose retrieval heads are known: ``toy:planted`` (see ``vrh_interp.toy.planted``).

A negative verdict on a model ("masking the top-k heads hurts no more than random heads") means something only
next to a pipeline that demonstrably finds retrieval heads where they exist. ``run_positive_control`` runs the
SAME detection and causal sweep the demo runs on any other model, on the planted organism, and grades them
against its declared heads:

* detection: every scoring design (the paper's design space and the published presets) from one detection
  pass, graded by precision/recall at |P| and by where the decoys rank (``vrh_interp.scoring.grading``);
* causal: masking the default scorer's top-|P| vs many random sets and layer-matched sets of |P| heads drawn
  outside the detected set, and vs masking the decoys;
* transfer (``TRANSFER_PARTNERS``, where shipped): the demo's cross-masking test between toy:planted and
  toy:planted-b (the same planted backbone behind an InternVL-class vision stack, trained so the planted heads
  keep their job: transfer must hold) and toy:planted-x (toy:planted-b with every head relabelled, the same
  function with no head index in common: transfer must never read "holds").

Nothing is tuned here: the organism was built with its heads declared before training, and the scorer and
sweep are the library's defaults.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from vrh_interp.core.execution.backends.select import backend_for
from vrh_interp.experiments.designs import RANK_H, clustered_sweep
from vrh_interp.experiments.conditions import Condition
from vrh_interp.core.description.heads import HeadSet
from vrh_interp.core.description.model import LOCAL, Placement
from vrh_interp.core.bookkeeping.provenance import library_versions, model_provenance, now_utc
from vrh_interp.scoring.detect import collect_detection_stats, scores_from_stats
from vrh_interp.scoring.grading import grade_detection
from vrh_interp.data.sources import synthetic_samples

if TYPE_CHECKING:
    from vrh_interp.experiments.demo_plan import DemoRun

SPEC = "toy:planted"
ANSWER_TOKENS = 24
# (partner, does it share toy:planted's backbone with the same head indices?): the transfer test's positive and
# negative control
TRANSFER_PARTNERS = (("toy:planted-b", True), ("toy:planted-x", False))


def available() -> bool:
    from vrh_interp.toy import is_shipped

    return is_shipped("planted")


def declared() -> tuple[HeadSet, HeadSet]:
    """The planted and decoy heads declared in the shipped checkpoint's ``planted.json``."""
    from vrh_interp.toy import checkpoint_dir
    from vrh_interp.toy.planted import declared_heads

    return declared_heads(checkpoint_dir("planted"))


def load_planted(device: str | None = None, name: str = "planted") -> Any:
    from vrh_interp.core.description.model import wrap
    from vrh_interp.toy import load

    from vrh_interp.core.description.model_source import loading_output

    with loading_output(True, bars=False):  # a toy loads in a second: transformers' "Loading weights" bar is noise
        model, processor = load(name, device=device or "cpu")
    return wrap(model, processor, model_id=f"vrh-interp/toy-{name}", remote_id=f"vrh-interp/toy-{name}")


def shipped_partners() -> list[tuple[str, bool]]:
    """The ``TRANSFER_PARTNERS`` whose checkpoints are in this installation."""
    from vrh_interp.toy import is_shipped

    return [(spec, shared) for spec, shared in TRANSFER_PARTNERS if is_shipped(spec.split(":", 1)[1])]


def transfer_control(out: Path, vlm: Any, scores: Any, detect: list, evals: list, k: int, random_sets: int, *,
                     batch_size: int, device: str | None, progress: bool,
                     seed: int = 0) -> list[dict[str, Any]]:
    """The demo's transfer test (``experiments.transfer.cross_masking`` at k = |P|, ``verdicts.transfer_evidence``,
    the ``shared`` claim's rule) between toy:planted and each shipped partner; one row per partner."""
    from vrh_interp.evaluation.claims import CLAIMS, decide
    from vrh_interp.experiments.transfer import cross_masking
    from vrh_interp.experiments.verdicts import transfer_evidence

    rows = []
    for spec, shared in shipped_partners():
        name = spec.split(":", 1)[1]
        partner = load_planted(device, name).on(vlm.placement)  # where the planted model runs
        stats = collect_detection_stats(partner, detect, batch_size=batch_size, max_new_tokens=ANSWER_TOKENS,
                                        run_dir=out / f"detect_{name}", dataset=f"synthetic:detect:{len(detect)}",
                                        progress=progress)
        partner_scores = scores_from_stats(stats, "vrh", {"model": model_provenance(partner),
                                                          "sample_ids": [s.sample_id for s in detect]})
        crossed = cross_masking(vlm, partner, scores, partner_scores, evals, ks=[0, k],
                                random_seeds=list(range(random_sets)), labels=(SPEC, spec), batch_size=batch_size,
                                max_new_tokens=ANSWER_TOKENS, run_dir=out / f"cross_{name}", progress=progress)
        evidence = transfer_evidence(crossed.results, k, seed=seed)
        verdict, reason = ("inconclusive", "no random sets in a direction") if evidence is None else decide(
            CLAIMS["shared"], evidence)
        low, high = evidence.interval() if evidence is not None else (float("nan"), float("nan"))
        rows.append({"partner": spec, "shares_backbone": shared, "expected": "holds" if shared else "never holds",
                     "verdict": verdict, "as_expected": verdict == "holds" if shared else verdict != "holds",
                     "partner_top": partner_scores.top(k).to_list(), "reason": reason,
                     "effect": float("nan") if evidence is None else evidence.estimate, "ci_low": low, "ci_high": high,
                     "numbers": "" if evidence is None else evidence.numbers})
    return rows


def transfer_line(row: dict[str, Any]) -> str:
    relation = "shares the planted backbone" if row["shares_backbone"] else "no head index shared (relabelled heads)"
    effect = "" if row["effect"] != row["effect"] else (
        f"effect {row['effect']:+.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]; ")
    return (f"transfer {SPEC} <-> {row['partner']} ({relation}; expected: {row['expected']}): "
            f"{row['verdict'].upper()} ({effect}{row['reason']})")


def transfer_verdict(rows: list[dict[str, Any]]) -> str:
    """The ``transfer_control`` claim: holds when the shared pair holds and the relabelled one does not; does not
    hold when either says the opposite of its construction; otherwise (or with a partner missing) inconclusive."""
    by_kind = {row["shares_backbone"]: row["verdict"] for row in rows}
    if len(by_kind) < 2:
        return "inconclusive"
    if by_kind[False] == "holds" or by_kind[True] == "does not hold":
        return "does not hold"
    return "holds" if by_kind[True] == "holds" else "inconclusive"


def run_positive_control(out: Path, *, detect_scenes: int = 20, eval_scenes: int = 30, random_sets: int = 20,
                         batch_size: int = 60, device: str | None = None, progress: bool = True,
                         transfer: bool = True, placement: Placement = LOCAL, rank_sets: int = 199,
                         rank_items: int = 12) -> dict[str, Any]:
    """Detect, grade and sweep on ``toy:planted``, then (``transfer``) the transfer test against each shipped
    partner; writes ``out/{grading.csv, sweep_summary.csv, transfer_control.csv, positive_control.json}``
    (resumable through ``out/detect``, ``out/sweep`` and each partner's folders) and returns the summary.
    ``placement``: where both run (``core.description.model.Placement``: backend and remote; ``VLM.on``)."""
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    vlm = load_planted(device).on(placement)
    backend_for(vlm)  # built before any work: an unsupported family is refused here
    planted, decoys = declared()
    detect = synthetic_samples("detect", detect_scenes)
    evals = synthetic_samples("eval", eval_scenes)
    stats = collect_detection_stats(vlm, detect, batch_size=batch_size, max_new_tokens=ANSWER_TOKENS,
                                    run_dir=out / "detect", dataset=f"synthetic:detect:{detect_scenes}",
                                    progress=progress)
    grading = grade_detection(stats, planted, decoys)
    grading.to_csv(out / "grading.csv", index=False)
    scores = scores_from_stats(stats, "vrh", {"model": model_provenance(vlm), "libraries": library_versions(),
                                              "created": now_utc(), "sample_ids": [s.sample_id for s in detect]})
    scores.save(out / "scores-planted.json")
    k = len(planted)
    ranking = scores.ranking()
    # the demo's design (``experiments.designs``): one fresh set of each kind per scene, the rank test curtailed
    result, ranks = clustered_sweep(vlm, ranking, [0, k], evals, out, extra=[Condition("decoys", len(decoys), None,
                                                                                      decoys)],
                                    rank_sets=rank_sets, rank_items=rank_items, batch_size=batch_size,
                                    max_new_tokens=ANSWER_TOKENS, progress=progress)
    rank = ranks[k]
    summary = result.summary()
    summary.to_csv(out / "sweep_summary.csv", index=False)
    default = grading[grading["design"] == "Q=output, Phi=sum, Omega=mean"].iloc[0]
    outcome = _outcome(summary, k, default, planted, decoys, result, rank)
    outcome["transfer"] = transfer_control(out, vlm, scores, detect, evals, k, random_sets, batch_size=batch_size,
                                           device=device, progress=progress) if transfer else []
    if outcome["transfer"]:
        pd.DataFrame(outcome["transfer"]).to_csv(out / "transfer_control.csv", index=False)
    outcome.update(seconds=time.perf_counter() - started, detect_scenes=detect_scenes, eval_scenes=eval_scenes)
    (out / "positive_control.json").write_text(json.dumps(outcome, indent=2))
    return outcome


def _outcome(summary: pd.DataFrame, k: int, default: pd.Series, planted: HeadSet, decoys: HeadSet,
             result: Any, rank: Any) -> dict[str, Any]:
    """Recovered = the default scorer's top-|P| is exactly P; causal = the claims module's causal rule on the
    sweep's records and the rank sets (``experiments.verdicts.causal_evidence`` against the random and
    layer-matched sets, ``evaluation.claims.decide``)."""
    from vrh_interp.evaluation.claims import CLAIMS, decide
    from vrh_interp.evaluation.inference import sequential_rank_p
    from vrh_interp.experiments.verdicts import causal_evidence, rank_data

    evidence = causal_evidence(result.records, result.conditions, k, kinds=("random", "matched"), rank=rank)
    ranks = {kind: rank_data(rank, k, kind, "zero", "top", 0.5) for kind in ("random", "matched")}
    verdict, reason = decide(CLAIMS["causal"], evidence)
    top = summary[(summary["condition"] == "top") & (summary["k"] == k)].iloc[0]
    controls = {kind: rows.iloc[0] for kind in ("random", "matched")
                for rows in [summary[(summary["condition"] == kind) & (summary["k"] == k)
                                     & (summary["seed"].astype(str) == "all")]] if len(rows)}
    baseline = float(summary[summary["condition"] == "baseline"]["accuracy"].iloc[0])
    decoy_row = summary[summary["condition"] == "decoys"]
    recovered = bool(default["exact"])
    causal = verdict == "holds"
    return {
        "model": SPEC, "planted": planted.to_list(), "decoys": decoys.to_list(),
        "detected_top": list(default["top"]), "recovered": recovered,
        "precision_at_p": float(default["precision_at_p"]), "decoy_ranks": list(default["decoy_ranks"]),
        "n": int(top["n"]), "baseline_accuracy": baseline, "top_accuracy": float(top["accuracy"]),
        "top_p_value_vs_baseline": float(top["p_value_vs_baseline"]),
        "controls": {kind: {"sets": int(row["sets"]), "mean": float(row["accuracy"]),
                            "rank_sets": 0 if ranks[kind] is None else len(ranks[kind][1]),
                            "rank_items": 0 if rank is None else int(rank.records["sample_id"].nunique()),
                            "p_value": 1.0 if ranks[kind] is None else sequential_rank_p(*ranks[kind], h=RANK_H)[0]}
                     for kind, row in controls.items()},
        "decoys_accuracy": float(decoy_row["accuracy"].iloc[0]) if not decoy_row.empty else float("nan"),
        "causal_verdict": verdict, "causal_reason": reason, "causal_effect": evidence.estimate,
        "verdict": "the pipeline recovers the planted heads" if recovered and causal
        else "the pipeline does NOT recover the planted heads",
    }


def describe(outcome: dict[str, Any]) -> str:
    """One paragraph for the terminal and the report."""
    controls = "; ".join(f"{kind} sets of {len(outcome['planted'])} heads, one per scene ({row['sets']}): "
                         f"{row['mean']:.3f}; rank p = {row['p_value']:.3g} over {row['rank_sets']} sets on "
                         f"{row['rank_items']} items" for kind, row in outcome["controls"].items())
    return (f"positive control ({outcome['model']}, planted {', '.join(outcome['planted'])}): {outcome['verdict']}. "
            f"The default scorer's top-{len(outcome['planted'])} is {', '.join(outcome['detected_top'])} "
            f"(precision {outcome['precision_at_p']:.2f}); masking it: {outcome['baseline_accuracy']:.3f} -> "
            f"{outcome['top_accuracy']:.3f} on {outcome['n']} items (McNemar p = "
            f"{outcome['top_p_value_vs_baseline']:.2g}); "
            f"{controls}; causal claim: {outcome['causal_verdict']} ({outcome.get('causal_reason', '')}). Masking "
            "the decoys "
            f"{', '.join(outcome['decoys'])}: {outcome['decoys_accuracy']:.3f}."
            + "".join(f" {transfer_line(row)}." for row in outcome.get("transfer", [])))


def short_line(outcome: dict[str, Any]) -> str:
    """One line for the terminal: recovered or not, the causal verdict, each planted pair's transfer verdict."""
    pairs = ", ".join(f"{row['partner']} {row['verdict']} (expected {row['expected']})"
                      for row in outcome.get("transfer", []))
    return (f"positive control: top-{len(outcome['planted'])} "
            + ("= the planted heads" if outcome["recovered"] else "!= the planted heads")
            + f", masking them {outcome['baseline_accuracy']:.2f} -> {outcome['top_accuracy']:.2f}, causal claim "
            f"{outcome['causal_verdict']}" + (f"; transfer {pairs}" if pairs else ""))


def grading_table(grading: pd.DataFrame) -> pd.DataFrame:
    """The grading as a compact table (one row per design)."""
    keep = grading[grading["defined"]].copy()
    keep["planted_ranks"] = keep["planted_ranks"].map(lambda r: ", ".join(str(v) for v in r))
    keep["decoy_ranks"] = keep["decoy_ranks"].map(lambda r: ", ".join(str(v) for v in r))
    return keep[["design", "precision_at_p", "exact", "planted_ranks", "decoy_ranks"]].reset_index(drop=True)


# ------------------------------------------------------------------------------------ its step in `vrh demo`

CONTROL_DETECT_SCENES = 20  # detection scenes of the control in `vrh demo`


def demo_step(run: DemoRun) -> None:
    """Step 1: the positive control, where it is shipped and asked for (``DemoRun.run_control``)."""
    if not (run.run_control and run.steps.open(1, "positive control: the same pipeline on toy:planted, whose "
                                                  "retrieval heads are known")):
        return
    run.outcome = run_positive_control(run.out / "positive_control", device=run.device, batch_size=run.batch_size,
                                       detect_scenes=CONTROL_DETECT_SCENES, eval_scenes=run.sizes.control_scenes,
                                       random_sets=run.sizes.random_sets, placement=run.placement)
    print("      " + short_line(run.outcome), flush=True)  # the paragraph and the grading table: in the report
