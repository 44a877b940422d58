"""``grid_summary``: a grid's summary tables, read from its done cells' folders.

``grid_summary.csv`` / ``.md`` (the paper's Table 3 / A12 layout with the verdict of the claims rules per cell,
``cell_verdicts``), ``grid_patching.csv`` (the patching study's own headline per patching cell) and the heatmap
``grid_drop.png``. Apart from ``grid`` (GRID.toml parsing and the plan) and ``grid_execution`` (running the cells):
it only reads finished cell folders, so it needs neither the executors nor Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from vrh_interp.core.bookkeeping.runs import write_atomic
from vrh_interp.experiments.grid import HEATMAP, SUMMARY_CSV, SUMMARY_MD, Cell, GridSpec, cell_spec

PATCHING_CSV = "grid_patching.csv"


# ---------------------------------------------------------------------------------------------------- summary

def cell_verdicts(folder: Path, kind: str, benchmark: str | None = None) -> dict[int, tuple[str, str]]:
    """``{k: (verdict, reason)}`` of one done cell, from its per-item records by the claims rules (sweep cells:
    ``experiments.verdicts.sweep_claims``, Bonferroni over the k values; VQA cells: the causal claim on one question
    kind's items, ``verdicts.vqa_evidence``): the one place the grid asks for a verdict."""
    from vrh_interp.evaluation.claims import judge
    from vrh_interp.experiments import verdicts

    if kind == "vqa_sweep":
        from vrh_interp.experiments.vqa_sweep import vqa_sweep_from_run

        result = vqa_sweep_from_run(folder)
        out = {}
        for k in sorted({c.k for c in result.conditions if c.kind == "top"}):
            row = judge({"vqa": verdicts.vqa_evidence(result, [benchmark], k)}).iloc[0]
            out[k] = (str(row["verdict"]), str(row["reason"]))
        return out
    from vrh_interp.experiments.sweep import sweep_from_run

    table = verdicts.sweep_claims(sweep_from_run(folder))
    return {int(i.split("=")[1]): (str(v), str(r)) for i, v, r in zip(table["id"], table["verdict"], table["reason"])}


def _accuracy(summary: Any, condition: str, k: int) -> float:
    rows = summary[(summary["condition"] == condition) & (summary["k"] == k)]
    if condition in ("random", "matched", "live"):
        rows = rows[rows["seed"].astype(str) == "all"]
    return float(rows["accuracy"].iloc[0]) if len(rows) == 1 else float("nan")


def summary_rows(summary: Any, experiment: str, model: str, benchmark: str, ks: Sequence[int],
                 judged: Mapping[int, tuple[str, str]]) -> list[dict[str, Any]]:
    """Table 3 / A12 rows of one cell: per k > 0, baseline, VRH-k, random-k, matched-k and live-k accuracy
    (control kinds: the mean over their sets; NaN where the cell drew none), the drop of VRH-k and the verdict
    (``judged``: ``cell_verdicts``)."""
    rows = []
    for k in ks:
        verdict, reason = judged.get(k, ("not measured", "no records"))
        base, top = _accuracy(summary, "baseline", 0), _accuracy(summary, "top", k)
        rows.append({"experiment": experiment, "model": model, "benchmark": benchmark, "k": k, "baseline": base,
                     "vrh": top, "random": _accuracy(summary, "random", k), "matched": _accuracy(summary, "matched", k),
                     "live": _accuracy(summary, "live", k),
                     "drop": base - top, "verdict": verdict, "reason": reason})
    return rows


SUMMARY_COLUMNS = ["experiment", "model", "benchmark", "k", "baseline", "vrh", "random", "matched", "live", "drop",
                   "verdict", "reason"]


def grid_summary(grid_dir: Path, spec: GridSpec, cells: Sequence[Cell],
                 status: Mapping[str, Mapping[str, Any]]) -> Any:
    """The grid's summary table from the done cells' folders (sweep: every k > 0; VQA: k = vqa_k)."""
    import pandas as pd

    rows: list[dict[str, Any]] = []
    for cell in cells:
        if status[cell.id]["status"] != "done" or cell.kind not in ("sweep", "sweep-merge", "vqa_sweep"):
            continue
        folder = grid_dir / cell.folder
        if cell.kind == "vqa_sweep":
            frame = pd.read_csv(folder / "vqa_summary.csv")
            for benchmark, part in frame.groupby("benchmark", sort=False):
                k = int(part.loc[part["condition"] == "top", "k"].iloc[0])
                rows += summary_rows(part.reset_index(drop=True), "vqa", cell.models[0],
                                     f"{cell.benchmark}/{benchmark}", [k], cell_verdicts(folder, cell.kind, benchmark))
        else:
            frame = pd.read_csv(folder / "sweep_summary.csv")
            ks = sorted(int(k) for k in frame.loc[frame["condition"] == "top", "k"].unique())
            rows += summary_rows(frame, "sweep", cell.models[0], cell.benchmark, ks, cell_verdicts(folder, "sweep"))
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


PATCHING_COLUMNS = ["model", "heads_from", "kind", "metric", "heads", "n_pairs", "recovery", "ci_low", "ci_high",
                    "all_heads", "random_mean", "random_rank", "random_sets", "random_p", "matched_mean",
                    "matched_rank", "matched_sets", "matched_p", "verdict"]


def patching_summary(grid_dir: Path, cells: Sequence[Cell], status: Mapping[str, Mapping[str, Any]]) -> Any:
    """One row per done patching cell and pair kind: the study's own headline (``patching_study.headline``: the
    studied heads' recovery with its CI, all heads', their rank among the random and layer-matched sets, the
    study's verdict), read from the cell folder."""
    import pandas as pd

    from vrh_interp.experiments.patching_study import PatchingStudy, headline

    frames = [headline(PatchingStudy.load(grid_dir / c.folder)).assign(model=c.models[0], heads_from=c.benchmark)
              for c in cells if c.kind == "patch" and status[c.id]["status"] == "done"]
    return pd.concat(frames, ignore_index=True)[PATCHING_COLUMNS] if frames else pd.DataFrame(columns=PATCHING_COLUMNS)


def write_summary(grid_dir: Path, spec: GridSpec, cells: Sequence[Cell],
                  status: Mapping[str, Mapping[str, Any]]) -> Any:
    """grid_summary.csv / .md, grid_patching.csv (grids with patching cells) and the heatmap grid_drop.png; the
    summary frame."""
    from vrh_interp.viz.tables import markdown_table

    summary = grid_summary(grid_dir, spec, cells, status)
    write_atomic(grid_dir / SUMMARY_CSV, summary.to_csv(index=False))
    lines = ["# Grid summary", "",
             "Accuracy with nothing masked (baseline), the top-k VRHs masked (VRH-k), and the mean over the random, "
             "layer-matched and live-head k-head control sets; drop = baseline - VRH-k; verdict: the claims rules on "
             "the cell's per-item records (`experiments.grid_summary.cell_verdicts`, "
             "`vrh_interp.evaluation.claims`).", ""]
    if len(summary):
        shown = summary.drop(columns=["reason"]).round(3)
        lines += [markdown_table(shown), ""]
    import pandas as pd

    transfers = [pd.read_csv(grid_dir / c.folder / "transfer_drops.csv") for c in cells
                 if c.kind == "transfer" and status[c.id]["status"] == "done"]
    if transfers:
        lines += ["## Transfer (cross-masking at the largest k)", "", markdown_table(pd.concat(transfers).round(3)), ""]
    if "patch" in spec.experiments:
        patching = patching_summary(grid_dir, cells, status)
        write_atomic(grid_dir / PATCHING_CSV, patching.to_csv(index=False))
        if len(patching):
            study = cell_spec(grid_dir, spec, next(c for c in cells if c.kind == "patch"))
            top = study.top if study.top is not None else "k*"
            lines += ["## Patching (the studied heads' outputs patched clean -> corrupted)", "",
                      f"Recovery of the metric (`{study.metric}`) with the top {top} heads of `heads_from` "
                      "patched, its 95% CI, all heads patched, and the heads' rank among the random "
                      "and layer-matched same-size sets (rank 1 = none recovers as much; p: their tail) with the "
                      "study's verdict (`experiments.patching_study`; the cell's patching.md has every table).", "",
                      markdown_table(patching.drop(columns=["heads"]).round(3)), ""]
    states = [{"cell": c.id, "status": status[c.id]["status"], "reason": status[c.id].get("reason", "")}
              for c in cells]
    lines += ["## Cells", "", markdown_table(pd.DataFrame(states)), ""]
    write_atomic(grid_dir / SUMMARY_MD, "\n".join(lines))
    grounding = summary[summary["experiment"] == "sweep"]
    if len(grounding):
        from vrh_interp.viz.plots import grid_drop_heatmap

        wanted = spec.options.summary_k  # one of the ks (parse_grid): absent only where its cells did not finish
        k = wanted if wanted in set(grounding["k"]) else int(grounding["k"].max())
        at_k = grounding[grounding["k"] == k]
        drops = at_k.pivot(index="model", columns="benchmark", values="drop").reindex(
            index=[m for m in spec.models if m in set(at_k["model"])],
            columns=[b for b in spec.benchmarks if b in set(at_k["benchmark"])])
        verdicts = at_k.pivot(index="model", columns="benchmark", values="verdict").reindex_like(drops)
        missing = f" (summary_k = {wanted}: no finished cell)" if wanted is not None and wanted != k else ""
        figure = grid_drop_heatmap(drops, verdicts, title=f"grounding drop with the top-{k} VRHs masked{missing}")
        figure.savefig(grid_dir / HEATMAP)
    return summary
