"""``--ks``: k values as head counts and/or percentages of all heads (``"0,1%,2.5%,5"``), parsed without torch (the
CLI checks the syntax before a model loads; import ``parse_ks`` and ``KSpecError`` from here)."""

from __future__ import annotations

import math
from numbers import Real
from typing import Any, Iterable


class KSpecError(ValueError):
    """A ``--ks`` list that cannot be read as head counts / percentages."""


def parse_ks(text: str | Iterable[int | str], total_heads: int) -> list[int]:
    """k values as head counts from counts and/or percentages of all heads: ``"0,1%,2.5%,5"``.

    A percentage p of N heads becomes round(p / 100 * N) rounded half up (``floor(x + 0.5)``, not Python's
    banker's rounding), but at least 1 for a positive percentage (a positive fraction never means "mask
    nothing"); plain numbers are counts. Values that map to the same count are kept once; the result is
    sorted. Percentages above 100, negative values and non-integer counts are errors.
    """
    items = [t.strip() for t in text.split(",")] if isinstance(text, str) else list(text)
    if isinstance(text, str) and not any(items):
        raise KSpecError(f"no k values in {text!r}: write head counts and/or percentages, e.g. 0,1,5 or 0,1%,2.5%")
    counts = []
    for item in items:
        if isinstance(item, str) and item.endswith("%"):
            try:
                percent = float(item[:-1])
            except ValueError:
                raise KSpecError(f"k value {item!r} is not a percentage such as '2.5%'") from None
            if not 0 <= percent <= 100:
                raise KSpecError(f"k value {item!r} is not between 0% and 100% of the heads")
            count = math.floor(percent / 100 * total_heads + 0.5)
            counts.append(max(1, count) if percent > 0 else 0)
        else:
            try:
                value = float(item)
                int(value)  # inf: OverflowError, nan: ValueError
            except (TypeError, ValueError, OverflowError):
                raise KSpecError(f"k value {item!r} is neither a head count nor a percentage such as '2.5%'") from None
            if value != int(value) or value < 0:
                raise KSpecError(f"k value {item!r} is not a head count (a whole number >= 0); write fractions of "
                                 "all heads as percentages, e.g. '2.5%'")
            counts.append(int(value))
    return sorted(set(counts))


def check_ks(ks: Any, argument: str = "ks") -> None:
    """Refuse a ``ks`` that is not a list of k values (None, one number, a mapping) in one line naming the fix."""
    if ks is None:
        raise KSpecError(f"{argument} is None: pass head counts and/or percentages, e.g. {argument}=[0, 1, 3] or "
                         f"{argument}='0,1%,2.5%'")
    if isinstance(ks, Real) and not isinstance(ks, bool):
        raise KSpecError(f"{argument}={ks!r} is one number: {argument} is a list of k values, e.g. {argument}=[{ks}] "
                         f"(that k alone, with the baseline) or {argument}=[0, 1, {ks}]")
    if isinstance(ks, (bytes, dict, bool)) or not isinstance(ks, (str, Iterable)):
        raise KSpecError(f"{argument}={ks!r} ({type(ks).__name__}) is not a list of k values: pass e.g. "
                         f"{argument}=[0, 1, 3] or {argument}='0,1%,2.5%'")


PAPER_FRACTION_RANGE = (0.017, 0.026)  # 20 of 1152 .. 20 of 784 heads: the paper's top 20 on its models
DEMO_GRID = ("0.5%", "1%", "1.7%", "2.6%", "5%", "10%")


def demo_ks(total_heads: int) -> tuple[list[int], int]:
    """``(ks, k_star)`` for a model with ``total_heads`` heads: the grid ``DEMO_GRID`` of all heads, capped at a
    quarter of them, and k*, the count inside the paper's ``PAPER_FRACTION_RANGE`` nearest its middle (at least 1
    head). The demo judges its claims at k*; ``vrh patch`` studies the top k* heads by default."""
    low = math.ceil(PAPER_FRACTION_RANGE[0] * total_heads)
    high = math.floor(PAPER_FRACTION_RANGE[1] * total_heads)
    middle = sum(PAPER_FRACTION_RANGE) / 2 * total_heads
    if low <= high:
        k_star = min(range(low, high + 1), key=lambda k: (abs(k - middle), k))
    else:
        k_star = max(1, math.floor(middle + 0.5))
    cap = max(1, total_heads // 4)
    ks = sorted({0, k_star, *(k for k in parse_ks(DEMO_GRID, total_heads) if k <= cap)})
    return ks, k_star
