"""Paths given for an option (a CLI flag or an API argument), checked before any work: one clear error naming
the option and the path instead of an OS error (``[Errno 21] Is a directory``) minutes into a run.

Each check only asks the file system (``stat``, ``access``), reads nothing and creates nothing, and imports
nothing heavy, so the CLI runs them before torch loads. ``output_folder`` is a folder that will be created or
written (a run folder), ``input_file`` / ``input_folder`` / ``input_path`` one that must exist and be readable.
An empty path is refused everywhere: ``Path("")`` is the current directory, which is never what an empty
(unset) shell variable meant. As root, permission bits do not apply; ``access`` still reports a read-only
file system or an immutable folder.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class PathOptionError(ValueError):
    """A path given for an option that cannot be used; the message names the option, the path and the fix."""


def _text(path: str | os.PathLike[str], option: str) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise PathOptionError(f"{option} must be a path, got {type(path).__name__} {path!r}")
    text = os.fspath(path)
    if not isinstance(text, str):  # bytes paths
        raise PathOptionError(f"{option} must be a text path, got {text!r}")
    if not text.strip():
        raise PathOptionError(f"{option} {text!r} is an empty path (an unset shell variable?): pass a path; "
                              "for the current folder write '.'")
    if "\x00" in text:
        raise PathOptionError(f"{option} {text!r} contains a NUL character: pass a path")
    return text


def _stat(text: str, option: str) -> os.stat_result | None:
    """``os.stat`` of ``text`` (following symlinks); None when nothing is there; errors named."""
    try:
        return os.stat(text)
    except FileNotFoundError:
        if os.path.islink(text):
            raise PathOptionError(f"{option} {text!r} is a symlink to {os.readlink(text)!r}, which does not "
                                  "exist: fix or remove the link") from None
        return None
    except NotADirectoryError:
        raise PathOptionError(f"{option} {text!r}: {_file_ancestor(text)!r} is a file, not a folder, so nothing "
                              "can be inside it: pass another path") from None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise PathOptionError(f"{option} {text!r} is a symlink loop (it points back to itself): remove the "
                                  "link or pass another path") from None
        if error.errno == errno.ENAMETOOLONG:
            raise PathOptionError(f"{option} {text[:80]!r}...: the path is too long for this file system") from None
        raise PathOptionError(f"{option} {text!r}: cannot look it up ({error.strerror})") from None


def _file_ancestor(text: str) -> str:
    """The first ancestor of ``text`` that exists and is not a folder."""
    for parent in Path(text).parents:
        if parent.exists() and not parent.is_dir():
            return str(parent)
    return text


def output_folder(path: str | os.PathLike[str], option: str = "--out") -> Path:
    """A folder the caller will create or write into: not empty, not a file (or a link to one), not a symlink
    loop, inside a folder (and not a file) with write permission."""
    text = _text(path, option)
    found = _stat(text, option)
    if found is not None:
        if not stat.S_ISDIR(found.st_mode):
            raise PathOptionError(f"{option} {text!r} is a file, not a folder: pass a folder (a new name is "
                                  "created)")
        if not os.access(text, os.W_OK | os.X_OK):
            raise PathOptionError(f"{option} {text!r}: no permission to write in this folder: make it writable "
                                  f"or pass another {option}")
        foreign = _foreign_entries(text)
        if foreign:
            real = os.path.realpath(text)
            where = f" (a link to {real})" if real != os.path.abspath(text) else ""
            raise PathOptionError(
                f"{option} {text!r}{where} is a folder that no vrh run made (no {', '.join(RUN_MARKERS)} in it; it "
                f"holds {', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}): vrh writes its files only into "
                f"a new or empty folder or one of its own run folders: pass another {option}")
        return Path(text)
    parent = Path(os.path.abspath(text)).parent
    while not parent.exists() and parent != parent.parent:  # the folder is created with its missing parents
        parent = parent.parent
    if not parent.is_dir():
        raise PathOptionError(f"{option} {text!r}: {parent} is a file, not a folder: pass another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PathOptionError(f"{option} {text!r}: no permission to create it in {parent}: pass a folder you "
                              f"can write, e.g. {option} ~/vrh-runs/NAME")
    return Path(text)


RUN_MARKERS = ("manifest.json", "plan.json", "grid.json", "run.lock")
"""Files every vrh run folder holds one of (a run's manifest, the demo's plan, a grid's plan, the run lock)."""


def _foreign_entries(folder: str) -> list[str]:
    """The visible entries of an existing folder that is neither empty nor a vrh run folder (a marker of
    ``RUN_MARKERS`` or a ``.jsonl`` record log in it, or a marker in one of its subfolders), sorted; [] where vrh may
    write into it."""
    try:
        entries = sorted(e for e in os.listdir(folder) if not e.startswith("."))
    except OSError:
        return []
    if not entries:
        return []
    for entry in entries:
        if entry in RUN_MARKERS or entry.endswith(".jsonl"):  # a record log: a run torn before its manifest
            return []
        inner = os.path.join(folder, entry)
        if os.path.isdir(inner) and any(os.path.exists(os.path.join(inner, m)) for m in RUN_MARKERS):
            return []
    return entries


def _existing(path: str | os.PathLike[str], option: str, what: str) -> tuple[str, os.stat_result]:
    text = _text(path, option)
    found = _stat(text, option)
    if found is None:
        raise PathOptionError(f"{option} {text!r}: the {what} does not exist (check the path)")
    return text, found


def _readable(text: str, option: str, mode: int) -> None:
    if not os.access(text, mode):
        raise PathOptionError(f"{option} {text!r}: no permission to read it")


def input_file(path: str | os.PathLike[str], option: str, what: str = "file") -> Path:
    """An existing, readable file (not a folder)."""
    text, found = _existing(path, option, what)
    if stat.S_ISDIR(found.st_mode):
        raise PathOptionError(f"{option} {text!r} is a folder, not a {what}: pass the file itself")
    _readable(text, option, os.R_OK)
    return Path(text)


def input_folder(path: str | os.PathLike[str], option: str, what: str = "folder") -> Path:
    """An existing folder whose entries can be listed and read."""
    text, found = _existing(path, option, what)
    if not stat.S_ISDIR(found.st_mode):
        raise PathOptionError(f"{option} {text!r} is a file, not a {what}: pass the folder")
    _readable(text, option, os.R_OK | os.X_OK)
    return Path(text)


def input_path(path: str | os.PathLike[str], option: str, what: str = "file or folder") -> Path:
    """An existing, readable file or folder."""
    text, found = _existing(path, option, what)
    _readable(text, option, os.R_OK | (os.X_OK if stat.S_ISDIR(found.st_mode) else 0))
    return Path(text)
