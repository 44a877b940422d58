"""Issue 53: one spec per experiment (``experiments.spec``), checked whole before any work.

The command line is generated from the spec's fields, GRID.toml tables parse into the same specs with the same
parsers, ``check()`` reports every fault at once before torch is imported, and a declared experiment's grid cell
runs the very runner its command runs (the files are the same bytes)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vrh_interp.apps.cli import build_parser, main
from vrh_interp.experiments import declared
from vrh_interp.experiments.builtin_specs import PatchSpec, ScanSpec, SweepSpec, TransferSpec, VQASweepSpec
from vrh_interp.experiments.spec import ExperimentSpec, SpecError

ROOT = Path(__file__).resolve().parents[1]


def _subparser(command: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


@pytest.mark.parametrize("experiment", declared.spec_commands(), ids=lambda e: e.name)
def test_a_spec_commands_options_are_its_fields(experiment: declared.Experiment) -> None:
    spec_class = experiment.resolve("spec")
    options = {a.dest: a for a in _subparser(experiment.command)._actions if a.option_strings and a.dest != "help"}
    fields = {item.name: opt for item, opt in spec_class.options() if opt.cli}
    flagged = {name for name, opt in fields.items() if not opt.positional}  # a positional has no option string
    assert set(options) - {"json"} == flagged, experiment.name
    for name, action in options.items():
        if name != "json":
            assert action.option_strings[0] == spec_class.flag(name)
    defaults = build_parser().parse_args([experiment.command, *_required(spec_class)])
    given = {n: getattr(defaults, n) for n in fields}
    assert spec_class.from_args(defaults) == spec_class(**{n: tuple(v) if isinstance(v, list) else v
                                                          for n, v in given.items()})


def _required(spec_class: type) -> list[str]:
    """Arguments a spec's command cannot go without (a file or a model the spec requires)."""
    needed = {"scores": ["--scores", "s.json"], "partner": ["--partner", "toy:b"],
              "partner_scores": ["--partner-scores", "p.json"], "data": ["--data", "synthetic:eval:3"]}
    positional = [f"{item.name}.toml" for item, opt in spec_class.options() if opt.positional]
    return positional + [arg for item, opt in spec_class.options() if opt.required or opt.group
                         for arg in needed.get(item.name, []) if item.name != "vrhs"]


def test_a_true_field_is_a_no_flag_and_the_flag_turns_it_off() -> None:
    args = build_parser().parse_args(["sweep", "--scores", "s.json", "--no-live", "--no-matched"])
    spec = SweepSpec.from_args(args)
    assert (spec.live, spec.matched, spec.exclude_first_layer) == (False, False, False)
    assert SweepSpec.flag("live") == "--no-live" and SweepSpec.flag("exclude_first_layer") == "--exclude-first-layer"


@pytest.mark.parametrize("key, value, words", [
    ("ks", "0,x", "'x' is neither a head count nor a percentage"),
    ("random_sets", 0, "0 is too small: use a whole number >= 1"),
    ("iou", 2.0, "2.0 is outside 0 .. 1"),
    ("seeds", "1,1", "is not a list of distinct seeds"),
])
def test_a_grid_table_is_refused_in_the_words_of_the_command_line(key: str, value: object, words: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SpecError, match=rf"GRID.toml \[sweep\]: {key} = .*{words}"):
        SweepSpec.from_table({key: value}, "GRID.toml [sweep]")
    with pytest.raises(SystemExit):  # the command line: the same parser, the same words
        build_parser().parse_args(["sweep", "--scores", "s.json", SweepSpec.flag(key), str(value)])
    assert words in capsys.readouterr().err


def test_a_choice_outside_the_choices_is_refused() -> None:
    with pytest.raises(SpecError, match=r"ablation = 'blur': use one of zero, mean, resample"):
        SweepSpec.from_table({"ablation": "blur"}, "GRID.toml [sweep]")


def test_a_grid_table_refuses_unknown_keys_wrong_kinds_and_non_finite_numbers() -> None:
    with pytest.raises(SpecError, match=r"unknown key 'limt'; the keys are out, model"):
        ScanSpec.from_table({"limt": 3}, "GRID.toml [scan]")
    with pytest.raises(SpecError, match=r"live = 'yes' is not true or false"):
        SweepSpec.from_table({"live": "yes"}, "GRID.toml [sweep]")
    with pytest.raises(SpecError, match=r"iou = nan must be a finite number"):
        SweepSpec.from_table({"iou": float("nan")}, "GRID.toml [sweep]")
    assert SweepSpec.from_table({"ks": [0, 1, "2%"], "live": False}, "w").ks == "0,1,2%"  # a TOML list reads as text


def test_every_fault_is_reported_at_once(tmp_path: Path) -> None:
    spec = SweepSpec(model="toy:typo", scores=str(tmp_path / "missing.json"), data="jsonl:" + str(tmp_path / "no"),
                     out=str(tmp_path / "out"))
    faults = spec.faults()
    assert len(faults) == 3, faults  # the scores file, the data file, the model: none hides another
    with pytest.raises(SpecError, match=r"^3 faults: .*missing.json.*no such toy model"):
        spec.check()
    assert SweepSpec(model="toy:a", vrhs="L0H1", out=str(tmp_path / "out")).faults() == []  # the guard is quiet
    with pytest.raises(ValueError, match="--scores is required"):  # a required field made in Python
        ScanSpec(out=str(tmp_path / "o")).check()


def _vrh(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """``vrh ARGV`` in a fresh interpreter that reports on stderr whether torch was imported."""
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('TORCH=' + str('torch' in sys.modules), file=sys.stderr))\n"
            "from vrh_interp.apps.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("argv, words", [
    (["transfer", "--model", "toy:a", "--partner", "toy:a", "--scores", "s.json", "--partner-scores", "s.json"],
     "--partner 'toy:a' is --model: cross-masking a model with itself"),
    (["transfer", "--model", "toy:a", "--partner", "toy:typo", "--scores", "s.json", "--partner-scores", "s.json"],
     "--partner 'toy:typo': no such toy model"),
    (["vqa-sweep", "--model", "toy:a", "--scores", "s.json"], "--vqa is required"),
    (["sweep", "--model", "toy:typo", "--scores", "missing.json"], "2 faults: "),
    (["patch", "--model", "toy:a", "--scores", "missing.json"], "--scores 'missing.json': the file does not exist"),
    (["demo", "--model", "toy:typo", "--transfer-model", "toy:zz"], "2 faults: "),
    (["demo", "--model", "toy:a", "--transfer-model", "toy:a"], "--transfer-model 'toy:a' is the main model"),
    (["grid", "missing.toml"], "grid file missing.toml does not exist"),
    (["reproduce", "--data", "jsonl:missing.jsonl", "--model", "toy:typo"], "2 faults: "),
])
def test_the_new_commands_refuse_plan_faults_before_torch(argv: list[str], words: str, tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text('{"sample_ids": []}')
    done = _vrh(*argv, "--out", "X", cwd=tmp_path)
    lines = [line for line in done.stderr.splitlines() if not line.startswith("TORCH=")]
    assert done.returncode == 2 and len(lines) == 1 and words in lines[0], done.stderr
    assert "TORCH=False" in done.stderr and not (tmp_path / "X").exists()


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "run.lock" and p.suffix != ".png"}


def test_a_grid_cell_is_the_commands_run(tmp_path: Path) -> None:
    """The grid's scan cell and ``vrh scan`` on the same spec write the same records and tables, byte for byte."""
    from vrh_interp.experiments.grid import parse_grid
    from vrh_interp.experiments.grid_execution import run_grid

    text = ('experiments = ["scan"]\n[options]\nbatch_size = 4\n[scan]\nlimit = 2\nheads = "L0H1,L1H2"\n'
            '[models.a]\nmodel = "toy:a"\n[benchmarks.x]\ndetect = "synthetic:detect:2"\neval = "synthetic:eval:2"\n')
    result = run_grid(parse_grid(text), tmp_path / "grid", progress=False)
    assert not result.failed, result.status
    scores = tmp_path / "grid/cells/a/x/detect/scores-vrh.json"
    direct = tmp_path / "direct"
    assert main(["scan", "--model", "toy:a", "--scores", str(scores), "--data", "synthetic:eval:2", "--limit", "2",
                 "--heads", "L0H1,L1H2", "--batch-size", "4", "--out", str(direct), "--json"]) == 0
    cell, alone = _files(tmp_path / "grid/cells/a/x/scan"), _files(direct)
    assert sorted(cell) == sorted(alone)
    for name in cell:
        if name != "scan/manifest.json":  # its provenance names the run's time
            assert cell[name] == alone[name], name


def test_vrh_transfer_and_vqa_sweep_are_the_library_calls(tmp_path: Path) -> None:
    """The two commands made from their declarations write what the library functions write."""
    from vrh_interp.data.sources import load_data, load_vqa
    from vrh_interp.experiments.transfer import cross_masking
    from vrh_interp.experiments.vqa_sweep import vqa_sweep
    from vrh_interp.scoring.scores import HeadScores
    from vrh_interp.specs import load_spec

    for model in ("a", "b"):
        assert main(["detect", "--model", f"toy:{model}", "--data", "synthetic:detect:2", "--batch-size", "4",
                     "--out", str(tmp_path / model), "--json"]) == 0
    a_scores, b_scores = (str(tmp_path / m / "scores-vrh.json") for m in ("a", "b"))
    assert main(["transfer", "--model", "toy:a", "--partner", "toy:b", "--scores", a_scores, "--partner-scores",
                 b_scores, "--data", "synthetic:eval:2", "--ks", "0,1", "--random-sets", "2", "--batch-size", "4",
                 "--out", str(tmp_path / "t"), "--json"]) == 0
    vlm_a, vlm_b = load_spec("toy:a"), load_spec("toy:b")
    direct = cross_masking(vlm_a, vlm_b, HeadScores.load(a_scores), HeadScores.load(b_scores),
                           load_data("synthetic:eval:2"), ks=[0, 1], random_seeds=range(2), labels=("A", "B"),
                           batch_size=4, progress=False)
    assert (tmp_path / "t/cross_masking_summary.csv").read_text() == direct.summary().to_csv(index=False)
    assert main(["vqa-sweep", "--model", "toy:a", "--scores", a_scores, "--vqa", "synthetic:eval:2", "--vqa-k", "1",
                 "--random-sets", "2", "--batch-size", "4", "--out", str(tmp_path / "v"), "--json"]) == 0
    direct_vqa = vqa_sweep(vlm_a, list(load_vqa("synthetic:eval:2")), HeadScores.load(a_scores).top(1),
                           random_seeds=range(2), batch_size=4, progress=False)
    assert (tmp_path / "v/vqa_summary.csv").read_text() == direct_vqa.summary().to_csv(index=False)


def test_specs_are_frozen_and_their_fields_typed() -> None:
    for spec_class in (SweepSpec, ScanSpec, VQASweepSpec, TransferSpec, PatchSpec):
        assert issubclass(spec_class, ExperimentSpec) and dataclasses.is_dataclass(spec_class)
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec_class().model = "toy:b"  # type: ignore[misc]
    assert json.loads(json.dumps(dataclasses.asdict(SweepSpec()))) == dataclasses.asdict(SweepSpec())


def test_scores_of_a_larger_head_grid_are_refused_before_the_model_loads(tmp_path: Path) -> None:
    from vrh_interp.experiments.spec_checks import scores_grid

    path = tmp_path / "scores.json"
    path.write_text(json.dumps({"scores": [[0.0] * 16] * 4, "sample_ids": []}))  # toy:planted's 4 x 16 grid
    assert scores_grid(str(path)) == (4, 16, "a model the scores file does not name")
    with pytest.raises(ValueError, match=r"\(4 layers x 16 heads\), but this model \(toy:a\) has 4 layers x 8"):
        SweepSpec(model="toy:a", scores=str(path), out=str(tmp_path / "o")).check()
    assert SweepSpec(model="toy:c", scores=str(path), out=str(tmp_path / "o")).faults() == []  # 8 x 16 holds it
    with pytest.raises(ValueError, match=r"--partner-scores"):
        TransferSpec(model="toy:c", partner="toy:a", scores=str(path), partner_scores=str(path),
                     out=str(tmp_path / "o")).check()


def test_every_command_that_runs_an_experiment_is_made_from_its_spec() -> None:
    """The drivers are specs too: ``vrh demo``, ``reproduce`` and ``grid`` are declared with a spec and run by
    ``cmd_spec`` like every experiment; only the commands that run none keep a hand-written parser."""
    commands = set(next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices)
    made = {e.command for e in declared.spec_commands()}
    assert commands - made == {"families", "merge", "report"}
    assert {"demo", "reproduce", "grid"} <= made


def test_a_positional_field_is_an_argument_without_a_flag() -> None:
    from vrh_interp.experiments.grid import GridRunSpec

    args = build_parser().parse_args(["grid", "G.toml", "--out", "o", "--yes"])
    spec = GridRunSpec.from_args(args)
    assert (spec.grid, spec.out, spec.yes, spec.ray) == ("G.toml", "o", True, None)
    assert GridRunSpec.flag("grid") == "GRID"
