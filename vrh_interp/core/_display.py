"""Compact displays of the library's objects in a REPL or a notebook: a title and a few labelled rows, as text
(``__repr__``) and as an HTML table (``_repr_html_``, which Jupyter shows instead of the text)."""

from __future__ import annotations

import html
from typing import Sequence

Rows = Sequence[tuple[str, str]]


def card_text(title: str, rows: Rows) -> str:
    """``title`` then one indented ``label: value`` line per row."""
    return "\n".join([title, *(f"  {label}: {value}" for label, value in rows)])


def card_html(title: str, rows: Rows, table: str = "") -> str:
    """The rows as a two-column HTML table under a bold ``title``; ``table``: HTML appended below (escaped by the
    caller, e.g. ``DataFrame.to_html``)."""
    body = "".join(f"<tr><th style='text-align:left'>{html.escape(label)}</th>"
                   f"<td style='text-align:left'>{html.escape(value)}</td></tr>" for label, value in rows)
    return f"<div><b>{html.escape(title)}</b><table>{body}</table>{table}</div>"
