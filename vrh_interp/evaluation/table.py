"""A claims table that shows itself: ``ClaimsTable`` wraps the frame ``evaluation.claims.judge`` returns (what
``SweepResult.claims()`` gives) so that a notebook displays it WHOLE, as an HTML table of verdict, claim, estimate
with its interval and the full reason (no column cut off, long text wrapped), a REPL shows one line per claim, and
``print(table)`` gives the terminal text of ``vrh sweep`` / ``vrh report`` (``claims.claims_text``). ``frame``
holds every column (``p``, ``p_adjusted``, ``rule``, ...); ``table["verdict"]`` reads a column as on the frame."""

from __future__ import annotations

import html
import math
from typing import Any, Iterator

import pandas as pd

from vrh_interp.evaluation.claims import TABLES, claims_text

MAX_REPR_CLAIMS = 12  # the text repr stays within 15 lines: a title, these, and one line saying how many more
VERDICT_COLOURS = {"holds": "#1a7f37", "fails": "#cf222e", "inconclusive": "#9a6700"}
TABLE_HEADINGS = dict(TABLES)


def _number(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number


def estimate_text(row: dict[str, Any]) -> str:
    """``0.123 [0.05, 0.2]``: the estimate and its interval (90 %), ``-`` where the claim has no estimate."""
    estimate, low, high = (_number(row.get(key)) for key in ("estimate", "ci_low", "ci_high"))
    if math.isnan(estimate):
        return "-"
    interval = f" [{low:.3g}, {high:.3g}]" if not (math.isnan(low) or math.isnan(high)) else ""
    return f"{estimate:.3g}{interval}"


class ClaimsTable:
    """The claims table (module doc): ``frame`` (every column), ``text()`` (the terminal form), a one-line-per-claim
    ``repr`` and a whole HTML table in a notebook."""

    def __init__(self, frame: pd.DataFrame, title: str = "Claims") -> None:
        self.frame = frame
        self.title = title

    def __len__(self) -> int:
        return len(self.frame)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """One dict per claim (a row of ``frame``)."""
        return iter(self.frame.to_dict(orient="records"))

    def __getitem__(self, column: Any) -> Any:
        return self.frame[column]

    def _count(self) -> str:
        return f"{len(self)} claim{'' if len(self) == 1 else 's'}"

    def to_frame(self) -> pd.DataFrame:
        return self.frame.copy()

    def text(self, width: int = 100) -> str:
        """The terminal text: per claim its verdict and words, then the reason and numbers, wrapped."""
        return claims_text(self.frame, width)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        """A title and one line per claim (verdict, id, estimate): at most 15 lines; ``print(table)`` for reasons."""
        rows = list(self)
        lines = [f"{self.title}: {self._count()} (print(...) for the reasons, .frame for every column)"]
        for row in rows[:MAX_REPR_CLAIMS]:
            lines.append(f"  {str(row.get('verdict', '')).upper():<13} {row.get('id', '')}: {estimate_text(row)}")
        if len(rows) > MAX_REPR_CLAIMS:
            lines.append(f"  ... {len(rows) - MAX_REPR_CLAIMS} more")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """Every claim, every word: verdict, claim, estimate [interval], reason (and its numbers), wrapped."""
        cell = "style='text-align:left;vertical-align:top;white-space:normal;word-break:normal'"
        head = "".join(f"<th {cell}>{name}</th>" for name in ("verdict", "claim", "estimate [90% interval]",
                                                               "reason"))
        body, tables = [], list(dict.fromkeys(self.frame["table"])) if "table" in self.frame else [None]
        for table in tables:
            part = self.frame if table is None else self.frame[self.frame["table"] == table]
            if len(tables) > 1:
                body.append(f"<tr><th colspan='4' {cell}>{html.escape(TABLE_HEADINGS.get(table, str(table)))}</th>"
                            "</tr>")
            for row in part.to_dict(orient="records"):
                verdict = str(row.get("verdict", ""))
                colour = VERDICT_COLOURS.get(verdict, "#57606a")
                badge = (f"<span style='color:white;background:{colour};padding:1px 6px;border-radius:8px;"
                         f"white-space:nowrap'>{html.escape(verdict)}</span>")
                numbers = row.get("numbers")
                reason = html.escape(str(row.get("reason", "")))
                if numbers:
                    reason += f"<br><small>{html.escape(str(numbers))}</small>"
                body.append(f"<tr><td {cell}>{badge}</td><td {cell}>{html.escape(str(row.get('claim', '')))}</td>"
                            f"<td {cell}>{html.escape(estimate_text(row))}</td><td {cell}>{reason}</td></tr>")
        return (f"<div><b>{html.escape(self.title)}</b> ({self._count()}; <code>.frame</code> for every column)"
                f"<table style='table-layout:auto;width:100%'><tr>{head}</tr>{''.join(body)}</table></div>")
