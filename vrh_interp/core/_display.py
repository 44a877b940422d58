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
    return f"<div><b>{html.escape(title)}</b>{f'<table>{body}</table>' if body else ''}{table}</div>"


class Card:
    """Mixin: ``__repr__`` and ``_repr_html_`` from the class's ``_card()`` (a title and a few labelled rows), with
    ``_card_table()`` (HTML, e.g. ``DataFrame.to_html`` of a few rows) appended in the notebook."""

    def _card(self) -> tuple[str, list[tuple[str, str]]]:
        raise NotImplementedError

    def _card_table(self) -> str:
        return ""

    def __repr__(self) -> str:
        return card_text(*self._card())

    def _repr_html_(self) -> str:
        return card_html(*self._card(), table=self._card_table())


def shorten(text: object, width: int = 60) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    one = " ".join(str(text).split())
    return one if len(one) <= width else one[: width - 1] + "\u2026"


def mean_spread(values: object) -> str:
    """``mean 1.23 (min -0.5, max 2)`` of an array-like of numbers (``n/a`` when empty)."""
    import numpy as np

    array = np.asarray(values, dtype=float).ravel()
    if not array.size:
        return "n/a"
    return f"mean {array.mean():.3g} (min {array.min():.3g}, max {array.max():.3g})"
