"""Run folders that survive interruption.

A long operation (detection, sweeps, design-space searches) writes one record per finished unit of work
(sample, or sample x condition) as it goes, to an append-only JSONL log; each line is flushed and
fsynced before the next unit starts. Rerunning the same command on the same folder reads the log,
skips what is done and continues, so a run killed at any point and resumed yields exactly the records an
uninterrupted run yields (units are deterministic given the seed; records are keyed and deduplicated).
A torn last line (killed mid-write) is dropped on read and truncated when the folder is reopened for writing.

Records are de-duplicated by their unit key (``key_fields``, given by the code that writes the log: each
experiment declares its own, ``vrh_interp.experiments.declared``) on read: an exact repeat is dropped, a repeat
with different content is refused (``RunRecordError`` naming both lines), and so is an unreadable line
anywhere but last: counting a unit twice, or silently skipping one, would change the result.

One writer per folder: ``RunFolder`` takes an exclusive ``fcntl.flock`` on ``run.lock`` (re-entrant within a
process, released when the last ``RunFolder`` on it is gone, and by the kernel when the process dies, so a
crash never leaves a stale lock); a second process is refused with ``RunLockedError`` naming the holder (PID,
host, start time, command). The lock file is emptied on a clean release.

``manifest.json`` holds the configuration that produced the records (model, data, design, seeds, library
versions); reopening a folder with a different configuration is refused with the differing keys named,
because mixing records of two configurations would silently corrupt the table. A shard's folder (``--shard
i/n``) records the whole run's configuration plus a ``"shard"`` entry; ``vrh_interp.experiments.merge`` joins shard
folders.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import sys
import time
import weakref
from pathlib import Path
from typing import Any, Iterable, Mapping

from vrh_interp.core.bookkeeping import paths

LOCK_FILE = "run.lock"


class RunMismatchError(RuntimeError):
    """A run folder was made by a different model or configuration."""


class RunLockedError(RuntimeError):
    """Another process is writing the run folder."""


class RunRecordError(ValueError):
    """A record log holds an unreadable line (not the torn last one) or two different records of one unit."""


class RunManifestError(ValueError):
    """A run folder's ``manifest.json`` that cannot be read, or that describes another kind of run."""


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object in ``path`` (a run folder's manifest); ``RunManifestError`` naming the file when it is not
    UTF-8 JSON holding an object (a manifest damaged by hand or by a copy cut short)."""
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise RunManifestError(f"{path} is damaged ({type(error).__name__}: {error}): restore it from the run that "
                               "wrote it, or start over in a new --out folder") from None
    if not isinstance(config, dict):
        raise RunManifestError(f"{path} is damaged: it holds {type(config).__name__}, not a JSON object; start over "
                               "in a new --out folder")
    return config


class _FolderLock:
    """An exclusive ``flock`` on ``FOLDER/run.lock``, shared by every ``RunFolder`` on it in this process."""

    _held: "weakref.WeakValueDictionary[str, _FolderLock]" = weakref.WeakValueDictionary()

    def __init__(self, folder: Path) -> None:
        path = folder / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLockedError(f"run folder {folder} is in use by another run ({_holder(path)}). Wait for it to "
                                 "finish, or use another --out folder: two runs writing one folder would duplicate "
                                 "its records") from None
        owner = {"pid": os.getpid(), "host": socket.gethostname(),
                 "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "command": " ".join(sys.argv)[:300]}
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(owner).encode())
        except OSError as error:  # e.g. a full disk: release at once
            os.close(fd)
            raise _naming(error, path)
        weakref.finalize(self, _release, fd)

    @classmethod
    def acquire(cls, folder: Path) -> "_FolderLock":
        key = os.path.realpath(folder)
        lock = cls._held.get(key)
        if lock is None:
            lock = cls._held[key] = cls(folder)
        return lock


def _release(fd: int) -> None:
    os.ftruncate(fd, 0)  # still holding the lock: an empty file names no owner
    os.close(fd)


HOLDER_WAIT_SECONDS = 2.0


def _holder(path: Path, wait: float = HOLDER_WAIT_SECONDS) -> str:
    """Who holds ``path``, as its owner wrote it. The owner writes its details just after taking the lock, so a run
    refused in that instant waits up to ``wait`` seconds for them rather than naming no one."""
    deadline = time.monotonic() + wait
    while True:
        try:
            owner = json.loads(path.read_text(encoding="utf-8"))
            return (f"process {owner['pid']} on host {owner['host']}, started {owner['started']}: "
                    f"{owner['command']}")
        except (OSError, ValueError, KeyError, TypeError):
            if time.monotonic() >= deadline:
                return "another process; it wrote no details (starting, or just finishing)"
            time.sleep(0.02)


def lock_run_folder(path: str | os.PathLike[str]) -> Any:
    """Take ``path``'s run lock (creating the folder) for as long as the returned handle is referenced;
    ``RunLockedError`` when another process holds it, ``paths.PathOptionError`` for a path that cannot be a run
    folder (empty, a file, a symlink loop, unwritable)."""
    folder = paths.output_folder(path, "run_dir")
    folder.mkdir(parents=True, exist_ok=True)
    return _FolderLock.acquire(folder)


def check_not_running(path: str | os.PathLike[str]) -> None:
    """``RunLockedError`` when another process is writing the run folder ``path`` (e.g. before merging it)."""
    if (Path(path) / LOCK_FILE).exists():
        lock_run_folder(path)


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write ``data`` to ``path`` whole or not at all: a temporary file next to it, fsynced, then renamed over it
    (a full disk or a kill leaves the old file, or none, never half of the new one, and no temporary file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        tmp.unlink(missing_ok=True)
        raise _naming(error, path)
    return path


def _naming(error: BaseException, path: Path) -> BaseException:
    """``error`` with ``path`` as its file name when it is an OSError without one (a failed ``write()``, e.g. a
    full disk, names no file), so that the CLI can say what could not be written."""
    if isinstance(error, OSError) and error.filename is None and error.errno is not None:
        named = OSError(error.errno, error.strerror, str(path))
        named.__cause__ = error
        return named
    return error


def write_json_atomic(path: Path, payload: Any) -> None:
    write_atomic(path, json.dumps(payload, indent=2, sort_keys=True, default=str))


class RecordLog:
    """Append-only JSONL records with durable appends, torn-line recovery and de-duplication by unit key.

    ``key_fields``: the fields naming a record's unit (what a resumed run skips), given by the caller (the
    experiment that writes the log declares them: ``vrh_interp.experiments.declared.record_log``); None keys a
    record by its whole content. ``repair=True`` (a writer holding the folder's lock) truncates a torn last line;
    readers only skip it.
    """

    def __init__(self, path: Path, *, key_fields: tuple[str, ...] | None = None, repair: bool = False) -> None:
        self.path = Path(path)
        self.key_fields = key_fields
        if repair:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._repair()

    def _repair(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data[: data.rfind(b"\n") + 1]
            with open(self.path, "wb") as handle:
                handle.write(keep)
                handle.flush()
                os.fsync(handle.fileno())

    def read(self) -> list[dict[str, Any]]:
        """The records, each unit once, in file order; ``RunRecordError`` names the file and line of a damaged
        line or of a second, different record of a unit."""
        if not self.path.exists():
            return []
        # the last piece is b"" when the file ends with a newline, else a line torn by a kill mid-append: dropped,
        # its unit is redone on resume
        lines = self.path.read_bytes().split(b"\n")[:-1]
        records: list[dict[str, Any]] = []
        first_line: dict[Any, tuple[int, str]] = {}  # unit key -> (line number, canonical text)
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            record = self._parse(line, number)
            key, text = self._key(record, number), json.dumps(record, sort_keys=True)
            if key in first_line:
                earlier, kept = first_line[key]
                if kept == text:  # canonical text, not ==: a NaN field repeats exactly
                    continue  # an exact repeat (e.g. two runs appended the same unit): count it once
                raise RunRecordError(
                    f"{self.path} line {number}: a second, different record of {self._unit_name(key)} (the first is "
                    f"on line {earlier}); the log was written by two runs or edited. Keep one of the two lines, or "
                    "start over in a new --out folder")
            first_line[key] = (number, text)
            records.append(record)
        return records

    def _parse(self, line: bytes, number: int) -> dict[str, Any]:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as error:
            raise RunRecordError(
                f"{self.path} line {number}: not a JSON record ({type(error).__name__}: {error}); the log is damaged "
                "in the middle (an interrupted run only ever tears the LAST line). Delete that line (its unit is "
                "redone when the run resumes) or start over in a new --out folder") from None
        if not isinstance(record, dict):
            raise RunRecordError(f"{self.path} line {number}: expected a JSON object, got {type(record).__name__}; "
                                 "delete that line (its unit is redone when the run resumes) or start over")
        return record

    def _key(self, record: Mapping[str, Any], number: int) -> Any:
        if self.key_fields is None:
            return json.dumps(record, sort_keys=True)
        missing = [f for f in self.key_fields if f not in record]
        if missing:
            raise RunRecordError(f"{self.path} line {number}: the record has no {', '.join(missing)} (its key); "
                                 "delete that line (its unit is redone when the run resumes) or start over")
        return tuple(json.dumps(record[f], sort_keys=True) for f in self.key_fields)

    def _unit_name(self, key: Any) -> str:
        if self.key_fields is None:
            return "the same record"
        return ", ".join(f"{f}={json.loads(v)!r}" for f, v in zip(self.key_fields, key))

    def append(self, records: Iterable[Mapping[str, Any]]) -> None:
        lines = "".join(json.dumps(dict(r), sort_keys=True) + "\n" for r in records)
        if not lines:
            return
        try:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(lines)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as error:  # what was written is whole records and a torn last line: resuming repairs it
            raise _naming(error, self.path)


def _difference(key: str, old: Any, new: Any) -> str:
    """One manifest entry's difference in a line: for mappings (a run's conditions), the keys only on one side and
    the keys whose values differ, a few of each named, instead of both mappings printed whole."""
    if isinstance(old, dict) and isinstance(new, dict):
        if key == "model" and {k for k in set(old) | set(new) if old.get(k) != new.get(k)} == {"weights"}:
            return ("model: the same model with other weights (retrained, edited or another version; "
                    "provenance.weights_fingerprint)")
        sides = (("only in the folder", sorted(set(old) - set(new))), ("only in this run", sorted(set(new) - set(old))),
                 ("different", sorted(k for k in set(old) & set(new) if old[k] != new[k])))
        return f"{key}: " + ", ".join(f"{len(keys)} {label} (e.g. {', '.join(map(str, keys[:3]))})"
                                      for label, keys in sides if keys)

    def shown(value: Any) -> str:
        text = repr(value)
        return text if len(text) <= 200 else text[:197] + "..."

    return f"{key}: folder has {shown(old)}, this run has {shown(new)}"


def _as_written_then(previous: Mapping[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without the model's weights fingerprint when the folder's manifest predates it (written by
    vrh-interp 0.2.0 or older): such a folder resumes as before, since it cannot tell which weights made it."""
    model, stored = config.get("model"), previous.get("model")
    if isinstance(model, dict) and isinstance(stored, dict) and "weights" in model and "weights" not in stored:
        return {**config, "model": {k: v for k, v in model.items() if k != "weights"}}
    return config


class RunFolder:
    """A folder holding a manifest and record logs for one configuration."""

    def __init__(self, path: str | os.PathLike[str], config: Mapping[str, Any]) -> None:
        self._lock = lock_run_folder(path)  # before reading anything: another writer would race us
        self.path = Path(path)
        self.config = json.loads(json.dumps(dict(config), default=str))
        manifest = self.path / "manifest.json"
        if manifest.exists():
            previous = read_manifest(manifest)
            current = _as_written_then(previous, self.config)
            differing = sorted(k for k in set(previous) | set(current) if previous.get(k) != current.get(k))
            if differing:
                details = "; ".join(_difference(k, previous.get(k), current.get(k)) for k in differing[:5])
                raise RunMismatchError(
                    f"run folder {self.path} was made by a different configuration ({details}). "
                    "Refusing to resume into it: use a new --out folder, or delete this one to start over."
                )
        else:
            write_json_atomic(manifest, self.config)

    def log(self, name: str, *, key_fields: tuple[str, ...] | None = None) -> RecordLog:
        """The record log ``NAME.jsonl`` for writing (a torn last line repaired), keyed by ``key_fields``."""
        return RecordLog(self.path / f"{name}.jsonl", key_fields=key_fields, repair=True)


def whole_run_manifest(run_dir: Path, kind: str, what: str) -> dict[str, Any]:
    """The manifest of an unsharded (or merged) run folder of ``kind``; ``what`` names the kind in errors."""
    manifest = Path(run_dir) / "manifest.json"
    if not manifest.exists():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no manifest.json)")
    config = read_manifest(manifest)
    if config.get("kind") != kind:
        raise RunManifestError(f"{run_dir} holds a {config.get('kind')!r} run, not {what}")
    if "shard" in config:
        shard = config["shard"] if isinstance(config["shard"], dict) else {}
        raise RunManifestError(f"{run_dir} holds shard {shard.get('index', '?')}/{shard.get('count', '?')} only: "
                               "merge all shards first (vrh merge OUT SHARD_FOLDERS...) and read the merged folder")
    return config
