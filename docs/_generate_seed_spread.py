"""Regenerate docs/results/seed-spread.md: how much do toy C's heads and verdicts move between trainings?

    python docs/_generate_seed_spread.py [--trained 0=DIR0,3=DIR3] [--out runs/seed-spread] [--demo-seed 1]

Toy C's heads are decided by its last three recipe stages (``c-revive``: the revive of the inert heads and 500
multitask steps; ``c-share``: the inserted layers take the next layer's attention, then 400 multitask steps;
``c-share7``: layer 7 takes layer 6's attention, then 800 multitask steps; ``toy_training.recipe``). Training N is
the recipe with those stages' seeds moved by N, started from the same weights (toy C 0.2, commit ee3b141):

    python -m toy_training.recipe --model c --out DIR --threads 1 --reseed N

(with ``DIR/00-cd-text/final`` an empty folder and ``DIR/01-c/final`` toy C 0.2's checkpoint, so only the last three
stages train). Training 2 is the shipped ``toy:c`` (``toy_training.recipe.SHIPPED_RESEED``: of trainings 0, 2, 3 the
first to meet every goal of issue 31, declared in the model card); trainings 0 and 3 are kept in
``toy_training/seed_spread/c-share7-train0`` and ``c-share7-train3`` (the default ``--trained``; not in the wheel;
their demo runs were made from the same weights under ``toy_training/candidates/``, the folder's name before toy C
was shipped). N = 1 is left out: the stage
before them (``c``) trained with seed 1, and ``c-revive``'s fresh training heads (the query-probe scaffold, seeded
from the stage's seed) would then start as that stage's probe started, already reading the representation the model
learnt beside it (query accuracy 0.97 at step 1, against 0.03-0.09 for seeds 2 and 3): a warm scaffold, not another
draw of the recipe. Every trained model then runs the same ``vrh demo`` (fixed default sizes, ``--seed`` of the
control draws and the bootstrap fixed, positive control left out: it does not depend on the main model), each into
its own resumable folder under ``--out``; a finished folder is reused as it is, so the shipped training's may be the
results page's run (``docs/_generate_results.py --model c --seed 1``: the same sizes and seed, its positive-control
claims left out here). The page lists per trained model: the head census, grounding accuracy, the top heads with
their scores, the overlap of the top heads between trainings, and every claim's verdict; the variation across
samples (control draws, bootstrap) is on verdict-stability.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import pandas as pd

from vrh_interp.apps.cli import main as vrh
from vrh_interp.core.bookkeeping.provenance import library_versions
from vrh_interp.evaluation.claims import POSITIVE_CONTROL_CLAIMS
from vrh_interp.scoring.scores import HeadScores
from vrh_interp.toy import weights_sha256

from _generate_results import demo_seconds  # noqa: E402  (docs/ is the script's folder: sys.path[0])

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # toy_training: dev tooling at the repository root
from toy_training.recipe import SHIPPED_RESEED  # noqa: E402

SHIPPED = SHIPPED_RESEED["c"]
SHORT = {"holds": "holds", "does not hold": "NOT", "inconclusive": "inc.", "not measured": "-"}
TOP = 10


def run(out: Path, model: str, demo_seed: int, extra: list[str]) -> dict:
    if not (out / "demo.json").exists():
        status = vrh(["demo", "--out", str(out), "--model", model, "--transfer-model", "toy:d",
                      "--no-positive-control", "--seed", str(demo_seed), *extra])
        if status != 0:
            raise SystemExit(f"vrh demo --model {model} failed with status {status}")
    return {**json.loads((out / "demo.json").read_text()), "timing": demo_seconds(out)}


def weights_digest(model: str) -> str:
    return weights_sha256("c", None if model.startswith("toy:") else model)[:12]


def training_level1(model: str) -> str:
    """Level-1 grounding at the stage's last in-training evaluation (the same scenes for every training)."""
    folder = Path(model) if not model.startswith("toy:") else HERE.parent / "vrh_interp/toy/checkpoints/c"
    history = (json.loads((folder / "history.json").read_text()) if (folder / "history.json").exists()
               else json.loads((folder / "training_log.json").read_text())["history"])
    level1 = history[-1]["eval"]["level1"]
    return f"{level1['accuracy']:.3f} (n={level1['n']})"


def task_census(out: Path, model: str) -> dict[str, list[str]]:
    """Heads inert by single-head effect per task (``toy_training.regime.task_effects``: grounding, VQA, text, 12
    fresh items each) and on every task; kept in ``out/task_census.json`` (re-measured when it holds counts only)."""
    path = out / "task_census.json"
    if not path.exists() or not all(isinstance(v, list) for v in json.loads(path.read_text()).values()):
        from toy_training import regime
        from vrh_interp.evaluation.census import EFFECT_FLOOR
        from vrh_interp.specs import load_spec

        vlm = load_spec(model)
        inert = regime.inert_by_task(regime.task_effects(vlm.hf_model, vlm.processor), EFFECT_FLOOR)
        path.write_text(json.dumps(inert))
    return json.loads(path.read_text())


def baseline_accuracy(out: Path) -> str:
    path = out / "sweep_summary.csv"
    summary = pd.read_csv(path) if path.exists() else None
    if summary is None or "condition" not in summary:
        return "-"
    row = summary[summary["condition"] == "baseline"]
    return f"{row['accuracy'].iloc[0]:.3f}" if len(row) else "-"


def main() -> None:
    parser = argparse.ArgumentParser()
    kept = HERE.parent / "toy_training" / "seed_spread"
    parser.add_argument("--trained", default=f"0={kept / 'c-share7-train0'},3={kept / 'c-share7-train3'}",
                        help="the other trainings, e.g. '0=DIR0,3=DIR3' (the shipped toy:c is training "
                             f"{SHIPPED}; default: the kept ones)")
    parser.add_argument("--out", type=Path, default=Path("runs/seed-spread"))
    parser.add_argument("--demo-seed", type=int, default=1)
    parser.add_argument("--demo-args", default="", help="more `vrh demo` options (a smoke test's small sizes)")
    args = parser.parse_args()
    models = dict(sorted({SHIPPED: "toy:c",
                          **{int(k): v for k, v in (part.split("=", 1) for part in args.trained.split(","))}}.items()))
    demos, rankings, census = {}, {}, {}
    for seed, model in models.items():
        out = args.out / f"c-train{seed}"
        demos[seed] = run(out, model, args.demo_seed, args.demo_args.split())
        rankings[seed] = HeadScores.load(out / "scores-vrh.json")
        census[seed] = task_census(out, model)
    labels = [f"training {seed}" for seed in models]
    overview = pd.DataFrame([{
        "training": f"training {seed}" + (" (shipped toy:c)" if model == "toy:c" else ""),
        "weights sha256": weights_digest(model),
        "live heads": demos[seed]["census"]["live"],
        "inert by norm": demos[seed]["census"]["inert_by_norm"],
        "inert by effect (grounding, demo census)": demos[seed]["census"]["inert_by_effect"],
        "inert by effect per task: grounding / VQA / text / every task": " / ".join(
            str(len(heads)) for heads in census[seed].values())
        + (f" ({', '.join(census[seed]['every task'])})" if census[seed]["every task"] else ""),
        "k*": demos[seed]["k_star"],
        "level 1 at the last training evaluation": training_level1(model),
        "demo baseline accuracy": baseline_accuracy(args.out / f"c-train{seed}"),
        f"top {TOP} heads (score)": ", ".join(f"{h} ({rankings[seed].score_of(h):.3f})"
                                               for h in rankings[seed].top(TOP)),
    } for seed, model in models.items()])
    overlaps = []
    for a, b in itertools.combinations(models, 2):
        for k in (3, TOP):
            top_a, top_b = set(rankings[a].top(k)), set(rankings[b].top(k))
            overlaps.append({"pair": f"{a} vs {b}", "k": k, "shared": len(top_a & top_b),
                             "jaccard": round(len(top_a & top_b) / len(top_a | top_b), 3)})
    verdicts: dict[tuple[str, str], dict] = {}
    for seed in models:
        for verdict in demos[seed]["verdicts"]:
            if verdict.get("id") in POSITIVE_CONTROL_CLAIMS:  # in a reused results-page run: not the main model's
                continue
            verdicts.setdefault((verdict["table"], verdict["claim"].split(":")[0]), {})[f"training {seed}"] = (
                verdict["verdict"], verdict.get("estimate"))
    rows = []
    for (table, claim), by_label in verdicts.items():
        row = {"table": table, "claim": claim}
        for label in labels:
            verdict, estimate = by_label.get(label, ("not measured", None))
            shown = SHORT.get(verdict, verdict)
            if isinstance(estimate, float) and estimate == estimate:
                shown += f" ({estimate:+.3f})"
            row[label] = shown
        row["same verdict"] = "yes" if len({by_label.get(lb, ("not measured",))[0] for lb in labels}) == 1 else "NO"
        rows.append(row)
    frame = pd.DataFrame(rows)
    same = int((frame["same verdict"] == "yes").sum())
    opposite = [r["claim"] for r in rows
                if {"holds", "NOT"} <= {r[lb].split(" ")[0] for lb in labels}]
    lines = ["# Seed spread: toy C's heads and verdicts across trainings", "",
             "Generated by `python docs/_generate_seed_spread.py` (module doc: how each training was made). "
             f"Each trained model ran `vrh demo --seed {args.demo_seed}` at the fixed default sizes, without the "
             "positive control or, for a reused results-page run, with its positive-control claims left out here; "
             "so the samples, control draws and bootstrap are the same for every training: what differs is "
             "the training alone. Library versions: "
             + ", ".join(f"{k} {v}" for k, v in library_versions().items()) + ".", "",
             "## The trained models", "", overview.to_markdown(index=False), "",
             "Inert by effect: a single-head KL under 1 % of the 90th-percentile head's. The demo's census (6 "
             "grounding items) decides its live-head control pool; the per-task census (`toy_training.regime."
             "task_effects`, 12 fresh items of each task) is the organism's: a head inert on every task has no "
             "job, one acting on the text tasks only is a trained head with another job.", "",
             "## Do the top heads stay the same?", "", pd.DataFrame(overlaps).to_markdown(index=False), "",
             "## Every verdict per training (estimate in brackets)", "",
             "Cells: holds / NOT (does not hold) / inc. (inconclusive) / - (not measured). The transfer partner "
             f"is toy:d in every training, and toy:d is built on the shipped training's language backbone "
             f"(training {SHIPPED}; docs/toy-models.md): for the other trainings the \"shared\" claim pairs them "
             "with a model on another training's backbone (their common ancestor is toy C 0.2), not with a "
             "partner of their own.", "",
             frame.to_markdown(index=False), "",
             f"Same verdict in every training: {same} of {len(frame)} claims; opposite decisive verdicts (holds in "
             f"one training, does not hold in another): {len(opposite)}"
             + (f" ({', '.join(opposite)})." if opposite else "."), "",
             "Across samples instead of trainings (one trained model, five seeds of the control draws and the "
             "bootstrap, two time caps and a full-size run): [verdict-stability.md](verdict-stability.md).", "",
             "Seconds per demo run on this machine: "
             + "; ".join(f"training {seed}: {demos[seed]['timing']}" for seed in models) + "."]
    page = HERE / "results" / "seed-spread.md"
    page.write_text("\n".join(lines) + "\n")
    print(page)


if __name__ == "__main__":
    main()
