"""Time to first error: wall seconds from starting ``vrh`` to its exit on a wrong input that needs no model.

Each case runs the real entry point (``python -m vrh_interp.apps.cli``; the trainer's cases ``python -m
toy_training.train``) in a fresh subprocess, ``--repeat`` times; the median is printed with the modules the run
imported (torch, transformers and nnsight must not be among them: the checks run before the heavy imports). The
baseline is a bare ``python -c pass`` on the same machine. The grid cases are the plan-level faults of issue 53
(their GRID.toml files are written into the temporary folder the cases run in); ``--ray 127.0.0.1:1`` is a closed
port (Ray alone retried it for over 200 s).

    python benchmarks/first_error.py [--repeat 5]

Prints ``time to first error: CASE: MEDIAN s (min MIN s; heavy imports: ...)`` per case, then the plan-level fault
classes of issue 53 (unknown model or partner, missing file, k out of range, overlapping detection / evaluation
sets, non-finite number, colliding names, foreign output folder) by command (``vrh detect``, ``sweep``,
``transfer``, ``reproduce``, ``demo``, ``grid``, the trainer) as a Markdown table: wall seconds, exit status, heavy
imports; ``--only-classes`` runs that table alone. A class that a command has no input for is left out ("n/a" in
the table).

    python benchmarks/first_error.py --only-classes --repeat 3
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
    "three faults at once (all named)": ["sweep", "--model", "toy:typo", "--scores", "MISSING.json", "--data",
                                         "jsonl:MISSING.jsonl", "--out", "X"],
}
# issue 53's fault classes x commands: (class, command) -> argv (the trainer's: its own argv); the files they name
# are written by write_class_files into the folder the cases run in
COMMANDS = ("detect", "sweep", "transfer", "reproduce", "demo", "grid", "trainer")
CLASSES = ("unknown model", "unknown partner", "missing file", "k out of range", "overlapping detect/eval",
           "non-finite number", "colliding names", "foreign --out")
SWEEP = ["sweep", "--model", "toy:a", "--vrhs", "L0H1"]
TRANSFER = ["transfer", "--model", "toy:a", "--scores", "scores.json", "--partner-scores", "scores.json"]
REPRODUCE = ["reproduce", "--data", "synthetic:eval:20"]
CLASS_CASES: dict[tuple[str, str], list[str]] = {
    ("unknown model", "detect"): ["detect", "--model", "toy:typo", "--out", "X"],
    ("unknown model", "sweep"): ["sweep", "--model", "tiny:typo", "--vrhs", "L0H1", "--out", "X"],
    ("unknown model", "demo"): ["demo", "--model", "toy:typo", "--out", "X"],
    ("unknown model", "grid"): ["grid", "unknown-model.toml", "--out", "G"],
    ("unknown model", "trainer"): ["--model", "typo", "--out", "T"],
    ("unknown partner", "demo"): ["demo", "--model", "toy:a", "--transfer-model", "toy:typo", "--out", "X"],
    ("unknown partner", "grid"): ["grid", "unknown-partner.toml", "--out", "G"],
    ("unknown partner", "transfer"): [*TRANSFER, "--partner", "toy:typo", "--out", "X"],
    ("missing file", "transfer"): [*TRANSFER[:-1], "MISSING.json", "--partner", "toy:b", "--out", "X"],
    ("k out of range", "transfer"): [*TRANSFER, "--partner", "toy:b", "--ks", "0,999", "--out", "X"],
    ("colliding names", "transfer"): [*TRANSFER, "--partner", "toy:a", "--out", "X"],
    ("foreign --out", "transfer"): [*TRANSFER, "--partner", "toy:b", "--out", "foreign"],
    ("missing file", "detect"): ["detect", "--model", "toy:a", "--data", "jsonl:MISSING.jsonl", "--out", "X"],
    ("missing file", "sweep"): ["sweep", "--model", "toy:a", "--scores", "MISSING.json", "--out", "X"],
    ("missing file", "demo"): ["demo", "--model", "./no-such-model", "--out", "X"],
    ("missing file", "grid"): ["grid", "missing-data.toml", "--out", "G"],
    ("missing file", "trainer"): ["--warm-start", "NO-SUCH-CHECKPOINT", "--out", "T"],
    ("k out of range", "sweep"): [*SWEEP, "--ks", "0,999", "--out", "X"],
    ("k out of range", "grid"): ["grid", "k-range.toml", "--out", "G"],
    ("k out of range", "trainer"): ["--model", "a", "--warm-start", "CKPT", "--split-heads", "L9H0", "--out", "T"],
    ("overlapping detect/eval", "sweep"): ["sweep", "--model", "toy:a", "--scores", "scores.json", "--data",
                                           "synthetic:detect:20", "--out", "X"],
    ("overlapping detect/eval", "grid"): ["grid", "overlap.toml", "--out", "G"],
    ("non-finite number", "detect"): ["detect", "--model", "toy:a", "--batch-size", "inf", "--out", "X"],
    ("non-finite number", "sweep"): [*SWEEP, "--iou", "nan", "--out", "X"],
    ("non-finite number", "demo"): ["demo", "--budget-seconds", "nan", "--out", "X"],
    ("non-finite number", "grid"): ["grid", "nan.toml", "--out", "G"],
    ("non-finite number", "trainer"): ["--lr", "nan", "--out", "T"],
    ("colliding names", "demo"): ["demo", "--model", "toy:a", "--transfer-model", "toy:a", "--out", "X"],
    ("colliding names", "grid"): ["grid", "collide.toml", "--out", "G"],
    ("colliding names", "trainer"): ["--warm-start", "CKPT", "--out", "CKPT"],
    ("foreign --out", "detect"): ["detect", "--model", "toy:a", "--out", "foreign"],
    ("foreign --out", "sweep"): [*SWEEP, "--out", "foreign"],
    ("foreign --out", "demo"): ["demo", "--model", "toy:a", "--out", "foreign"],
    ("foreign --out", "grid"): ["grid", "ok.toml", "--out", "foreign"],
    ("foreign --out", "trainer"): ["--out", "foreign"],
    ("unknown model", "reproduce"): [*REPRODUCE, "--model", "toy:typo", "--out", "X"],
    ("missing file", "reproduce"): ["reproduce", "--data", "jsonl:MISSING.jsonl", "--model", "toy:a", "--out", "X"],
    ("overlapping detect/eval", "reproduce"): ["reproduce", "--data", "synthetic:eval:20:role=detection", "--model",
                                               "toy:a", "--out", "X"],
    ("foreign --out", "reproduce"): [*REPRODUCE, "--model", "toy:a", "--out", "foreign"],
}
CLASS_FILES: dict[str, str] = {
    "unknown-model.toml": "[models.a]\nmodel = 'toy:typo'\n" + BENCH,
    "unknown-partner.toml": ("experiments = ['detect', 'transfer']\n" + MODEL + BENCH
                             + "[[transfer]]\nmodels = ['a', 'z']\n"),
    "missing-data.toml": MODEL + "[benchmarks.x]\ndetect = 'jsonl:MISSING.jsonl'\neval = 'synthetic:eval:2'\n",
    "k-range.toml": "[options]\nks = '0,999'\nsummary_k = 999\n" + MODEL + BENCH,
    "overlap.toml": MODEL + "[benchmarks.x]\ndetect = 'synthetic:detect:4'\neval = 'synthetic:detect:2'\n",
    "foreign/notes.txt": "not a vrh run\n",
    "CKPT/config.json": "{}\n",
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


def write_class_files(folder: str) -> None:
    """The files the class cases name, and ``scores.json``: head scores of toy:a's 4 x 8 heads detected on
    synthetic:detect:200 (its sample ids are what overlaps)."""
    import numpy as np

    from vrh_interp.data.sources import synthetic_samples
    from vrh_interp.scoring.design import resolve_design
    from vrh_interp.scoring.scores import HeadScores

    for name, content in CLASS_FILES.items():
        path = Path(folder) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    ids = [s.sample_id for s in synthetic_samples("detect", 200)]
    HeadScores(scores=np.arange(32, dtype=float).reshape(4, 8), design=resolve_design("vrh"), sample_ids=ids,
               provenance={"model": {"model_id": "vrh-interp/toy-a", "geometry": {"layers": 4, "heads": 8}}}
               ).save(Path(folder) / "scores.json")


def class_table(folder: str, repeat: int) -> None:
    """The fault classes x commands as a Markdown table: median wall seconds, exit status, heavy imports."""
    cells: dict[tuple[str, str], str] = {}
    for number, ((fault, command), argv) in enumerate(CLASS_CASES.items()):
        probe = TRAINER_PROBE if command == "trainer" else PROBE
        # an output folder of its own per case and run (a command that was not refused leaves one behind)
        runs = [run_case([f"{a}-{number}-{i}" if a in ("X", "G", "T") else a for a in argv], folder, probe)
                for i in range(repeat)]
        codes = ",".join(map(str, sorted({code for _, code, _ in runs})))
        seconds = statistics.median(s for s, _, _ in runs)
        cells[fault, command] = f"{seconds:.2f} s, exit {codes}, {runs[-1][2] or 'no torch'}"
        print(f"class {fault} / {command}: {cells[fault, command]}", flush=True)
    print("\n| class | " + " | ".join(COMMANDS) + " |\n|---|" + "---|" * len(COMMANDS))
    for fault in CLASSES:
        print(f"| {fault} | " + " | ".join(cells.get((fault, c), "n/a") for c in COMMANDS) + " |")


def run_case(argv: list[str], folder: str, probe: str = PROBE, timeout: float = 60) -> tuple[float, int, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", probe, *argv], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:  # not refused: the command went on to work
        return time.perf_counter() - start, -1, "? (still running: stopped)"
    seconds = time.perf_counter() - start
    heavy = next((line[6:] for line in done.stderr.splitlines() if line.startswith("HEAVY=")), "?")
    return seconds, done.returncode, heavy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only-classes", action="store_true", help="only the fault classes x commands table")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        base = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            base.append(time.perf_counter() - start)
        print(f"python -c pass (baseline): {statistics.median(base):.3f} s")
        write_grid_files(folder)
        write_class_files(folder)
        if args.only_classes:
            class_table(folder, args.repeat)
            return
        cases = [(name, argv, PROBE) for name, argv in CASES.items()]
        cases += [(name, argv, TRAINER_PROBE) for name, argv in TRAINER_CASES.items()]
        for name, argv, probe in cases:
            runs = [run_case(argv, folder, probe) for _ in range(args.repeat)]
            codes = {code for _, code, _ in runs}
            seconds = [s for s, _, _ in runs]
            print(f"time to first error: {name}: {statistics.median(seconds):.3f} s (min {min(seconds):.3f} s; "
                  f"exit {','.join(map(str, sorted(codes)))}; heavy imports: {runs[-1][2] or 'none'})")
        class_table(folder, args.repeat)


if __name__ == "__main__":
    main()
