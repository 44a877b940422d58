"""Time to first error: wall seconds from starting ``vrh`` to its exit on a wrong input that needs no model.

Each case runs the real entry point (``python -m vrh_interp.apps.cli``; the trainer's cases ``python -m
toy_training.train``) in a fresh subprocess, ``--repeat`` times; the median is printed with the modules the run
imported (torch, transformers and nnsight must not be among them: the checks run before the heavy imports). The
baseline is a bare ``python -c pass`` on the same machine. The grid cases are the plan-level faults of issue 53
(their GRID.toml files are written into the temporary folder the cases run in); ``--ray 127.0.0.1:1`` is a closed
port (Ray alone retried it for over 200 s).

    python benchmarks/first_error.py [--repeat 5]

Prints ``time to first error: CASE: MEDIAN s (min MIN s; heavy imports: ...)`` per case.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "nnsight")
# the entry point, then the heavy modules it imported, printed on exit whatever happens
PROBE = ("import atexit, sys\n"
         f"atexit.register(lambda: print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules), "
         "file=sys.stderr))\n"
         "from vrh_interp.apps.cli import main\n"
         "sys.exit(main(sys.argv[1:]))\n")
# the trainer's entry point, run as `python -m toy_training.train` runs it
TRAINER_PROBE = ("import atexit, runpy, sys\n"
                 f"atexit.register(lambda: print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules), "
                 "file=sys.stderr))\n"
                 "sys.argv = ['train', *sys.argv[1:]]\n"
                 "runpy.run_module('toy_training.train', run_name='__main__', alter_sys=True)\n")
MODEL = "[models.a]\nmodel = 'toy:a'\n"
BENCH = "[benchmarks.x]\ndetect = 'synthetic:detect:2'\neval = 'synthetic:eval:2'\n"
# GRID.toml files of the grid cases, written into the folder the cases run in (a name ending in / is a folder)
GRID_FILES: dict[str, str | bytes] = {
    "ok.toml": MODEL + BENCH,
    "nan.toml": MODEL + "gpus = nan\n" + BENCH,
    "summary-k.toml": "[options]\nks = '0,1,3'\nsummary_k = 2\n" + MODEL + BENCH,
    "collide.toml": MODEL + BENCH + BENCH.replace(".x]", ".X]"),
    "latin.toml": ("# modèle\n" + MODEL + BENCH).encode("latin-1"),
    "grids/": "",
    "big.toml": MODEL + "".join(BENCH.replace(".x]", f".b{i}]") for i in range(260)),
}
CASES = {
    "missing jsonl data file": ["detect", "--data", "jsonl:MISSING.jsonl", "--model", "toy:a", "--out", "X"],
    "missing model folder": ["detect", "--model", "./no-such-model", "--data", "synthetic:detect:2", "--out", "X"],
    "empty --out": ["detect", "--model", "toy:a", "--data", "synthetic:detect:2", "--out", ""],
    "--scores is a folder": ["sweep", "--scores", ".", "--out", "X"],
    "--device meta": ["detect", "--model", "toy:a", "--device", "meta", "--out", "X"],
    "grid: gpus = nan": ["grid", "nan.toml", "--out", "G"],
    "grid: summary_k not among ks": ["grid", "summary-k.toml", "--out", "G"],
    "grid: two cells, one folder": ["grid", "collide.toml", "--out", "G"],
    "grid: file not UTF-8": ["grid", "latin.toml", "--out", "G"],
    "grid: file is a folder": ["grid", "grids", "--out", "G"],
    "grid: 520 cells, no --yes": ["grid", "big.toml", "--out", "G"],
    "grid --ray at a closed port": ["grid", "ok.toml", "--out", "G", "--ray", "127.0.0.1:1"],
}
TRAINER_CASES = {
    "trainer --threads 0": ["--threads", "0", "--out", "T"],
    "trainer without --out": ["--model", "a"],
    "trainer --tower-lr-scale nan": ["--tower-lr-scale", "nan", "--out", "T"],
}


def write_grid_files(folder: str) -> None:
    for name, content in GRID_FILES.items():
        path = Path(folder) / name
        if name.endswith("/"):
            path.mkdir(exist_ok=True)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")


def run_case(argv: list[str], folder: str, probe: str = PROBE) -> tuple[float, int, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", probe, *argv], cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    heavy = next((line[6:] for line in done.stderr.splitlines() if line.startswith("HEAVY=")), "?")
    return seconds, done.returncode, heavy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        base = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            base.append(time.perf_counter() - start)
        print(f"python -c pass (baseline): {statistics.median(base):.3f} s")
        write_grid_files(folder)
        cases = [(name, argv, PROBE) for name, argv in CASES.items()]
        cases += [(name, argv, TRAINER_PROBE) for name, argv in TRAINER_CASES.items()]
        for name, argv, probe in cases:
            runs = [run_case(argv, folder, probe) for _ in range(args.repeat)]
            codes = {code for _, code, _ in runs}
            seconds = [s for s, _, _ in runs]
            print(f"time to first error: {name}: {statistics.median(seconds):.3f} s (min {min(seconds):.3f} s; "
                  f"exit {','.join(map(str, sorted(codes)))}; heavy imports: {runs[-1][2] or 'none'})")


if __name__ == "__main__":
    main()
