"""Wall time of one grid (``vrh grid``) on the local executor and on a local Ray cluster of N workers, side by side.

The same GRID.toml runs twice into fresh folders, first ``--executor`` order alternating per round: locally (every
cell in this process, in order) and as Ray tasks on a cluster started here with ``ray.init(num_cpus=N)`` (one
CPU per cell). Ray's own start-up (the cluster, the workers importing torch) is inside the timed Ray run, as a
user would pay it. The records of both runs are compared byte for byte (they must be equal). Prints
``grid wall time ray(N workers) / local: R`` (below 1: Ray is faster).

A cell is CPU-bound here (a toy model on one thread per worker: ``OMP_NUM_THREADS=1``), so the ratio can reach
1/N only when N idle cores are available; on a shared machine it measures what the cores give.

    python benchmarks/grid_speed.py                       # the 2 x 2 toy grid below, 2 workers
    python benchmarks/grid_speed.py --grid GRID.toml --workers 4 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_GRID = """
[options]
ks = "0,1,3"
random_sets = 4
batch_size = 8

[models.a]
model = "toy:a"

[models.b]
model = "toy:b"

[benchmarks.easy]
detect = "synthetic:detect:8:0"
eval = "synthetic:eval:8:0"

[benchmarks.hard]
detect = "synthetic:detect:8:2"
eval = "synthetic:eval:8:2"
"""


def _records(grid_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(grid_dir)): p.read_bytes() for p in sorted((grid_dir / "cells").rglob("*.jsonl"))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", default=None, help="a GRID.toml (default: a 2 x 2 grid of toy:a / toy:b)")
    parser.add_argument("--workers", type=int, default=2, help="CPUs of the local Ray cluster (one cell per CPU)")
    parser.add_argument("--rounds", type=int, default=1, help="timed runs of each executor (median reported)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import ray

    from vrh_interp.experiments.grid import parse_grid
    from vrh_interp.experiments.grid_execution import run_grid

    text = Path(args.grid).read_text(encoding="utf-8") if args.grid else DEFAULT_GRID
    spec = parse_grid(text)
    scratch = Path(tempfile.mkdtemp(prefix="grid-speed-"))
    times: dict[str, list[float]] = {"local": [], "ray": []}
    try:
        for round_ in range(args.rounds):
            order = ["local", "ray"] if round_ % 2 == 0 else ["ray", "local"]
            folders = {}
            for executor in order:
                out = folders[executor] = scratch / f"{executor}-{round_}"
                started = time.perf_counter()
                if executor == "ray":
                    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False,
                             logging_level="WARNING")
                    try:
                        result = run_grid(spec, out, ray="auto", progress=False)
                    finally:
                        ray.shutdown()
                else:
                    from vrh_interp.experiments import grid

                    grid._MODEL_CACHE.clear()  # every round loads its models, as a fresh process would
                    result = run_grid(spec, out, progress=False)
                times[executor].append(time.perf_counter() - started)
                if result.failed:
                    print(f"{executor}: cells failed: {result.failed}", file=sys.stderr)
                    return 1
                print(f"round {round_}: {executor} {times[executor][-1]:.1f} s ({len(result.cells)} cells)")
            same = _records(folders["local"]) == _records(folders["ray"])
            print(f"round {round_}: records equal: {same}")
            if not same:
                return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    local, ray_time = statistics.median(times["local"]), statistics.median(times["ray"])
    print(f"local: {local:.1f} s, ray({args.workers} workers): {ray_time:.1f} s (median of {args.rounds}; "
          f"{os.cpu_count()} CPUs on this machine)")
    print(f"grid wall time ray({args.workers} workers) / local: {ray_time / local:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
