"""Regenerate docs/results/steer.md: sufficiency by redirection on the positive control ``toy:planted``.

    python docs/_generate_steer.py [--out runs/steer-results]

Every number on the page is measured here by the library's own code path, ``experiments.steer.detect_and_steer``
(what ``vrh steer`` runs): the heads ranked by the VRH score on detection scenes, then on evaluation scenes with two
referable objects the top-k, the declared planted heads and decoys, and random / layer-matched / live-head control
sets redirected onto the other object with a pre-softmax bias alpha (``templates.redirect.HeadRedirect``), the
activation-patching form beside it, and the ``sufficient`` claim judged by the causal rule at the largest alpha,
its rank test sequential (up to ``RANK_SETS`` sets of each kind on ``RANK_ITEMS`` items). Then the calibration: the
same experiment with a random head set of the same size (outside the planted heads and decoys) in the top-k's
place, which must not hold. Then toys A and C (``toy:a``, ``toy:c``): the same experiment on the VRH-score top-k*
(k* as the demo's, ``experiments.ks.demo_ks``), whose heads are not known retrieval heads, with the rank test capped
at ``TOY_RANK_SETS`` sets of each kind. The run folders resume; the page is never edited by hand.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import pandas as pd

from vrh_interp.experiments.ks import demo_ks
from vrh_interp.core.bookkeeping.provenance import library_versions
from vrh_interp.evaluation.controls import random_control
from vrh_interp.experiments.positive_control import declared, load_planted
from vrh_interp.experiments.steer import SteerResult, claim_line, detect_and_steer
from vrh_interp.specs import load_spec
from vrh_interp.toy import weights_sha256
from vrh_interp.viz.tables import markdown_table

HERE = Path(__file__).resolve().parent
ITEMS = 30
DETECT_SCENES = 20
ALPHAS = (0.0, 4.0, 8.0, 16.0)
SEEDS = range(5)  # the dose-response sets of each kind (the picture and the effect)
RANK_SETS = 199  # the sequential rank test's most sets of each kind: p down to 1 / 200
RANK_ITEMS = 12
PATCH_SEEDS = 3
CALIBRATION_SEEDS = range(3)  # random head sets in the top-k's place
CALIBRATION_ALPHAS = (0.0, 16.0)  # the verdict reads alpha 0 and the claim's alpha only
TOYS = ("a", "c")  # toy A (32 heads, k* = 1) and toy C (128 heads, k* = 3): no planted truth
TOY_ITEMS = 30
TOY_RANK_SETS = 59  # p down to 1 / 60, under the claim's level 0.05 (one claim on the table); keeps the toys cheap


def _seconds(folder: Path, name: str, elapsed: float, fresh: bool) -> tuple[float, bool]:
    """The seconds of the run that computed ``name`` (kept in ``folder/page_seconds.json`` when it ran, so that a
    resumed run, which only reads its folders back, still quotes them) and whether that run was itself resumed."""
    path = folder / "page_seconds.json"
    stored = json.loads(path.read_text()) if path.exists() else {}
    if fresh or name not in stored:
        stored[name] = {"seconds": elapsed, "resumed": not fresh}
        path.write_text(json.dumps(stored, indent=1) + "\n")
    return float(stored[name]["seconds"]), bool(stored[name]["resumed"])


def _rate(dose: pd.DataFrame, kind: str, alpha: float) -> str:
    found = dose[(dose["kind"] == kind) & (dose["alpha"] == alpha)]["move_rate"]
    return f"{found.iloc[0]:.0%}" if len(found) else "n/a"


def _meaning(verdict: str, k: int) -> str:
    """What the verdict says on a toy whose top-k is not a known set of retrieval heads."""
    if verdict == "holds":
        return (f"redirecting the VRH top-{k} moves answers to the other object more than every kind of control set "
                "does, by more than the claim's margin: on this toy the heads the score ranks first are sufficient "
                "to steer which object is grounded, though nothing was planted there.")
    if verdict == "does not hold":
        return (f"the VRH top-{k} redirected onto the other object moves answers to it by less than the claim's "
                "margin (0.1) more than control sets of the same size redirected the same way, with confidence (the "
                "rule's upper bound on the difference lies below the margin): on this toy the heads the score ranks "
                "first are not sufficient to steer which object is grounded by a pre-softmax bias at these alphas. "
                "That is a result about sufficiency under this intervention, not about necessity (masking, the demo's "
                "pages), and unlike `toy:planted` there is no known truth to check it against.")
    return (f"the data neither bound the top-{k}'s advantage over the control sets above the claim's margin nor below "
            "it: with these items and sets the experiment cannot say whether the heads the score ranks first are "
            "sufficient on this toy; more items (or sets) would decide it.")


def toy_section(name: str, out: Path) -> tuple[list[str], float]:
    """Run (or resume) the experiment on ``toy:NAME``'s VRH top-k* into ``out``; the page's lines and the seconds."""
    started = time.perf_counter()
    fresh = not (out / "manifest.json").exists()
    vlm = load_spec(f"toy:{name}")
    total = vlm.geometry.total_heads
    k = demo_ks(total)[1]
    result: SteerResult = detect_and_steer(vlm, out, items=TOY_ITEMS, detect=DETECT_SCENES, k=k, alphas=ALPHAS,
                                           random_seeds=SEEDS, patching=False, rank_sets=TOY_RANK_SETS,
                                           rank_items=RANK_ITEMS, batch_size=30, say=print)
    seconds, resumed = _seconds(out, "experiment", time.perf_counter() - started, fresh)
    written = result.write(out)
    figure = f"dose_response-toy-{name}.png"
    shutil.copy(written["dose_response.png"], HERE / "results" / "steer-figures" / figure)
    config, dose, rank = result.config, result.dose_response(), result.rank()
    top = config["conditions"][f"top:alpha={max(ALPHAS):g}"]
    kinds = [kind for kind in ("random", "matched", "live") if kind in set(dose["kind"])]
    words = {"random": "random sets", "matched": "layer-matched sets", "live": "live-head sets"}
    rank_line = "; ".join(f"{r.kind} {r.p:.2g} after {r.sets} sets ({r.as_many_moved} moved as many)"
                          for r in rank.itertuples())
    claim = result.claims().iloc[0]
    lines = [
        f"### toy:{name} ({total} heads, top-{k})",
        "",
        f"**Verdict: {claim_line(result)}**",
        "",
        f"Heads redirected: the top-{k} by the VRH score on {DETECT_SCENES} detection scenes ({', '.join(top)}), "
        f"against control sets of {k} drawn outside them ({', '.join(words[kind] for kind in kinds)}"
        + ("" if "live" in kinds else "; no live-head control: too few live heads outside the top-k")
        + ("; every head outside the top-k is live, so the live-head sets are the random sets"
           if "live" in kinds and len(set(config.get("live_pool") or []) - set(top)) == total - k else "") + "), "
        f"{len(SEEDS)} of each kind; {TOY_ITEMS} items, alpha in {', '.join(f'{a:g}' for a in ALPHAS)}.",
        "",
        f"- At alpha = {max(ALPHAS):g}: the top-{k} move {_rate(dose, 'top', max(ALPHAS))} of the answers to the "
        f"target (alpha 0: {_rate(dose, 'top', 0.0)}); "
        + ", ".join(f"{words[kind]} {_rate(dose, kind, max(ALPHAS))}" for kind in kinds) + " (mean over sets).",
        f"- Rank p (sequential, up to {TOY_RANK_SETS} sets of each kind on {len(config['rank']['sample_ids'])} "
        f"items): {rank_line}.",
        f"- The claim's numbers: {claim['numbers']}.",
        f"- What it means: {_meaning(str(claim['verdict']), k)}",
        "",
        f"![Dose-response on toy:{name}: move rate of the VRH top-{k} and of the control sets per alpha]"
        f"(steer-figures/{figure})",
        "",
        markdown_table(rank),
        "",
        markdown_table(dose),
        "",
        f"Measured on `toy:{name}` (weights sha256 `{weights_sha256(name)[:16]}`), CPU, {seconds:.0f} s "
        + ("(resumed from a partial folder) " if resumed else "")
        + f"on this machine, with the rest of the page's library versions (below). Run folder: `{out}`.",
        "",
    ]
    return lines, seconds


def generate(out: Path) -> Path:
    started = time.perf_counter()
    fresh = not (out / "manifest.json").exists()
    vlm = load_planted()
    planted, decoys = declared()
    k = len(planted)
    result = detect_and_steer(vlm, out, items=ITEMS, detect=DETECT_SCENES, k=k, alphas=ALPHAS, random_seeds=SEEDS,
                              named={"planted": planted, "decoys": decoys}, patch_seeds=PATCH_SEEDS,
                              rank_sets=RANK_SETS, rank_items=RANK_ITEMS, batch_size=30, say=print)
    elapsed, resumed = _seconds(out, "experiment", time.perf_counter() - started, fresh)
    written = result.write(out)
    calibration, calibration_started = [], time.perf_counter()
    calibration_fresh = any(not (out.parent / f"{out.name}-random-{seed}" / "manifest.json").exists()
                            for seed in CALIBRATION_SEEDS)
    for seed in CALIBRATION_SEEDS:
        heads = random_control(vlm.geometry, planted.union(decoys), k, seed)
        found = detect_and_steer(vlm, out.parent / f"{out.name}-random-{seed}", items=ITEMS, alphas=CALIBRATION_ALPHAS,
                                 random_seeds=SEEDS, patching=False, rank_sets=RANK_SETS, rank_items=RANK_ITEMS,
                                 heads=heads, batch_size=30, say=print)
        rank, dose = found.rank(), found.dose_response().set_index(["kind", "alpha"])
        calibration.append({"redirected set (random)": ", ".join(heads.to_list()),
                            f"moved at alpha {max(ALPHAS):g}": f"{dose.loc[('top', max(ALPHAS)), 'move_rate']:.0%}",
                            "rank p": "; ".join(f"{r.kind} {r.p:.2g}" for r in rank.itertuples()),
                            "sets drawn": "; ".join(f"{r.kind} {r.sets}" for r in rank.itertuples()),
                            "verdict": found.verdict()})
    calibration_seconds, calibration_resumed = _seconds(out, "calibration",
                                                        time.perf_counter() - calibration_started, calibration_fresh)
    figures = HERE / "results" / "steer-figures"
    toys = {name: toy_section(name, out.parent / f"{out.name}-{name}") for name in TOYS}
    figures.mkdir(parents=True, exist_ok=True)
    shutil.copy(written["dose_response.png"], figures / "dose_response.png")

    config = result.config
    claim = result.claims().iloc[0]
    rank = result.rank()
    rank_ids = config["rank"]["sample_ids"]
    rank_line = "; ".join(f"{r.kind} {r.p:.2g} after {r.sets} sets ({r.as_many_moved} moved as many)"
                          for r in rank.itertuples())
    answers = int((result.records["form"] == "rank").sum())
    dose = result.dose_response()
    patch = result.patching()
    top = config["conditions"][f"top:alpha={max(ALPHAS):g}"]
    at = dose[dose["alpha"] == max(ALPHAS)].set_index("kind")
    lines = [
        "# Redirection: are the planted heads sufficient?",
        "",
        "<!-- generated by docs/_generate_steer.py; do not edit by hand -->",
        "",
        "Masking tests necessity: remove the top-k heads and grounding breaks. This page tests sufficiency on the",
        "positive control `toy:planted`: point the heads at ANOTHER object of the image and see whether the answer",
        "follows. Each item is an evaluation scene with at least two referable objects; the input's expression names",
        "its referent, and the target is the next referable object. The redirected heads get a pre-softmax bias",
        "alpha on the keys of the target's visual tokens, at the rows that produce the answer (the last prompt row",
        "and every generated token; `vrh_interp.core.execution.templates.redirect`). An answer **moves** (IoU >= 0.5 "
        "with the",
        "target's box), **stays** (IoU >= 0.5 with the referent's) or **breaks** (no box, or a box on neither).",
        "The same experiment then runs on toys A and C, whose top heads are not known retrieval heads (last section).",
        "",
        f"**Verdict: {claim_line(result)}**",
        "",
        f"Heads redirected: the top-{k} by the VRH score on {DETECT_SCENES} detection scenes "
        f"({', '.join(top)}; the planted heads are {', '.join(planted.to_list())}, the decoys "
        f"{', '.join(decoys.to_list())}), against control sets of {k} heads drawn outside the top-{k} (random, "
        "layer-matched and live-head: the sweep's control machinery, the live pool from the head census), each "
        f"redirected the same way. Dose-response: {ITEMS} items, alpha in {', '.join(f'{a:g}' for a in ALPHAS)}, "
        f"{len(SEEDS)} sets of each kind. The claim is judged at alpha = {max(ALPHAS):g}, the largest of the grid, "
        f"declared before the run; its rank test is sequential (below): up to {RANK_SETS} sets of each kind on "
        f"{len(rank_ids)} fixed items.",
        "",
        "![Dose-response: redirecting the planted heads moves answers to the target; decoys and control sets do "
        "not](steer-figures/dose_response.png)",
        "",
        "## What was measured",
        "",
        f"- At alpha = {max(ALPHAS):g}: the top-{k} move {at.loc['top', 'move_rate']:.0%} of the answers to the target "
        f"(alpha 0: {dose[(dose['kind'] == 'top') & (dose['alpha'] == 0)]['move_rate'].iloc[0]:.0%}); the decoys "
        f"{at.loc['decoys', 'move_rate']:.0%}, random sets {at.loc['random', 'move_rate']:.0%}, layer-matched sets "
        f"{at.loc['matched', 'move_rate']:.0%}"
        + (f", live-head sets {at.loc['live', 'move_rate']:.0%}" if "live" in at.index else "") + " (mean over sets).",
        f"- The claim's numbers: {claim['numbers']}.",
        f"- The rule: {claim['rule']}.",
        "",
        "## The rank test",
        "",
        "Is the top-k more effective than the control sets INCLUDING its own draw? With 19 fixed sets of each kind",
        "the rank p cannot go below 1/20 = 0.05, so a claim judged at 0.05 would hold only at the floor. The test is",
        "sequential instead, as the grounding causal claim's (`experiments.designs`): at the declared alpha only,",
        f"control sets of each kind are drawn in blocks of 20, 40, 80, ... up to {RANK_SETS} (seeds from 500 on,",
        f"never a dose-response draw) and redirected on {len(rank_ids)} fixed items; a kind stops once 5 of its sets",
        "moved at least as many answers as the top-k (Besag-Clifford: p = 5 / sets drawn), and each set is answered",
        "item by item only until its comparison with the top-k is decided (a set that already left more answers",
        "unmoved than the top-k cannot move as many). The p-value is exactly the full table's.",
        "",
        f"- Rank p: {rank_line}; {answers} answers in all (the full table: "
        f"{int(rank['sets'].sum()) * len(rank_ids) + len(rank_ids)}).",
        "",
        markdown_table(rank),
        "",
        "## Calibration: a random head set in the top-k's place",
        "",
        f"The same experiment with a random set of {k} heads drawn outside the planted heads and decoys redirected",
        f"in the top-k's place (`vrh steer --heads ...`; alpha 0 and {max(ALPHAS):g} only, the two the verdict reads,",
        "no patching form): it must never hold. `tests/test_steer.py` runs the same check on the command (3 random",
        "sets, 8 items) and the rule on simulated tables of known truth (a target exchangeable with the sets holds at",
        "most at the level; one that moves more than every set holds).",
        "",
        f"- Verdicts: {', '.join(row['verdict'] for row in calibration)}.",
        "",
        markdown_table(pd.DataFrame(calibration)),
        "",
        "## Dose-response",
        "",
        "Share of answers per outcome, per head-set kind and alpha (a control kind pooled over its sets; alpha = 0 is",
        "the unsteered run, the same for every kind: the template leaves a head of strength 0 untouched, tested bit",
        "for bit).",
        "",
        markdown_table(dose),
        "",
        "## The activation-patching form",
        "",
        "The same heads' outputs taken from the run where the target IS the referent (the target's own expression",
        "on the same image) and patched into the item's run while it generates (`patching.head_patching."
        f"patched_answers`); control sets: the first {PATCH_SEEDS} of each kind.",
        "",
        markdown_table(patch),
        "",
        "## Toys A and C: the VRH top-k without a planted truth",
        "",
        "The same experiment (`detect_and_steer`, what `vrh steer --model toy:a` runs) on the two toys whose heads",
        "were trained, not planted: the top-k* by the VRH score on the same detection scenes, k* as the demo takes it",
        "(`experiments.ks.demo_ks`: about 2% of the heads, at least 1), redirected at the same alphas against random,",
        "layer-matched and live-head sets of the same size. Unlike the planted heads these are not known to retrieve",
        "the referent, so no verdict is expected in advance: whatever the rule reads is the result. Smaller than",
        f"the positive control: the rank test stops at {TOY_RANK_SETS} sets of each kind (p no lower than "
        f"1/{TOY_RANK_SETS + 1},",
        "still under the claim's level 0.05) and there is no patching form.",
        "",
        *(line for name in TOYS for line in toys[name][0]),
        "## Provenance",
        "",
        f"Measured on `toy:planted` (weights sha256 `{weights_sha256('planted')[:16]}`), CPU, {elapsed:.0f} s for the "
        f"experiment{' (resumed from a partial folder)' if resumed else ''} and {calibration_seconds:.0f} s for the "
        f"calibration{' (resumed)' if calibration_resumed else ''} on this machine; the toys' times in their "
        "sections; with "
        + ", ".join(f"{a} {b}" for a, b in library_versions().items()) + ". Run folders: "
        f"`{out}` and `{out}-random-N` (resumable; `records.csv` holds every answer); the toys' "
        + ", ".join(f"`{out}-{name}`" for name in TOYS) + ". Regenerate with "
        "`python docs/_generate_steer.py`; the same experiment on any model: `vrh steer --model MODEL`.",
        "",
    ]
    page = HERE / "results" / "steer.md"
    page.write_text("\n".join(lines))
    print(f"wrote {page} ({time.perf_counter() - started:.0f} s)")
    return page


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/steer-page"))
    generate(parser.parse_args().out)
