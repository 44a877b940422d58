"""Issue 53: every plan-level fault class (unknown model or partner, missing file, k out of range, overlapping
detection / evaluation samples, non-finite number, colliding names, foreign output folder) refused by ``vrh detect``,
``sweep``, ``demo``, ``grid`` and the trainer (``python -m toy_training.train``) with exit status 2 and one line
naming the option or field, before torch is imported (so in well under a second; ``benchmarks/first_error.py`` times
it: no timing is asserted here). Each case runs the real entry point in a fresh interpreter that reports whether
torch was imported. A class a command has no input for is not listed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL = "[models.a]\nmodel = 'toy:a'\n"
BENCH = "[benchmarks.x]\ndetect = 'synthetic:detect:2'\neval = 'synthetic:eval:2'\n"
FILES = {
    "ok.toml": MODEL + BENCH,
    "unknown-model.toml": "[models.a]\nmodel = 'toy:typo'\n" + BENCH,
    "unknown-partner.toml": ("experiments = ['detect', 'transfer']\n" + MODEL + BENCH
                             + "[[transfer]]\nmodels = ['a', 'z']\n"),
    "missing-data.toml": MODEL + "[benchmarks.x]\ndetect = 'jsonl:MISSING.jsonl'\neval = 'synthetic:eval:2'\n",
    "k-range.toml": "[options]\nks = '0,999'\nsummary_k = 999\n" + MODEL + BENCH,
    "overlap.toml": MODEL + "[benchmarks.x]\ndetect = 'synthetic:detect:4'\neval = 'synthetic:detect:2'\n",
    "nan.toml": MODEL + "gpus = nan\n" + BENCH,
    "collide.toml": MODEL + BENCH + BENCH.replace(".x]", ".X]"),
    "foreign/notes.txt": "not a vrh run\n",
    "CKPT/config.json": "{}\n",
    # head scores of toy:a detected on synthetic:detect:3 (the ids are what the overlap check reads)
    "scores.json": '{"format": "vrh-interp/head-scores/1", "sample_ids": ["detect-0-L1-o0", "detect-1-L1-o1", '
                   '"detect-2-L1-o2"]}',
}
CLASSES = ("unknown model", "unknown partner", "missing file", "k out of range", "overlapping detect/eval",
           "non-finite number", "colliding names", "foreign --out")
SWEEP = ["sweep", "--model", "toy:a", "--vrhs", "L0H1"]
# (class, command) -> (argv, words the one error line holds)
CASES: dict[tuple[str, str], tuple[list[str], str]] = {
    ("unknown model", "detect"): (["detect", "--model", "toy:typo", "--out", "X"], "--model 'toy:typo': no such toy"),
    ("unknown model", "sweep"): (["sweep", "--model", "tiny:typo", "--vrhs", "L0H1", "--out", "X"],
                                 "--model 'tiny:typo': no such tiny family"),
    ("unknown model", "demo"): (["demo", "--model", "toy:typo", "--out", "X"], "--model 'toy:typo': no such toy"),
    ("unknown model", "grid"): (["grid", "unknown-model.toml", "--out", "G"],
                                "GRID.toml [models.a]: model = 'toy:typo': no such toy model"),
    ("unknown model", "trainer"): (["--model", "typo", "--out", "T"], "argument --model: invalid choice: 'typo'"),
    ("unknown partner", "demo"): (["demo", "--model", "toy:a", "--transfer-model", "toy:typo", "--out", "X"],
                                  "--transfer-model 'toy:typo': no such toy model"),
    ("unknown partner", "grid"): (["grid", "unknown-partner.toml", "--out", "G"], "'z' is not a model of the grid"),
    ("missing file", "detect"): (["detect", "--model", "toy:a", "--data", "jsonl:MISSING.jsonl", "--out", "X"],
                                 "the data file does not exist"),
    ("missing file", "sweep"): (["sweep", "--model", "toy:a", "--scores", "MISSING.json", "--out", "X"],
                                "--scores 'MISSING.json': the file does not exist"),
    ("missing file", "demo"): (["demo", "--model", "./no-such-model", "--out", "X"], "does not exist"),
    ("missing file", "grid"): (["grid", "missing-data.toml", "--out", "G"],
                               "[benchmarks.x]: detect = jsonl:MISSING.jsonl: 'MISSING.jsonl': the data file does not"),
    ("missing file", "trainer"): (["--warm-start", "NO-SUCH-CHECKPOINT", "--out", "T"],
                                  "--warm-start 'NO-SUCH-CHECKPOINT' is not there"),
    ("k out of range", "sweep"): ([*SWEEP, "--ks", "0,999", "--out", "X"], "--ks 0,999: k 999 is more than the 32"),
    ("k out of range", "sweep heads"): (["sweep", "--model", "toy:a", "--vrhs", "L9H1", "--out", "X"],
                                        "--vrhs L9H1: L9H1 is not a head of toy:a"),
    ("k out of range", "grid"): (["grid", "k-range.toml", "--out", "G"],
                                 "GRID.toml [options]: ks = 0,999: k 999 is more than the 32 heads of toy:a"),
    ("k out of range", "trainer"): (["--warm-start", "CKPT", "--split-heads", "L9H0", "--out", "T"],
                                    "--split-heads L9H0: L9H0 is not a head of the a model"),
    ("overlapping detect/eval", "sweep"): (["sweep", "--model", "toy:a", "--scores", "scores.json", "--data",
                                            "synthetic:detect:20", "--out", "X"],
                                           "--data synthetic:detect:20 overlaps the samples the --scores"),
    ("overlapping detect/eval", "grid"): (["grid", "overlap.toml", "--out", "G"],
                                          "eval = synthetic:detect:2 overlaps GRID.toml [benchmarks.x]: detect ="),
    ("non-finite number", "detect"): (["detect", "--model", "toy:a", "--batch-size", "inf", "--out", "X"],
                                      "argument --batch-size: 'inf' is not a whole number"),
    ("non-finite number", "sweep"): ([*SWEEP, "--iou", "nan", "--out", "X"], "argument --iou: nan is outside"),
    ("non-finite number", "demo"): (["demo", "--budget-seconds", "nan", "--out", "X"],
                                    "argument --budget-seconds: nan is outside"),
    ("non-finite number", "grid"): (["grid", "nan.toml", "--out", "G"], "gpus = nan must be a finite number"),
    ("non-finite number", "trainer"): (["--lr", "nan", "--out", "T"], "argument --lr: nan is out of range"),
    ("colliding names", "demo"): (["demo", "--model", "toy:a", "--transfer-model", "toy:a", "--out", "X"],
                                  "--transfer-model 'toy:a' is the main model"),
    ("colliding names", "grid"): (["grid", "collide.toml", "--out", "G"], "would write into the same folder"),
    ("colliding names", "trainer"): (["--warm-start", "CKPT", "--out", "CKPT"],
                                     "--out 'CKPT' is the --warm-start folder"),
    ("foreign --out", "detect"): (["detect", "--model", "toy:a", "--out", "foreign"], "no vrh run made"),
    ("foreign --out", "sweep"): ([*SWEEP, "--out", "foreign"], "no vrh run made"),
    ("foreign --out", "demo"): (["demo", "--model", "toy:a", "--out", "foreign"], "no vrh run made"),
    ("foreign --out", "grid"): (["grid", "ok.toml", "--out", "foreign"], "no vrh run made"),
    ("foreign --out", "trainer"): (["--out", "foreign"], "--out 'foreign' holds notes.txt but no trainer run"),
    # vrh reproduce: the list of its steps' specs, each checked with it before the model loads
    ("unknown model", "reproduce"): (["reproduce", "--data", "synthetic:eval:20", "--model", "toy:typo", "--out", "X"],
                                     "--model 'toy:typo': no such toy"),
    ("missing file", "reproduce"): (["reproduce", "--data", "jsonl:MISSING.jsonl", "--model", "toy:a", "--out", "X"],
                                    "--data jsonl:MISSING.jsonl: 'MISSING.jsonl': the data file does not exist"),
    ("overlapping detect/eval", "reproduce"): (["reproduce", "--data", "synthetic:eval:20:role=detection", "--model",
                                                "toy:a", "--out", "X"], "vrh reproduce splits the benchmark itself"),
    ("foreign --out", "reproduce"): (["reproduce", "--data", "synthetic:eval:20", "--model", "toy:a", "--out",
                                      "foreign"], "--out 'foreign' is a folder that no vrh run made"),
}
# the entry point, then one line saying whether torch was imported, printed on exit whatever happens
PROBE = ("import atexit, sys\n"
         "atexit.register(lambda: print('TORCH=' + str('torch' in sys.modules), file=sys.stderr))\n"
         "from vrh_interp.apps.cli import main\n"
         "sys.exit(main(sys.argv[1:]))\n")
TRAINER_PROBE = ("import atexit, runpy, sys\n"
                 "atexit.register(lambda: print('TORCH=' + str('torch' in sys.modules), file=sys.stderr))\n"
                 "sys.argv = ['train', *sys.argv[1:]]\n"
                 "runpy.run_module('toy_training.train', run_name='__main__', alter_sys=True)\n")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the cases name (grid files, a foreign folder, a checkpoint folder, a scores file)."""
    root = tmp_path_factory.mktemp("faults")
    for name, content in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content, encoding="utf-8")
    return root


@pytest.mark.parametrize("fault, command", list(CASES), ids=[f"{c}-{f}" for f, c in CASES])
def test_a_plan_fault_is_refused_in_one_line_before_torch(fault: str, command: str, folder: Path) -> None:
    argv, words = CASES[fault, command]
    outputs = {a: f"{a}-{command}-{CLASSES.index(fault)}" for a in ("X", "G", "T")}  # one per case: none shared
    argv = [outputs.get(a, a) for a in argv]
    probe = TRAINER_PROBE if command == "trainer" else PROBE
    done = subprocess.run([sys.executable, "-c", probe, *argv], cwd=folder, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 2 and words in lines[0] and lines[0].startswith(("vrh ", "python -m toy_training.train")), \
        done.stderr
    assert lines[1] == "TORCH=False", f"torch was imported before the refusal: {done.stderr}"
    assert not any((folder / out).exists() for out in outputs.values()), "an output folder was left behind"


def test_the_trainer_head_grids_are_its_presets() -> None:
    """``options.HEAD_GRIDS`` (the refusal of --split-heads / --share-attention beyond a model) is each preset's
    backbone."""
    import toy_training.train as trainer
    from toy_training import options
    from toy_training.configs import TextBackboneShape

    for name, preset in trainer.MODEL_PRESETS.items():
        shape = preset.get("text_shape", TextBackboneShape())
        assert options.HEAD_GRIDS[name] == (shape.num_hidden_layers, shape.num_attention_heads), name


def test_the_toy_head_grids_read_from_config_are_the_loaded_models() -> None:
    """``spec_checks.head_grid`` (no weights) agrees with the loaded model's geometry, for a toy and a tiny model."""
    from vrh_interp.experiments.spec_checks import head_grid
    from vrh_interp.specs import load_spec

    for spec in ("toy:a", "tiny:llava_next_llama3"):
        geometry = load_spec(spec).geometry
        assert head_grid(spec) == (geometry.num_layers, geometry.num_heads), spec
