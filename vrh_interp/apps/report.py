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
    ("verdicts.csv", "The claims table with every column (rules, p-values, items needed)"),
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
    if control is not None:  # one line above the answer; the grading goes to the details
        outcome = json.loads((run / "positive_control" / "positive_control.json").read_text(encoding="utf-8"))
        line = (f"Positive control ({outcome['model']}): {outcome['verdict']} (causal claim on the planted heads: "
                f"{outcome['causal_verdict']}).")
        from vrh_interp.experiments.positive_control import transfer_line

        transfers = [transfer_line(row) for row in outcome.get("transfer", [])]
        md += [f"**{line}**", "", *[f"- {t}" for t in transfers], *([""] if transfers else [])]
        body.append(f"<p id='positive-control'><b>{html.escape(line)}</b>"
                    + "".join(f"<br>{html.escape(t)}" for t in transfers) + "</p>")
    claims = run / "verdicts.csv"
    if claims.exists():
        claim_md, claim_html = claims_sections(pd.read_csv(claims))
        md += claim_md
        body += claim_html
    verdicts = [] if claims.exists() else verdict_lines(sweep_result(run))
    if verdicts:
        md += ["## Verdict: top-k heads vs control head sets", "", *[f"- {line}" for line in verdicts], ""]
        body.append("<h2>Verdict: top-k heads vs control head sets</h2><ul>"
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
    if control is not None:
        sentence, grading = control
        md += ["## Positive control: the pipeline on a model whose retrieval heads are known", "", sentence, ""]
        details = f"<p>{html.escape(sentence)}</p>"
        if not grading.empty:
            md += ["Detection graded against the planted heads:", "", markdown_table(grading), ""]
            details += "<p>Detection graded against the planted heads:</p>" + _html_table(grading)
        body.append(f"<details><summary>Positive control: details</summary>{details}</details>")
    for title, table in tables:  # the details, collapsed: the answer is above
        md += [f"## {title}", "", markdown_table(table), ""]
        body.append(f"<details><summary>{html.escape(title)}</summary>{_html_table(table)}</details>")
    # wide tables (the sweep summaries) scroll inside their own box instead of widening the page
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;"
             "font-size:12px;display:block;overflow-x:auto}td,th{padding:2px 6px;border-bottom:1px solid #ddd}"
             "img{max-width:100%}summary{font-weight:bold;cursor:pointer;margin:0.8em 0}"
             "#positive-control{border-left:4px solid #4a4;padding-left:1em}"
             ".badge{color:#fff;border-radius:4px;padding:1px 6px;font-weight:bold;white-space:nowrap}"
             "table.claims{display:table;font-size:13px}")
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


CONTROL_NAMES = {"random": "random", "matched": "layer-matched", "live": "live-head"}


def sweep_result(run: Path) -> Any:
    """The k-sweep records of a run folder (``run/sweep`` of a demo, or a ``vrh sweep`` folder itself), None
    where there are none."""
    from vrh_interp.experiments.declared import experiment

    declared = experiment("sweep")  # its record log and the function reading a finished folder
    for folder in (Path(run) / "sweep", Path(run)):
        if (folder / "manifest.json").exists() and declared.log_path(folder).exists():
            try:
                return declared.resolve("summary")(folder)
            except (ValueError, KeyError):
                continue
    return None


def verdict_lines(result: Any) -> list[str]:
    """One line per k > 0 of a k-sweep (``SweepResult``): the causal claim at that k judged by the claims rules
    (``experiments.verdicts.sweep_claims``: holds / does not hold / inconclusive with the items that would decide
    it, Bonferroni over the k values)."""
    from vrh_interp.experiments.verdicts import sweep_claims

    if result is None:
        return []
    return claim_lines(sweep_claims(result))


def claim_lines(table: pd.DataFrame) -> list[str]:
    """One line per row of a claims table (``claims.judge``): claim, verdict, why, the numbers."""
    return [f"{row.claim} -> {str(row.verdict).upper()} ({row.reason}; {row.numbers})" for row in table.itertuples()]


VERDICT_COLOURS = {"holds": "#1a7f37", "does not hold": "#cf222e", "inconclusive": "#9a6700",
                   "not measured": "#6e7781"}


def claims_sections(table: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The claims tables (``verdicts.csv``) as Markdown lines and HTML: the paper's claims, then the checks of
    the method, each row a verdict badge, the claim, the estimate with its 90 % interval and the reason."""
    md, body = [], []
    from vrh_interp.evaluation.claims import TABLES

    for name, heading in TABLES:
        part = table[table["table"] == name] if "table" in table else pd.DataFrame()
        if part.empty:
            continue
        md += [f"## {heading}", "", "| verdict | claim | estimate [90% interval] | why |", "|---|---|---|---|"]
        rows = []
        for row in part.to_dict(orient="records"):
            estimate = "" if pd.isna(row.get("estimate")) else (
                f"{row['estimate']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]")
            why = "" if pd.isna(row.get("reason")) else str(row.get("reason") or "").replace("|", "/")
            md.append(f"| **{str(row['verdict']).upper()}** | {row['claim']} | {estimate} | {why} |")
            colour = VERDICT_COLOURS.get(str(row["verdict"]), "#6e7781")
            numbers = "" if pd.isna(row.get("numbers")) else str(row.get("numbers"))
            rows.append(f"<tr><td><span class='badge' style='background:{colour}'>{html.escape(str(row['verdict']))}"
                        f"</span></td><td>{html.escape(str(row['claim']))}</td><td>{html.escape(estimate)}</td>"
                        f"<td>{html.escape(why)}<br><small>{html.escape(numbers)}</small>"
                        "</td></tr>")
        md.append("")
        body.append(f"<h2>{heading}</h2><table class='claims'><tr><th>verdict</th><th>claim</th>"
                    f"<th>estimate [90% interval]</th><th>why</th></tr>{''.join(rows)}</table>")
    return md, body


SWEEP_COLUMNS = ("condition", "k", "seed", "sets", "n", "accuracy", "accuracy_ci_low", "accuracy_ci_high",
                 "p_value_vs_baseline", "p_vs_random", "p_vs_matched", "p_vs_live")


def compact_sweep_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The sweep summary for a terminal (under 100 columns): baseline, top-k and each control's distribution
    row (its per-set rows and the failure decomposition stay in ``sweep_summary.csv`` and the report)."""
    per_set = summary["condition"].isin(CONTROL_NAMES) & (summary["seed"].astype(str) != "all")
    table = summary[~per_set][[c for c in SWEEP_COLUMNS if c in summary]].copy()
    table["seed"] = table["seed"].map(lambda v: "-" if v is None or pd.isna(v) else v)
    table["sets"] = table["sets"].map(lambda v: "-" if pd.isna(v) else str(int(v)))
    return table.rename(columns={"condition": "heads masked", "accuracy_ci_low": "ci_low",
                                 "accuracy_ci_high": "ci_high", "p_value_vs_baseline": "p_base",
                                 "p_vs_random": "p_random", "p_vs_matched": "p_matched", "p_vs_live": "p_live"})


