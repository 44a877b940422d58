"""``vrh report RUN_FOLDER``: one self-contained HTML page (figures embedded) and a Markdown summary.

The report reads whatever artifacts the run folder holds (``scores-*.json``, ``sweep_summary.csv``,
``design_space.csv``, ``sparsity.csv``, ``stability.csv``, ``token_stability.csv``, ``transfer*.csv``,
``cross_masking.csv``, ``vqa_summary.csv``, ``verdicts.csv``) and skips what is absent, so it works for a detect-only run as
for a full demo. Sweep tables keep one row per control head set; the ``seed="all"`` rows hold the sets'
distribution (mean, sd, quantiles, two-level bootstrap interval) and the top-k rows their empirical p-values
against each control, which the k-sweep figure draws as bands.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

import pandas as pd

from vrh_interp import plots
from vrh_interp.scoring.scores import HeadScores

TABLES = (
    ("verdicts.csv", "The paper's claims on this model"),
    ("sweep_summary.csv", "Causal k-sweep: top-k heads vs random and layer-matched head sets"),
    ("design_space.csv", "Design space: accuracy drop when masking each variant's top-k"),
    ("sparsity.csv", "Sparsity"),
    ("stability.csv", "Stability: top-k overlap with the all-sample ranking"),
    ("token_stability.csv", "Stability: single random output token vs all output tokens"),
    ("transfer.csv", "Transfer between models sharing a backbone"),
    ("transfer_masking.csv", "Cross-masking at k*: accuracy drops"),
    ("cross_masking.csv", "Cross-masking k-sweep: own, transferred and random heads in each model"),
    ("vqa_summary.csv", "Cross-task VQA: top-k heads vs random and layer-matched head sets, per question kind"),
)


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _figures(run: Path) -> list[tuple[str, bytes]]:
    figures = []
    for path in sorted(run.glob("scores-*.json")):
        scores = HeadScores.load(path)
        figures.append((f"{path.stem} heatmap", _png(plots.score_heatmap(scores.scores, path.stem))))
        figures.append((f"{path.stem} distribution", _png(plots.score_distribution(scores.scores))))
    if (run / "sweep_summary.csv").exists():
        summary = pd.read_csv(run / "sweep_summary.csv")
        figures.append(("k-sweep", _png(plots.k_sweep_curve(summary))))
        figures.append(("failure decomposition", _png(plots.failure_bars(summary))))
    if (run / "design_space.csv").exists():
        figures.append(("design space", _png(plots.design_space_bars(pd.read_csv(run / "design_space.csv")))))
    if (run / "cross_masking.csv").exists():
        figures.append(("cross-model masking", _png(plots.cross_masking_curves(pd.read_csv(run / "cross_masking.csv")))))
    return figures


def write_report(run: Path) -> dict[str, Path]:
    run = Path(run)
    if not run.is_dir():
        raise FileNotFoundError(f"run folder {run} does not exist")
    tables = [(title, _read_table(run / name)) for name, title in TABLES if (run / name).exists()]
    tables = [(title, table) for title, table in tables if not table.empty]
    figures = _figures(run)
    if not tables and not figures:
        raise FileNotFoundError(f"{run} holds no vrh-interp results (scores-*.json, sweep_summary.csv, ...)")
    figure_dir = run / "figures"
    figure_dir.mkdir(exist_ok=True)
    md = [f"# vrh-interp report: {run.name}", ""]
    body = [f"<h1>vrh-interp report: {html.escape(run.name)}</h1>"]
    for title, table in tables:
        md += [f"## {title}", "", markdown_table(table), ""]
        body.append(f"<h2>{html.escape(title)}</h2>" + table.to_html(index=False, float_format=lambda v: f"{v:.3f}",
                                                                      classes="table", border=0))
    for name, png in figures:
        slug = "".join(c if c.isalnum() else "_" for c in name)
        (figure_dir / f"{slug}.png").write_bytes(png)
        md += [f"![{name}](figures/{slug}.png)", ""]
        data = base64.b64encode(png).decode()
        body.append(f"<figure><img alt='{html.escape(name)}' src='data:image/png;base64,{data}'/>"
                    f"<figcaption>{html.escape(name)}</figcaption></figure>")
    # wide tables (the sweep summaries) scroll inside their own box instead of widening the page
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;"
             "font-size:12px;display:block;overflow-x:auto}td,th{padding:2px 6px;border-bottom:1px solid #ddd}"
             "img{max-width:100%}")
    page = f"<!doctype html><html><head><meta charset='utf-8'><title>vrh-interp report</title><style>{style}</style>" \
           f"</head><body>{''.join(body)}</body></html>"
    (run / "report.html").write_text(page, encoding="utf-8")
    (run / "report.md").write_text("\n".join(md), encoding="utf-8")
    return {"html": run / "report.html", "markdown": run / "report.md"}


def _read_table(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def markdown_table(table: pd.DataFrame) -> str:
    """A DataFrame as a Markdown table (3 decimals); plain text when ``tabulate`` is not installed."""
    if _has_tabulate():
        return table.to_markdown(index=False, floatfmt=".3f")
    return "```\n" + table.to_string(index=False, float_format=lambda v: f"{v:.3f}") + "\n```"


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True
