"""Time to first error: wall seconds from starting ``vrh`` to its exit on a wrong input that needs no model.

Each case runs the real entry point (``python -m vrh_interp.apps.cli``) in a fresh subprocess, ``--repeat`` times;
the median is printed with the modules the run imported (torch, transformers and nnsight must not be among
them: the checks run before the heavy imports). The baseline is a bare ``python -c pass`` on the same machine.

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
CASES = {
    "missing jsonl data file": ["detect", "--data", "jsonl:MISSING.jsonl", "--model", "toy:a", "--out", "X"],
    "missing model folder": ["detect", "--model", "./no-such-model", "--data", "synthetic:detect:2", "--out", "X"],
    "empty --out": ["detect", "--model", "toy:a", "--data", "synthetic:detect:2", "--out", ""],
    "--scores is a folder": ["sweep", "--scores", ".", "--out", "X"],
    "--device meta": ["detect", "--model", "toy:a", "--device", "meta", "--out", "X"],
}


def run_case(argv: list[str], folder: str) -> tuple[float, int, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=folder, env=env, capture_output=True, text=True)
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
        for name, argv in CASES.items():
            runs = [run_case(argv, folder) for _ in range(args.repeat)]
            codes = {code for _, code, _ in runs}
            seconds = [s for s, _, _ in runs]
            print(f"time to first error: {name}: {statistics.median(seconds):.3f} s (min {min(seconds):.3f} s; "
                  f"exit {','.join(map(str, sorted(codes)))}; heavy imports: {runs[-1][2] or 'none'})")


if __name__ == "__main__":
    main()
