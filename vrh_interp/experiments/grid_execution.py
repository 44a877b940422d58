"""``grid_execution``: running a grid's planned cells (``grid.plan_cells``) and bookkeeping their state.

The cells' status files (``status/``: one per cell, written by whoever runs it) and ``grid.json``; ``run_cell``, the
one function both executors call per cell; the local executor (``run_local``) and the Ray executor (``run_ray``; Ray
is imported only here, ``pip install 'vrh-interp[ray]'``; its workers unpickle ``run_cell`` from this module); and
``run_grid``, the driver's entry (load, check, plan, execute, summarise; ``vrh grid`` runs it through ``run`` and
prints ``apps.show.grid``). Apart from ``grid`` (GRID.toml parsing and the plan, which imports nothing of this) so
that the plan reads without the executors; ``run_grid`` lives here, not in ``grid``, because it calls the executors
and ``grid_summary``, which import ``grid``: a module loop otherwise (tests/test_architecture.py counts the imports
inside functions too).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from vrh_interp.core.execution.remote import ENV as REMOTE_TIMEOUT_ENV
from vrh_interp.core.bookkeeping.runs import RunLockedError, lock_run_folder, write_json_atomic
from vrh_interp.experiments.declared import experiment
from vrh_interp.experiments.grid import (GRID_FILE, STATUS_DIR, Cell, GridSpec, GridSpecError,
                                         _run_declared, _run_merge, cell_resources, check_inputs, check_numbers,
                                         check_plan, load_grid, plan_cells, status_name)
from vrh_interp.experiments.grid_summary import patching_summary, write_summary


# ------------------------------------------------------------------------------------------- status of the cells


def status_path(grid_dir: Path, cell_id: str) -> Path:
    return Path(grid_dir) / STATUS_DIR / (status_name(cell_id) + ".json")


def _legacy_status_path(grid_dir: Path, cell_id: str) -> Path:
    """Where grids made before issue 53 kept a cell's status (':' and the like became '_', so two cells could share it:
    read only when the file names this very cell)."""
    return Path(grid_dir) / STATUS_DIR / (re.sub(r"[^A-Za-z0-9_.+-]+", "_", cell_id) + ".json")


def read_status(grid_dir: Path, cell_id: str) -> dict[str, Any]:
    for path in (status_path(grid_dir, cell_id), _legacy_status_path(grid_dir, cell_id)):
        try:
            status = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(status, dict) and status.get("cell") == cell_id and "status" in status:
            return status
    return {"status": "pending"}


def write_status(grid_dir: Path, cell_id: str, status: str, **facts: Any) -> None:
    path = status_path(grid_dir, cell_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"cell": cell_id, "status": status, "time": time.time(), **facts})


def one_line(error: BaseException) -> str:
    """An error as the one line a status shows."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:500]


def _records_in(folder: Path, kind: str) -> int:
    if kind == "patch":  # the study's finished parts (pair kinds, probes)
        from vrh_interp.experiments.patching_study import PART_DONE

        return len(list(folder.glob(f"parts/*/{PART_DONE}")))
    declared = experiment({"sweep-shard": "sweep", "sweep-merge": "sweep"}.get(kind, kind))
    paths = [declared.log_path(folder)] if declared.log else sorted(folder.glob("masked_in_*/sweep_records.jsonl"))
    return sum(p.read_bytes().count(b"\n") for p in paths if p.exists())


def _hold(folder: Path, wait_s: float) -> Any:
    """The cell folder's run lock, waiting up to ``wait_s`` for a previous attempt's process to let go (a retried
    task can start while the killed one's worker is still being reaped)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return lock_run_folder(folder)
        except RunLockedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def torch_threads(count: int | None = None) -> int:
    """torch's intra-op thread count; with ``count``, set it first (what ``run_cell`` fixes per cell)."""
    import torch

    if count is not None:
        torch.set_num_threads(count)
    return torch.get_num_threads()


def run_cell(grid_dir: str | os.PathLike[str], spec: GridSpec | Mapping[str, Any], cell_id: str,
             *_dependencies: Any) -> dict[str, Any]:
    """Run (or resume) one cell of the grid in this process and return its status; what both executors call.

    Writes ``status/CELL.json`` (running, then done or failed) and appends an attempt line (process, host, the
    records already in the folder when it started) to ``status/CELL.attempts.jsonl``: a retried cell shows that
    it resumed. Exceptions propagate (the executor records them); ``_dependencies`` are ignored (the Ray
    executor passes the dependencies' results to order the tasks)."""
    grid_dir = Path(grid_dir)
    spec = spec if isinstance(spec, GridSpec) else GridSpec.from_dict(spec)
    cell = {c.id: c for c in plan_cells(spec)}[cell_id]
    folder = grid_dir / cell.folder
    lock = _hold(folder, wait_s=60.0)
    attempt = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
               "records_before": _records_in(folder, cell.kind)}
    status_path(grid_dir, cell_id).parent.mkdir(parents=True, exist_ok=True)
    with open(status_path(grid_dir, cell_id).with_suffix(".attempts.jsonl"), "a", encoding="utf-8") as handle:
        handle.write(json.dumps(attempt) + "\n")
    write_status(grid_dir, cell_id, "running", pid=attempt["pid"], host=attempt["host"])
    started = time.monotonic()
    threads = torch_threads()
    torch_threads(spec.options.threads)
    try:
        facts = (_run_merge if cell.kind == "sweep-merge" else _run_declared)(grid_dir, spec, cell)
    except Exception as error:
        write_status(grid_dir, cell_id, "failed", reason=one_line(error))
        raise
    finally:
        torch_threads(threads)
        del lock
    done = {"status": "done", "seconds": round(time.monotonic() - started, 3), **facts}
    write_status(grid_dir, cell_id, "done", **{k: v for k, v in done.items() if k != "status"})
    return done


# ------------------------------------------------------------------------------------------ manifest, executors

@dataclass
class GridResult:
    out: Path
    cells: list[Cell]
    status: dict[str, dict[str, Any]]
    summary: Any  # pandas DataFrame (grid_summary.csv)
    patching: Any = None  # pandas DataFrame (grid_patching.csv), for grids with patching cells

    @property
    def failed(self) -> list[str]:
        return [c.id for c in self.cells if self.status[c.id]["status"] != "done"]


def write_manifest(grid_dir: Path, spec: GridSpec, cells: Sequence[Cell], executor: str) -> dict[str, dict[str, Any]]:
    """``grid.json``: the grid, every cell and its status (from ``status/``); returns the statuses."""
    status = {c.id: read_status(grid_dir, c.id) for c in cells}
    write_json_atomic(grid_dir / GRID_FILE, {
        "kind": "grid", "grid": spec.to_dict(), "executor": executor,
        "cells": [{**dataclasses.asdict(c), **{k: status[c.id].get(k) for k in ("status", "reason", "pid", "host",
                                                                               "seconds") if k in status[c.id]}}
                  for c in cells]})
    return status


REFRESH_S = 2.0
"""``grid.json`` is rewritten while cells run at most every ``REFRESH_S`` seconds, and at most every 20 times its
last write's seconds: on a 20,000-cell grid one write (every status file read, 5 MB written) takes about 3 s,
which after every cell cost more than a toy cell (``benchmarks/grid_bookkeeping.py``). The status files stay exact
after every cell; grid.json is written once more when the executor ends."""


class _Refresh:
    """``write_manifest`` while cells run, throttled (``REFRESH_S``); ``final()`` always writes."""

    def __init__(self, grid_dir: Path, spec: GridSpec, cells: Sequence[Cell], executor: str) -> None:
        self.args, self.due = (grid_dir, spec, cells, executor), 0.0

    def __call__(self) -> None:
        if time.monotonic() >= self.due:
            self.final()

    def final(self) -> dict[str, dict[str, Any]]:
        began = time.monotonic()
        status = write_manifest(*self.args)
        self.due = time.monotonic() + max(REFRESH_S, 20 * (time.monotonic() - began))
        return status


SCHEDULING_KEYS = {"options": ("cpus", "retries", "summary_k"), "model": ("gpus", "memory_gb")}
"""Fields that decide where and how often a cell runs, not its records: a rerun may change them."""


def _results_view(grid: Mapping[str, Any]) -> dict[str, Any]:
    view = json.loads(json.dumps(grid))
    for key in SCHEDULING_KEYS["options"]:
        view.get("options", {}).pop(key, None)
    for model in view.get("models", {}).values():
        for key in SCHEDULING_KEYS["model"]:
            model.pop(key, None)
    return view


def _check_same_grid(grid_dir: Path, spec: GridSpec) -> None:
    """Refuse a grid folder made by a GRID.toml whose cells would differ (scheduling fields may change)."""
    path = grid_dir / GRID_FILE
    if not path.exists():
        return
    before = _results_view(json.loads(path.read_text(encoding="utf-8")).get("grid") or {})
    now = _results_view(spec.to_dict())
    if before != now:
        differing = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
        raise GridSpecError(f"grid folder {grid_dir} was made by a different GRID.toml ({', '.join(differing)} "
                            "differ): use another --out, or delete the folder to start over")


def run_local(grid_dir: Path, spec: GridSpec, cells: Sequence[Cell], *,
              log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """The local executor: every cell not done yet, in plan order, in this process, each announced with its place
    and the time left (the mean of the cells run so far). A failed cell is recorded (one line) and the grid goes on
    with the cells that do not need it."""
    failed: dict[str, dict[str, Any]] = {}
    refresh = _Refresh(grid_dir, spec, cells, "local")
    todo = [c for c in cells if read_status(grid_dir, c.id)["status"] != "done"]
    began = time.monotonic()
    for number, cell in enumerate(todo, 1):
        blocked = [d for d in cell.depends if d in failed or read_status(grid_dir, d)["status"] != "done"]
        if blocked:
            failed[cell.id] = {"status": "failed", "reason": f"needs {blocked[0]}, which did not finish"}
            write_status(grid_dir, cell.id, **failed[cell.id])
            continue
        left = "" if number == 1 else \
            f", ~{_duration((time.monotonic() - began) / (number - 1) * (len(todo) - number + 1))} left"
        log(f"grid: [{number}/{len(todo)}{left}] {cell.id} ...")
        try:
            run_cell(grid_dir, spec, cell.id)
        except Exception as error:
            failed[cell.id] = {"status": "failed", "reason": one_line(error)}
            write_status(grid_dir, cell.id, **failed[cell.id])
            log(f"grid: {cell.id} failed: {failed[cell.id]['reason']}")
        refresh()
    return refresh.final()


CONFIRM_ABOVE = 500
"""A plan with more cells to run than this runs only when confirmed (``vrh grid --yes``, ``run_grid(yes=True)``)."""
NOMINAL_CELL_SECONDS = 5.0
"""The estimate's seconds per cell before any cell of the grid has run: a toy-model cell on a 2-core CPU (issue 53
measured 37 cells in 180 s); real models take longer. Once cells are done, their mean is used instead."""


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


def plan_estimate(grid_dir: Path, cells: Sequence[Cell]) -> tuple[int, str]:
    """How many cells are still to run, and one line with the count and a time estimate (one cell at a time): the
    mean seconds of the grid's done cells, or ``NOMINAL_CELL_SECONDS`` when none has run."""
    states = [read_status(grid_dir, c.id) for c in cells]
    seconds = [s["seconds"] for s in states if s["status"] == "done" and isinstance(s.get("seconds"), (int, float))]
    todo = sum(s["status"] != "done" for s in states)
    if seconds:
        per_cell = sum(seconds) / len(seconds)
        basis = f"{per_cell:.3g} s per cell, the mean of the {len(seconds)} done"
    else:
        per_cell = NOMINAL_CELL_SECONDS
        basis = f"a toy model's {per_cell:g} s per cell on a 2-core CPU; real models take longer"
    return todo, (f"{len(cells)} cells, {todo} to run ({len(cells) - todo} done); estimate ~"
                  f"{_duration(todo * per_cell)} one at a time ({basis})")


def run_grid(grid: str | os.PathLike[str] | GridSpec, out: str | os.PathLike[str], *, ray: str | None = None,
             progress: bool = True, yes: bool = False, confirm_above: int | None = CONFIRM_ABOVE) -> GridResult:
    """Run (or resume) a grid into ``out``: ``grid`` is a GRID.toml path or a ``GridSpec``; ``ray`` None runs the
    cells here in order, ``"auto"`` or a cluster address runs them as Ray tasks (``run_ray``).
    The whole plan is checked first (``GridSpecError`` before any cell runs or any model loads); its cell count and
    a time estimate are printed, and more than ``confirm_above`` cells to run are refused unless ``yes``.
    Writes grid.json, the summary and the heatmap; returns every cell's status and the summary."""
    spec = grid if isinstance(grid, GridSpec) else load_grid(grid)
    if isinstance(grid, GridSpec):  # parse_grid checked a GRID.toml's
        check_numbers(spec)
    cells = check_plan(spec)
    check_inputs(spec)
    grid_dir = Path(out)

    def log(line: str) -> None:
        if progress:
            print(line, file=sys.stderr, flush=True)

    _check_same_grid(grid_dir, spec)
    todo, plan = plan_estimate(grid_dir, cells)
    if confirm_above is not None and todo > confirm_above and not yes:
        raise GridSpecError(f"{plan}: more than {confirm_above} cells run only when confirmed: pass --yes "
                            "(run_grid(..., yes=True)), or make the grid smaller")
    # Ray installed and its cluster joined (an address where none answers: refused within CONNECT_TIMEOUT_S)
    # before the folder is touched
    connected = ray is not None and connect(ray)
    log(f"grid: {plan}")
    try:
        lock = lock_run_folder(grid_dir)  # one driver per grid folder
        try:
            _check_same_grid(grid_dir, spec)  # again under the lock: another driver may have started the folder
            write_manifest(grid_dir, spec, cells, ray and "ray" or "local")
            if ray is None:
                status = run_local(grid_dir, spec, cells, log=log)
            else:
                status = run_ray(grid_dir, spec, cells, address=ray, log=log)
            summary = write_summary(grid_dir, spec, cells, status)
            patching = patching_summary(grid_dir, cells, status) if "patch" in spec.experiments else None
            return GridResult(grid_dir, cells, status, summary, patching)
        finally:
            del lock
    finally:
        if connected:  # joined here: left here (run_ray leaves a connection it did not make)
            _import_ray().shutdown()



def run(spec: Any, vlm: Any, folder: Path) -> GridResult:
    """``vrh grid``: ``run_grid`` on a checked ``builtin_specs.GridRunSpec`` (``vlm`` is None: each cell loads its
    model)."""
    return run_grid(spec.grid, folder, ray=spec.ray, progress=spec.progress, yes=spec.yes)


# ------------------------------------------------------------------------------------------------- Ray executor
# (``vrh grid --ray``; ``pip install 'vrh-interp[ray]'``; Ray is imported only here)

RETRIED_ERRORS: tuple[type[BaseException], ...] = (RuntimeError, OSError)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RuntimeError("--ray needs Ray, an optional extra: pip install 'vrh-interp[ray]' (or run without --ray: "
                           "the local executor)") from None
    return ray


CONNECT_TIMEOUT_S = 10.0
"""How long ``connect`` waits for a cluster address to answer before refusing it (Ray's own retries last minutes)."""
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # and empty SETTINGS


def _cluster_address(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``--ray`` address (``HOST:PORT``, ``ray://HOST:PORT``, ``auto`` with ``RAY_ADDRESS``
    set); None where Ray finds the cluster itself (``auto``: this machine's, or a new local one)."""
    if address in ("auto", "local"):
        address = os.environ.get("RAY_ADDRESS", "") if address == "auto" else ""
        if address in ("", "auto", "local"):
            return None
    host, _, port = address.split("://", 1)[-1].rstrip("/").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RuntimeError(f"--ray {address!r} is not a cluster address: use auto or HOST:PORT, e.g. --ray "
                           "10.0.0.1:6379")
    return host.strip("[]"), int(port)


def check_reachable(address: str, timeout: float | None = None) -> None:
    """Refuse (``RuntimeError``, one line) a cluster address where nothing answers within ``timeout`` seconds
    (``CONNECT_TIMEOUT_S``): no route, a closed port, a firewall that drops the packets, or a server that does not
    speak gRPC (HTTP/2, as Ray's GCS does; not checked with ``RAY_USE_TLS``). Ray alone retries such an address for
    minutes with its own messages."""
    target = _cluster_address(address)
    if target is None:
        return
    timeout = CONNECT_TIMEOUT_S if timeout is None else timeout
    fix = "start one with `ray start --head` and pass the address it prints, e.g. --ray 10.0.0.1:6379"
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection(target, timeout=timeout) as connection:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return
            connection.settimeout(max(0.1, deadline - time.monotonic()))
            connection.sendall(_HTTP2_PREFACE)
            answer = connection.recv(9)
    except (socket.timeout, TimeoutError):
        raise RuntimeError(f"no Ray cluster answered at {address!r} within {timeout:g} s: {fix}") from None
    except OSError as error:
        raise RuntimeError(f"cannot reach a Ray cluster at {address!r} ({error.strerror or error}): {fix}") from None
    if len(answer) < 9 or answer[3] != 4:  # a gRPC server's first frame is its SETTINGS (type 4)
        raise RuntimeError(f"the server at {address!r} is not a Ray cluster (it does not answer as Ray's GCS does): "
                           f"{fix}")


def connect(address: str) -> bool:
    """Join the Ray cluster at ``address`` (``auto``: the one this machine belongs to, ``RAY_ADDRESS``, or a new
    local one), unless this process already has one; True when this call started the connection. An address where
    no cluster answers within ``CONNECT_TIMEOUT_S`` seconds is refused first (``check_reachable``, before Ray is
    imported: that alone takes seconds)."""
    check_reachable(address)
    ray = _import_ray()
    if ray.is_initialized():
        return False
    try:
        ray.init(address=None if address == "auto" else address, include_dashboard=False, log_to_driver=False,
                 logging_level="WARNING")
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise RuntimeError(f"cannot join the Ray cluster at {address!r} ({one_line(error)}): start one with "
                           "`ray start --head` or pass its address, e.g. --ray 10.0.0.1:6379") from None
    return True


def _unavailable(needs: dict[str, float], total: dict[str, float]) -> str:
    """Why no node of the cluster could ever run a task needing ``needs`` ('' when it fits the cluster's total)."""
    names = {"num_cpus": ("CPU", "cpus"), "num_gpus": ("GPU", "gpus"), "memory": ("memory", "memory_gb")}
    for key, amount in needs.items():
        resource, field = names[key]
        have = float(total.get(resource, 0.0))
        if amount > have:
            scale = 2 ** 30 if key == "memory" else 1
            return (f"needs {amount / scale:g} {field} and the Ray cluster has {have / scale:g} in all: add nodes "
                    f"with them, or lower {field} in GRID.toml")
    return ""


def _reason(ray: Any, error: BaseException, cell: Cell, failed: dict[str, Any]) -> str:
    blocked = [d for d in cell.depends if d in failed]
    if blocked:
        return f"needs {blocked[0]}, which did not finish"
    if isinstance(error, ray.exceptions.RayTaskError):
        cause = getattr(error, "cause", None)
        return one_line(cause) if isinstance(cause, BaseException) else one_line(error)
    if isinstance(error, ray.exceptions.WorkerCrashedError):
        return "the worker process died on every retry (WorkerCrashedError); see the Ray logs"
    return one_line(error)


def run_ray(grid_dir: Path, spec: GridSpec, cells: Sequence[Cell], *, address: str,
            log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Submit every cell not done yet as a Ray task and wait for all; grid.json is refreshed as the workers report
    (running / done / failed; at most every ``REFRESH_S``). Returns the statuses."""
    ray = _import_ray()
    started = connect(address)
    try:
        task = ray.remote(run_cell)
        # the driver's NDIF timeouts reach the workers (remote cells time out as they would here)
        forwarded = {name: os.environ[name] for name in REMOTE_TIMEOUT_ENV.values() if name in os.environ}
        refs: dict[str, Any] = {}
        failed: dict[str, Any] = {}
        total = ray.cluster_resources()
        for cell in cells:
            if read_status(grid_dir, cell.id)["status"] == "done":
                continue
            missing = _unavailable(cell_resources(spec, cell), total)
            blocked = [d for d in cell.depends if d in failed]
            if missing or blocked:  # it would wait for ever: fail it now
                failed[cell.id] = {"status": "failed", "reason": missing or f"needs {blocked[0]}, which did not finish"}
                write_status(grid_dir, cell.id, **failed[cell.id])
                log(f"grid: {cell.id} failed: {failed[cell.id]['reason']}")
                continue
            options = {**cell_resources(spec, cell), "max_retries": spec.options.retries,
                       "retry_exceptions": list(RETRIED_ERRORS), "name": cell.id}
            if forwarded:
                options["runtime_env"] = {"env_vars": forwarded}
            dependencies = [refs[d] for d in cell.depends if d in refs]
            refs[cell.id] = task.options(**options).remote(str(grid_dir), spec.to_dict(), cell.id, *dependencies)
        log(f"grid: {len(refs)} cells submitted to Ray ({len(cells) - len(refs)} already done)")
        by_ref = {ref: {c.id: c for c in cells}[cid] for cid, ref in refs.items()}
        refresh = _Refresh(grid_dir, spec, cells, "ray")
        while by_ref:
            ready, _ = ray.wait(list(by_ref), num_returns=1, timeout=2.0)
            for ref in ready:
                cell = by_ref.pop(ref)
                try:
                    ray.get(ref)
                    log(f"grid: {cell.id} done")
                except Exception as error:  # a task error, a dead worker, a lost node: the cell failed
                    failed[cell.id] = {"status": "failed", "reason": _reason(ray, error, cell, failed)}
                    write_status(grid_dir, cell.id, **failed[cell.id])
                    log(f"grid: {cell.id} failed: {failed[cell.id]['reason']}")
            refresh()
        return refresh.final()
    finally:
        if started:
            ray.shutdown()
