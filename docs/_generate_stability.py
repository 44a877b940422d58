"""Regenerate docs/results/verdict-stability.md: does the claims table depend on the seed or on a time cap?

    python docs/_generate_stability.py [--models c,a] [--seeds 1,2,3,4,5] [--model-seeds 'a=1,2']
        [--budgets 180,540] [--budget-models c,a] [--no-full] [--out runs/stability] [--conditions TEXT]

For each organism, the default ``vrh demo`` (fixed sizes) with every seed, and with seed 0 capped by each
``--budget-seconds``, then the full-size run (``FULL``: 3.8x the evaluation items, 2x the control sets), each
into its own resumable folder under ``--out`` (a finished run is read back, not rerun). The page lists every
claim's verdict in every run beside the full-size verdict, and the seconds each run took on this machine.
The goal: identical verdicts wherever the full-size verdict is decisive, and "inconclusive" (never the
opposite verdict) where it is not.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from vrh_interp.apps.cli import main as vrh
from vrh_interp.core.bookkeeping.provenance import library_versions
from vrh_interp.toy import weights_sha256

from _generate_results import demo_seconds  # noqa: E402  (docs/ is the script's folder: sys.path[0])

HERE = Path(__file__).resolve().parent
TRANSFER = {"a": "b", "c": "d"}
FULL = ["--eval", "152", "--random-sets", "40", "--check-items", "80", "--vqa-scenes", "25"]
SHORT = {"holds": "holds", "does not hold": "NOT", "inconclusive": "inc.", "not measured": "-"}



def run(out: Path, model: str, extra: list[str]) -> dict:
    if not (out / "demo.json").exists():
        status = vrh(["demo", "--out", str(out), "--model", f"toy:{model}", "--transfer-model",
                      f"toy:{TRANSFER[model]}", *extra])
        if status != 0:
            raise SystemExit(f"vrh demo {' '.join(extra)} failed with status {status}")
    return {**json.loads((out / "demo.json").read_text()), "timing": demo_seconds(out)}


def table(model: str, runs: dict[str, dict]) -> tuple[pd.DataFrame, list[str]]:
    rows, notes = {}, []
    for label, demo in runs.items():
        for verdict in demo["verdicts"]:
            rows.setdefault((verdict["table"], verdict["claim"].split(":")[0]), {})[label] = verdict["verdict"]
        notes.append(f"{label}: {demo['timing']}")
    frame = pd.DataFrame([{"table": t, "claim": c, **v} for (t, c), v in rows.items()])
    full = "full size" if "full size" in frame else None
    if full:
        def agrees(row: pd.Series) -> str:
            others = [row[label] for label in runs if label != full and pd.notna(row.get(label))]
            if row[full] in ("holds", "does not hold"):
                opposite = {"holds": "does not hold", "does not hold": "holds"}[row[full]]
                if opposite in others:
                    return "OPPOSITE VERDICT"
                return "identical" if all(o == row[full] for o in others) else "some inconclusive"
            return "full size undecided: " + ("never decisive" if all(o in ("inconclusive", "not measured")
                                                                       for o in others) else "decisive in some runs")
        frame["stability"] = frame.apply(agrees, axis=1)
    return frame, notes


def agreement(frame: pd.DataFrame, labels: list[str]) -> str:
    """One line: how many claims read the same in every run, and which differ (and how)."""
    differ = [f"{row['claim']} ({', '.join(f'{label}: {row[label]}' for label in labels)})"
              for _, row in frame.iterrows() if len({row[label] for label in labels}) > 1]
    opposite = [row["claim"] for _, row in frame.iterrows()
                if {"holds", "does not hold"} <= {row[label] for label in labels}]
    return (f"Same verdict in every run: {len(frame) - len(differ)} of {len(frame)} claims; opposite decisive "
            f"verdicts (holds in one run, does not hold in another): {len(opposite)}"
            + (f". Differing: {'; '.join(differ)}." if differ else "."))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="c,a")
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--model-seeds", default="", help="seeds for some models instead of --seeds, e.g. 'a=1,2'")
    parser.add_argument("--budgets", default="180,540")
    parser.add_argument("--budget-models", default=None, help="the models the capped runs are made for (default all)")
    parser.add_argument("--no-full", action="store_true", help="leave out the full-size run")
    parser.add_argument("--out", type=Path, default=Path("runs/stability"))
    parser.add_argument("--conditions", default="", help="how the runs shared the machine (quoted beside their "
                                                          "seconds), e.g. 'three at a time, one thread each'")
    args = parser.parse_args()
    lines = ["# Verdict stability: the claims table across seeds and time caps", "",
             "Generated by `python docs/_generate_stability.py` (every run a `vrh demo` at the fixed default sizes "
             "unless stated; `--seed` moves the control-set draws and the bootstrap; "
             "`--budget-seconds` caps the run, and the claims of the steps it skips read inconclusive). Library "
             "versions: " + ", ".join(f"{k} {v}" for k, v in library_versions().items()) + ".", "",
             "Cells: holds / NOT (does not hold) / inc. (inconclusive) / - (not measured). The goal: identical "
             "verdicts wherever the full-size verdict is decisive, inconclusive (never the opposite) where it "
             "is not.", ""]
    per_model = dict(part.split("=", 1) for part in args.model_seeds.split(";") if part)
    for model in args.models.split(","):
        runs = {}
        for seed in [int(s) for s in per_model.get(model, args.seeds).split(",") if s]:
            runs[f"seed {seed}"] = run(args.out / f"{model}-seed{seed}", model, ["--seed", str(seed)])
        capped = args.budget_models is None or model in args.budget_models.split(",")
        for budget in [b for b in args.budgets.split(",") if b and capped]:
            runs[f"cap {budget} s"] = run(args.out / f"{model}-cap{budget}", model, ["--budget-seconds", budget])
        if not args.no_full:
            runs["full size"] = run(args.out / f"{model}-full", model, FULL)
        frame, notes = table(model, runs)
        shown = frame.copy()
        for label in runs:
            shown[label] = shown[label].map(lambda v: SHORT.get(v, v) if isinstance(v, str) else "-")
        census = next(iter(runs.values()))["census"]
        lines += [f"## toy {model.upper()} (transfer partner toy {TRANSFER[model].upper()})", "",
                  f"Head census: {census['live']} of {census['heads']} heads live ({census['inert_by_norm']} inert by "
                  f"output norm, {census['inert_by_effect']} by single-head effect). Weights: the shipped toy "
                  f"{model.upper()}, sha256 {weights_sha256(model)[:12]}.", "",
                  shown.to_markdown(index=False), "", "Seconds per run on this machine"
                  + (f" ({args.conditions})" if args.conditions else "") + ": " + "; ".join(notes) + ".", "",
                  agreement(frame, list(runs)), ""]
    page = HERE / "results" / "verdict-stability.md"
    page.write_text("\n".join(lines))
    print(page)


if __name__ == "__main__":
    main()
