"""The Ray executor of ``experiments.grid`` (``vrh grid GRID.toml --ray auto|ADDRESS``; ``pip install
'vrh-interp[ray]'``).

Every cell not done yet becomes one Ray task running ``grid.run_cell`` (the function the local executor calls),
declaring the grid's resources (``num_cpus`` = ``cpus``, ``num_gpus`` and ``memory`` from the cell's models),
with the results of its dependencies as arguments, so Ray starts it only after them. A task whose worker dies
(killed, out of memory, a lost node) or that raises a ``RuntimeError`` / ``OSError`` (a CUDA error, a dropped
NDIF connection) is retried up to ``retries`` times; the retry reopens the cell's run folder and resumes from its
records, so no finished pass is repeated. Errors that retrying cannot fix (``ValueError``: a bad spec, a k too
large for the model) fail the cell at once. Killing the driver ends its tasks (Ray's ownership); rerunning it
resumes every unfinished cell from its folder and skips the done ones.

Workers read and write the grid folder: on more than one machine it must be on a shared file system (NFS,
Lustre), mounted at the same path everywhere, and the workers need this package in their environment
(docs/recipes/grid.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

from vrh_interp.core.remote import ENV as REMOTE_TIMEOUT_ENV

from vrh_interp.experiments.grid import (Cell, GridSpec, cell_resources, one_line, read_status, run_cell,
                                         write_manifest, write_status)

RETRIED_ERRORS: tuple[type[BaseException], ...] = (RuntimeError, OSError)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RuntimeError("--ray needs Ray, an optional extra: pip install 'vrh-interp[ray]' (or run without --ray: "
                           "the local executor)") from None
    return ray


def connect(address: str) -> bool:
    """Join the Ray cluster at ``address`` (``auto``: the one this machine belongs to, ``RAY_ADDRESS``, or a new
    local one), unless this process already has one; True when this call started the connection."""
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
    """Submit every cell not done yet as a Ray task and wait for all; grid.json is refreshed every 2 s (the
    workers' running / done / failed statuses). Returns the statuses."""
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
            write_manifest(grid_dir, spec, cells, "ray")
        return write_manifest(grid_dir, spec, cells, "ray")
    finally:
        if started:
            ray.shutdown()
