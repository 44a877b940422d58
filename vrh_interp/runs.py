"""Run folders that survive interruption.

A long operation (detection, sweeps, design-space searches) writes one record per finished unit of work
(sample, or sample x condition) as it goes, to an append-only JSONL log; each line is flushed and
fsynced before the next unit starts. Rerunning the same command on the same folder reads the log,
skips what is done and continues, so a run killed at any point and resumed yields exactly the records an
uninterrupted run yields (units are deterministic given the seed; records are keyed and deduplicated).
A torn last line (killed mid-write) is dropped and truncated on reopen.

``manifest.json`` holds the configuration that produced the records (model, data, design, seeds, library
versions); reopening a folder with a different configuration is refused with the differing keys named,
because mixing records of two configurations would silently corrupt the table. A shard's folder (``--shard
i/n``) records the whole run's configuration plus a ``"shard"`` entry; ``vrh_interp.merge`` joins shard folders.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping


class RunMismatchError(RuntimeError):
    """A run folder was made by a different model or configuration."""


def write_json_atomic(path: Path, payload: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2, sort_keys=True, default=str)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class RecordLog:
    """Append-only JSONL records with durable appends and torn-line recovery."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
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
        if not self.path.exists():
            return []
        records = []
        with open(self.path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    records.append(json.loads(line))
        return records

    def append(self, records: Iterable[Mapping[str, Any]]) -> None:
        lines = "".join(json.dumps(dict(r), sort_keys=True) + "\n" for r in records)
        if not lines:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(lines)
            handle.flush()
            os.fsync(handle.fileno())

    def done_keys(self, key: Callable[[Mapping[str, Any]], Any]) -> set[Any]:
        return {key(r) for r in self.read()}


class RunFolder:
    """A folder holding a manifest and record logs for one configuration."""

    def __init__(self, path: str | os.PathLike[str], config: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.config = json.loads(json.dumps(dict(config), default=str))
        manifest = self.path / "manifest.json"
        if manifest.exists():
            previous = json.loads(manifest.read_text(encoding="utf-8"))
            differing = sorted(k for k in set(previous) | set(self.config) if previous.get(k) != self.config.get(k))
            if differing:
                details = "; ".join(f"{k}: folder has {previous.get(k)!r}, this run has {self.config.get(k)!r}"
                                    for k in differing[:5])
                raise RunMismatchError(
                    f"run folder {self.path} was made by a different configuration ({details}). "
                    "Refusing to resume into it: use a new --out folder, or delete this one to start over."
                )
        else:
            write_json_atomic(manifest, self.config)

    def log(self, name: str) -> RecordLog:
        return RecordLog(self.path / f"{name}.jsonl")


def whole_run_manifest(run_dir: Path, kind: str, what: str) -> dict[str, Any]:
    """The manifest of an unsharded (or merged) run folder of ``kind``; ``what`` names the kind in errors."""
    manifest = Path(run_dir) / "manifest.json"
    if not manifest.exists():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no manifest.json)")
    config = json.loads(manifest.read_text(encoding="utf-8"))
    if config.get("kind") != kind:
        raise ValueError(f"{run_dir} holds a {config.get('kind')!r} run, not {what}")
    if "shard" in config:
        raise ValueError(f"{run_dir} holds shard {config['shard']['index']}/{config['shard']['count']} only: merge "
                         "all shards first (vrh merge OUT SHARD_FOLDERS...) and read the merged folder")
    return config
