"""Errors that name the file and the row, and the raise-or-skip policy for unusable rows.

Every loader reports an unusable row (missing or corrupt image, box outside its image, a field of the wrong
type) as a ``DatasetError`` whose message starts with where it happened, ``FILE row N`` (``FILE line N`` for
CSV, ``FILE item N`` for JSON lists), and file-level problems (unknown column layout, empty split) with the
file alone. With ``on_error="skip"`` a loader drops unusable rows and lists each one, with its reason, in
``SampleSet.skipped``; file-level problems always raise.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Literal

OnError = Literal["raise", "skip"]
ON_ERROR_CHOICES: tuple[str, ...] = ("raise", "skip")


class DatasetError(ValueError):
    """A data file, or one row of it, that cannot be used; ``where`` names the file (and row)."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


@dataclass(frozen=True)
class SkippedRow:
    where: str
    reason: str


class RowErrors:
    """What one load call does with unusable rows: raise at the first, or skip and list them."""

    def __init__(self, on_error: OnError) -> None:
        if on_error not in ON_ERROR_CHOICES:
            raise ValueError(f"on_error must be one of {ON_ERROR_CHOICES}, got {on_error!r}")
        self.on_error = on_error
        self.skipped: list[SkippedRow] = []

    @contextmanager
    def row(self, where: str) -> Iterator[None]:
        """Run the body for one row; a data error inside it is raised (naming ``where``) or skipped."""
        try:
            yield
        except DatasetError as error:
            self.reject(error)
        except KeyError as error:
            self.reject(DatasetError(where, f"missing field {error}"))
        except (IndexError, TypeError, ValueError, OverflowError, json.JSONDecodeError) as error:
            self.reject(DatasetError(where, f"{type(error).__name__}: {error}"))

    def reject(self, error: DatasetError) -> None:
        """Raise ``error``, or record its row as skipped."""
        if self.on_error == "raise":
            raise error
        self.skipped.append(SkippedRow(error.where, error.reason))
