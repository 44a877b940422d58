"""The local grid executor's own bookkeeping, side by side: grid.json rewritten after every cell (before) vs at most
every ``grid_execution.REFRESH_S`` (now), on a grid of stub cells that run nothing (no model), so that the time is the
driver's alone.

One ``grid.json`` write reads every cell's status file and writes the whole grid (5 MB at 20,000 cells), so writing
it after every cell costs a time quadratic in the cells. Both policies run the same plan into fresh folders, in
alternating order per round; both grid.json files must end with every cell done. Prints the seconds of one write at
the size, both policies' wall time and ``bookkeeping now / before: R``.

    python benchmarks/grid_bookkeeping.py                  # 100 models x 10 benchmarks x (detect, sweep): 2,000 cells
    python benchmarks/grid_bookkeeping.py --models 100 --benchmarks 100 --rounds 1   # the issue's 20,000 (slow before)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from vrh_interp.experiments import grid_execution
from vrh_interp.experiments.grid import GridModel, GridSpec, GroundingBenchmark, plan_cells


def _spec(models: int, benchmarks: int) -> GridSpec:
    return GridSpec(models={f"m{i}": GridModel(f"m{i}", "toy:a") for i in range(models)},
                    benchmarks={f"b{i}": GroundingBenchmark(f"b{i}", "synthetic:detect:2", "synthetic:eval:2")
                                for i in range(benchmarks)})


def _run(spec: GridSpec, folder: Path, every_cell: bool) -> float:
    cells = plan_cells(spec)
    folder.mkdir()
    refresh = grid_execution._Refresh.__call__
    if every_cell:  # the executor as it was: grid.json after every cell
        grid_execution._Refresh.__call__ = grid_execution._Refresh.final  # type: ignore[method-assign]
    try:
        began = time.perf_counter()
        grid_execution.run_local(folder, spec, cells, log=lambda line: None)
        return time.perf_counter() - began
    finally:
        grid_execution._Refresh.__call__ = refresh  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--benchmarks", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    grid_execution._run_declared = lambda grid_dir, spec, cell: {}  # stub cells: nothing runs, nothing loads
    spec = _spec(args.models, args.benchmarks)
    cells = plan_cells(spec)
    times: dict[str, list[float]] = {"before": [], "now": []}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "probe").mkdir()
        began = time.perf_counter()
        grid_execution.write_manifest(Path(tmp) / "probe", spec, cells, "local")
        print(f"{len(cells)} cells; one grid.json write (no cell done): {time.perf_counter() - began:.3f} s")
        for round_ in range(args.rounds):
            order = ["before", "now"] if round_ % 2 == 0 else ["now", "before"]
            for policy in order:
                folder = Path(tmp) / f"{policy}-{round_}"
                times[policy].append(_run(spec, folder, every_cell=policy == "before"))
            a, b = ([(c["id"], c["status"]) for c in json.loads((Path(tmp) / f"{p}-{round_}" /
                                                                  grid_execution.GRID_FILE).read_text())["cells"]]
                    for p in ("before", "now"))
            assert a == b and {status for _, status in a} == {"done"}, "grid.json does not end with every cell done"
    for policy, seconds in times.items():
        print(f"{policy}: median {statistics.median(seconds):.2f} s over {len(seconds)} rounds "
              f"({', '.join(f'{s:.2f}' for s in seconds)})")
    print(f"bookkeeping now / before: {statistics.median(times['now']) / statistics.median(times['before']):.3f}")


if __name__ == "__main__":
    main()
