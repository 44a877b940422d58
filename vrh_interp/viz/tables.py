"""Tables as Markdown (reports, docs pages, study summaries)."""

from __future__ import annotations

import pandas as pd


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
