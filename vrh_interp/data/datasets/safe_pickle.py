"""Reading the ``refer`` toolkit's ``refs(*).p`` pickles without letting them run code.

A pickle is a program: ``pickle.load`` imports and calls whatever globals the file names (``os.system``
included). The refs files hold only lists, dicts, strings and numbers, which the pickle format encodes with
dedicated opcodes that need no global at all, so ``load_plain_pickle`` refuses EVERY global lookup
(``find_class``) and every persistent id: a file that tries to call anything fails with ``UnsafePickleError``
before the call happens. The files were written by Python 2; byte strings are decoded as UTF-8 (undecodable
bytes replaced) so that Python 2 ``str`` values come back as ``str``.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, NoReturn


class UnsafePickleError(pickle.UnpicklingError):
    """The pickle asked for a global (a class or function), which plain data never needs."""


class PlainDataUnpickler(pickle.Unpickler):
    """Admits only what pickle encodes without globals: None, bools, numbers, strings, bytes, lists, tuples, dicts."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise UnsafePickleError(
            f"refusing to load global {module}.{name}: this file should hold only plain lists, dicts, strings "
            "and numbers, and a pickle that names a class or function can run code when loaded"
        )

    def persistent_load(self, pid: Any) -> NoReturn:
        raise UnsafePickleError(f"refusing persistent id {pid!r}: plain data has none")


def load_plain_pickle(path: str | Path) -> Any:
    path = Path(path)
    with open(path, "rb") as handle:
        try:
            return PlainDataUnpickler(handle, encoding="utf-8", errors="replace").load()
        except UnsafePickleError as error:
            raise UnsafePickleError(f"{path}: {error}") from None
        except (pickle.UnpicklingError, EOFError, ValueError, MemoryError, TypeError, AttributeError,
                LookupError) as error:
            # a malformed file fails in many ways: a length field larger than memory (MemoryError), an opcode
            # applied to the wrong kind of object (TypeError, AttributeError, IndexError), a missing memo entry
            raise pickle.UnpicklingError(f"{path}: not a readable pickle ({type(error).__name__}: {error})") from error
