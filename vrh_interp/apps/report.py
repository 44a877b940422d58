"""``vrh report RUN_FOLDER``: one self-contained HTML page (figures embedded) and a Markdown summary.

The report reads whatever artifacts the run folder holds and skips what is absent, so it works for a
detect-only run as for a full demo. Order, pictures first:

1. the positive control (``positive_control/``: its outcome sentence and the detection grading table), so a
   negative verdict below sits next to a pipeline that demonstrably finds planted heads;
2. the k-sweep's verdict lines, one per k (``verdict_lines``: top-k vs the random and layer-matched sets);
3. figures: the k-sweep curve with the random-set band (5-95 % quantiles of the sets) and the layer-matched
   band, the score heatmap, the score-vs-single-head-damage scatter (``head_scan.csv``), attention overlays of
   the top heads (``overlays/*.png``), then failure decomposition, score distribution, design space,
   cross-masking;
4. tables (``TABLES``), each collapsible (``<details>``) in the HTML; the claims table starts open. Sweep
   tables keep one row per control head set; the ``seed="all"`` rows hold the sets' distribution (mean, sd,
   quantiles, two-level bootstrap interval) and the top-k rows their empirical p-values against each control;
   the last one, ``timing.csv`` (``vrh demo``), is the time per step: planned, re-estimated, measured.
"""

from __future__ import annotations

import ast
import base64
import html
import io
import json
from pathlib import Path
from typing import Any

import pandas as pd

from vrh_interp.viz import plots
from vrh_interp.scoring.scores import HeadScores
from vrh_interp.viz.tables import markdown_table

TABLES = (
    ("verdicts.csv", "The paper's claims on this model"),
    ("sweep_summary.csv", "Causal k-sweep: top-k heads vs random and layer-matched head sets"),
    ("ablation_kinds.csv", "The causal verdict at k* under zero, mean and resample ablation"),
    ("head_scan.csv", "Single-head causal scan: each head masked alone"),
    ("design_space.csv", "Design space: accuracy drop when masking each variant's top-k"),
    ("sparsity.csv", "Sparsity"),
    ("stability.csv", "Stability: top-k overlap with the all-sample ranking"),
    ("token_stability.csv", "Stability: single random output token vs all output tokens"),
    ("transfer.csv", "Transfer between models sharing a backbone"),
    ("transfer_masking.csv", "Cross-masking at k*: accuracy drops"),
    ("cross_masking.csv", "Cross-masking k-sweep: own, transferred and random heads in each model"),
    ("vqa_summary.csv", "Cross-task VQA: top-k heads vs random and layer-matched head sets, per question kind"),
    ("timing.csv", "Time per step: seconds planned before the run, estimated when the step began, measured (the "
                   "last step up to this report)"),
)
POSITIVE_CONTROL = "positive_control"


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _figures(run: Path) -> list[tuple[str, bytes]]:
    """(caption, PNG) in reading order: what a reader looks for first, then the rest."""
    first, rest = [], []
    score_files = sorted(run.glob("scores-*.json"), key=lambda p: (len(p.stem), p.stem))  # the main model first
    if (run / "sweep_summary.csv").exists():
        summary = pd.read_csv(run / "sweep_summary.csv")
        first.append(("k-sweep", _png(plots.k_sweep_curve(summary))))
        rest.append(("failure decomposition", _png(plots.failure_bars(summary))))
    for path in score_files:
        scores = HeadScores.load(path)
        first.append((f"{path.stem} heatmap", _png(plots.score_heatmap(scores.scores, path.stem))))
        rest.append((f"{path.stem} distribution", _png(plots.score_distribution(scores.scores))))
    if (run / "head_scan.csv").exists():
        first.append(("score vs single-head damage",
                      _png(plots.score_damage_scatter(pd.read_csv(run / "head_scan.csv")))))
    for path in sorted((run / "overlays").glob("*.png")):
        first.append((f"attention overlay {path.stem}", path.read_bytes()))
    if (run / "design_space.csv").exists():
        rest.append(("design space", _png(plots.design_space_bars(pd.read_csv(run / "design_space.csv")))))
    if (run / "cross_masking.csv").exists():
        rest.append(("cross-model masking", _png(plots.cross_masking_curves(pd.read_csv(run / "cross_masking.csv")))))
    return first + rest


def read_grading(path: Path) -> pd.DataFrame:
    """``positive_control.grading_table`` of a ``grading.csv`` read back (its rank lists are stored as text)."""
    from vrh_interp.experiments.positive_control import grading_table

    grading = pd.read_csv(path)
    for column in ("planted_ranks", "decoy_ranks", "top"):
        if column in grading:
            grading[column] = grading[column].map(lambda v: ast.literal_eval(v) if isinstance(v, str) else v)
    return grading_table(grading)


def _positive_control(run: Path) -> tuple[str, pd.DataFrame] | None:
    """The positive control's sentence and grading table, when the run folder holds them."""
    folder = run / POSITIVE_CONTROL
    if not (folder / "positive_control.json").exists():
        return None
    from vrh_interp.experiments.positive_control import describe

    outcome = json.loads((folder / "positive_control.json").read_text(encoding="utf-8"))
    grading = read_grading(folder / "grading.csv") if (folder / "grading.csv").exists() else pd.DataFrame()
    return describe(outcome), grading


def _html_table(table: pd.DataFrame) -> str:
    return table.to_html(index=False, float_format=lambda v: f"{v:.3f}", classes="table", border=0)


def write_report(run: Path) -> dict[str, Path]:
    run = Path(run)
    if not run.is_dir():
        raise FileNotFoundError(f"run folder {run} does not exist")
    tables = [(title, _read_table(run / name)) for name, title in TABLES if (run / name).exists()]
    tables = [(title, table) for title, table in tables if not table.empty]
    figures = _figures(run)
    control = _positive_control(run)
    if not tables and not figures and control is None:
        raise FileNotFoundError(f"{run} holds no vrh-interp results (scores-*.json, sweep_summary.csv, ...)")
    figure_dir = run / "figures"
    figure_dir.mkdir(exist_ok=True)
    md = [f"# vrh-interp report: {run.name}", ""]
    body = [f"<h1>vrh-interp report: {html.escape(run.name)}</h1>"]
    if control is not None:
        sentence, grading = control
        md += ["## Positive control: the pipeline on a model whose retrieval heads are known", "", sentence, ""]
        body.append("<section id='positive-control'><h2>Positive control: the pipeline on a model whose retrieval "
                    f"heads are known</h2><p>{html.escape(sentence)}</p>")
        if not grading.empty:
            md += ["Detection graded against the planted heads:", "", markdown_table(grading), ""]
            body.append("<p>Detection graded against the planted heads:</p>" + _html_table(grading))
        body.append("</section>")
    verdicts = verdict_lines(pd.read_csv(run / "sweep_summary.csv")) if (run / "sweep_summary.csv").exists() else []
    if verdicts:
        md += ["## Verdict: top-k heads vs random head sets", "", *[f"- {line}" for line in verdicts], ""]
        body.append("<h2>Verdict: top-k heads vs random head sets</h2><ul>"
                    + "".join(f"<li>{html.escape(line)}</li>" for line in verdicts) + "</ul>")
    if figures:
        md += ["## Figures", ""]
        body.append("<h2>Figures</h2>")
    for name, png in figures:
        slug = "".join(c if c.isalnum() else "_" for c in name)
        (figure_dir / f"{slug}.png").write_bytes(png)
        md += [f"![{name}](figures/{slug}.png)", ""]
        data = base64.b64encode(png).decode()
        body.append(f"<figure><img alt='{html.escape(name)}' src='data:image/png;base64,{data}'/>"
                    f"<figcaption>{html.escape(name)}</figcaption></figure>")
    if tables:
        body.append("<h2>Tables</h2>")
    for index, (title, table) in enumerate(tables):
        md += [f"## {title}", "", markdown_table(table), ""]
        body.append(f"<details{' open' if index == 0 else ''}><summary>{html.escape(title)}</summary>"
                    f"{_html_table(table)}</details>")
    # wide tables (the sweep summaries) scroll inside their own box instead of widening the page
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;"
             "font-size:12px;display:block;overflow-x:auto}td,th{padding:2px 6px;border-bottom:1px solid #ddd}"
             "img{max-width:100%}summary{font-weight:bold;cursor:pointer;margin:0.8em 0}"
             "#positive-control{border-left:4px solid #4a4;padding-left:1em}")
    page = f"<!doctype html><html><head><meta charset='utf-8'><title>vrh-interp report</title><style>{style}</style>" \
           f"</head><body>{''.join(body)}</body></html>"
    (run / "report.html").write_text(page, encoding="utf-8")
    (run / "report.md").write_text("\n".join(md), encoding="utf-8")
    return {"html": run / "report.html", "markdown": run / "report.md"}


def _read_table(path: Path) -> pd.DataFrame:
    """A CSV read back; a sweep's ``seed`` and ``sets`` columns (empty where they do not apply: the baseline, the
    top-k, a single control set) show "-", not nan."""
    try:
        table = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()
    for column in ("seed", "sets"):
        if column in table:
            table[column] = table[column].map(lambda v: "-" if pd.isna(v) else str(v).removesuffix(".0"))
    return table


CONTROL_NAMES = {"random": "random", "matched": "layer-matched"}


def verdict_lines(summary: pd.DataFrame) -> list[str]:
    """One line per k > 0 with control sets: the top-k's accuracy against the unmasked baseline and each
    control's mean set accuracy, then the set-level verdict of ``experiments.sweep.summary_verdict`` (holds only
    when the drop is significant AND more harmful than the sets of every control, empirical p <= 0.05) and why."""
    from vrh_interp.experiments.sweep import summary_verdict

    baseline = summary[summary["condition"] == "baseline"]["accuracy"]
    base = f"{float(baseline.iloc[0]):.3f}" if len(baseline) else "n/a"
    lines = []
    for k in sorted(summary[summary["condition"] == "top"]["k"].unique()):
        judged = summary_verdict(summary, int(k), controls=None)
        controls = [f"{int(row['sets'])} {CONTROL_NAMES.get(kind, kind)} sets {float(row['accuracy']):.3f} "
                    f"(p={float(judged['target'][f'p_vs_{kind}']):.3g})"
                    for kind, row in judged["controls"].items() if row is not None]
        share = judged["target"].get("k_fraction", float("nan"))
        share = f" ({float(share):.1%} of the heads)" if pd.notna(share) else ""
        lines.append(f"k={int(k)}{share}: top-{int(k)} masked {float(judged['target']['accuracy']):.3f} vs unmasked "
                     f"{base}; {', '.join(controls) or 'no control sets'} -> {judged['verdict'].upper()} "
                     f"({judged['reason']})")
    return lines


SWEEP_COLUMNS = ("condition", "k", "seed", "sets", "n", "accuracy", "accuracy_ci_low", "accuracy_ci_high",
                 "p_value_vs_baseline", "p_vs_random", "p_vs_matched")


def compact_sweep_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The sweep summary for a terminal (under 100 columns): baseline, top-k and each control's distribution
    row (its per-set rows and the failure decomposition stay in ``sweep_summary.csv`` and the report)."""
    per_set = summary["condition"].isin(CONTROL_NAMES) & (summary["seed"].astype(str) != "all")
    table = summary[~per_set][[c for c in SWEEP_COLUMNS if c in summary]].copy()
    table["seed"] = table["seed"].map(lambda v: "-" if v is None or pd.isna(v) else v)
    table["sets"] = table["sets"].map(lambda v: "-" if pd.isna(v) else str(int(v)))
    return table.rename(columns={"condition": "heads masked", "accuracy_ci_low": "ci_low",
                                 "accuracy_ci_high": "ci_high", "p_value_vs_baseline": "p_vs_base"})


