"""argparse types every command line shares (``vrh`` and its subcommands, the toy trainer): torch-free, so a
mistyped number is refused before anything heavy loads."""

from __future__ import annotations

import argparse
from typing import Callable


def whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """argparse type: a whole number in ``minimum`` .. ``maximum`` (``--top -5`` is an error, not "all but five")."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number") from None
        if value < minimum or (maximum is not None and value > maximum):
            bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
            size = "too small" if value < minimum else "too large"
            raise argparse.ArgumentTypeError(f"{value} is {size}: use a whole number {bounds}")
        return value
    return parse
