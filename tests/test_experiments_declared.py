"""Experiments are declared once (``vrh_interp.experiments.declared``) and everything reads the declarations.

The registry is complete (every ``vrh`` command that writes a run folder has a declaration, every record log the
package opens is keyed), the core names no experiment, the declarations' functions lie in the experiments layer
or below, and the worked example of docs/architecture.md holds: an experiment declared in one module (here, this
test module) is a ``vrh`` subcommand that resumes under its folder's lock and whose shards ``merge_runs`` joins,
without editing any other module.
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path
from typing import Any, Iterator

import pytest
from dataclasses import dataclass

from vrh_interp.experiments.spec import RunSpec, data_spec, non_negative_int, option, positive_int, shard

from tests.test_architecture import LAYERS, layer_of
from vrh_interp.apps.cli import build_parser, main
from vrh_interp.evaluation.claims import CLAIMS
from vrh_interp.experiments import declared
from vrh_interp.experiments.declared import Experiment

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vrh_interp"


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


# ------------------------------------------------------------------ the registry is complete
def test_every_command_that_writes_a_run_folder_is_a_declared_resumable_experiment():
    commands = _subcommands()
    writing = {name for name, p in commands.items() if any("--out" in a.option_strings for a in p._actions)}
    assert writing >= {"detect", "sweep", "scan", "design-space", "reproduce", "demo", "patch", "grid", "localize"}
    undeclared = sorted(c for c in writing if declared.by_command(c) is None)
    assert not undeclared, f"commands writing a run folder without a declaration: {undeclared}"
    assert writing == set(declared.resumable_commands())
    assert {e.command for e in declared.experiments() if e.command} <= set(commands)
    assert declared.by_command("merge") is None and declared.by_command("report") is None


def test_declarations_are_consistent():
    names = [e.name for e in declared.experiments()]
    assert len(set(names)) == len(names)
    logs = [e.log for e in declared.experiments() if e.log]
    assert sorted(logs) == ["detect_records", "localize_records", "steer_records", "sweep_records",
                            "vqa_records"]  # old stems kept
    for claim, spec in CLAIMS.items():  # a claim names the experiment that measures it, and only there
        assert spec.experiment in names, claim
    for experiment in declared.experiments():
        if experiment.log:
            assert experiment.record_key, experiment.name
    # the keys old run folders were read with
    assert declared.record_key("x/detect_records.jsonl") == ("sample_id",)
    assert declared.record_key("sweep_records.jsonl") == ("sample_id", "condition")
    assert declared.record_key("vqa_records.jsonl") == ("benchmark", "sample_id", "condition")
    assert declared.record_key("other.jsonl") is None
    assert {e.name for e in declared.mergeable()} == {"detect", "sweep", "vqa_sweep"}


def test_the_detection_writer_keys_its_log_as_declared():
    from vrh_interp.scoring import detect  # methods layer: below the declarations, so it holds its own constants

    assert (detect.LOG, detect.RECORD_KEY) == (declared.experiment("detect").log,
                                               declared.experiment("detect").record_key)


@pytest.mark.parametrize("experiment", declared.BUILTIN, ids=lambda e: e.name)
def test_declared_functions_resolve_in_the_experiments_layer_or_below(experiment: Experiment):
    experiments_layer = [name for name, _ in LAYERS].index("experiments")
    for field in ("summary", "merge_files", "merge", "spec", "run", "show", "demo"):
        reference = getattr(experiment, field)
        if reference is None:
            continue
        assert callable(experiment.resolve(field)), reference
        module = reference.partition(":")[0]
        # what a run (or a merge of its shards) prints is the apps'; what runs, a demo step included, is the
        # experiments layer's
        top = experiments_layer + (field in ("show", "merge"))
        assert 0 <= layer_of(module) <= top, f"{experiment.name}.{field} = {reference}: above its layer"


def test_a_declaration_without_what_its_features_need_is_refused():
    with pytest.raises(ValueError, match="needs its record_key"):
        Experiment("x", log="x_records")
    with pytest.raises(ValueError, match="merging needs"):
        Experiment("x", log="x_records", record_key=("sample_id",), mergeable=True)
    with pytest.raises(ValueError, match="a runner its spec"):
        Experiment("x", command="x", run="m:f")
    with pytest.raises(ValueError, match="grid's cells"):
        Experiment("x", grid="everywhere")
    with pytest.raises(ValueError, match="already declared by 'sweep'"):
        declared.register(Experiment("other", log="sweep_records", record_key=("sample_id",)))
    with pytest.raises(KeyError, match="no experiment 'nope' is declared"):
        declared.experiment("nope")


# ------------------------------------------------------------------ every record log the package opens is keyed
OTHER_LOGS = {"np", "math", "torch", "numpy"}  # `.log(` of these is a logarithm


def unkeyed_log_opens(source: str) -> list[int]:
    """Lines of ``source`` that open a record log without saying its key: ``RecordLog(...)`` or ``X.log(...)``
    (a run folder's) without ``key_fields=``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        opens = (isinstance(func, ast.Name) and func.id == "RecordLog") or (
            isinstance(func, ast.Attribute) and func.attr == "log"
            and not (isinstance(func.value, ast.Name) and func.value.id in OTHER_LOGS))
        if opens and not any(k.arg == "key_fields" for k in node.keywords):
            lines.append(node.lineno)
    return lines


def test_the_log_scanner_fires_on_a_planted_unkeyed_log():
    assert unkeyed_log_opens('folder.log("toy_records")\nRecordLog(path).read()\nnp.log(p)\n') == [1, 2]
    assert unkeyed_log_opens('folder.log(LOG, key_fields=KEY)\nRecordLog(p, key_fields=None)\n') == []


def test_every_record_log_the_package_opens_is_keyed_by_its_caller():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("runs.py", "declared.py") and path.parent.name in ("bookkeeping", "experiments"):
            continue  # the log class itself, and the declarations' helpers that pass record_key
        lines = unkeyed_log_opens(path.read_text(encoding="utf-8"))
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    assert not found, f"record logs opened without key_fields (use Experiment.open_log / read_log): {found}"


# ------------------------------------------------------------------ the core knows no experiment
def experiment_names() -> set[str]:
    names: set[str] = set()
    for experiment in declared.experiments():
        names |= {experiment.name, *(x for x in (experiment.command, experiment.log) if x)}
        if experiment.log:
            names.add(f"{experiment.log}.jsonl")
    return names


def named_experiments(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, text) of every string literal in ``source`` (f-string parts included) that is an experiment's name,
    command or record log."""
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names]


def test_the_name_scanner_fires_on_a_planted_violation():
    planted = 'KEYS = {"sweep_records": ("sample_id",)}\nif kind == "detect":\n    path = f"{d}/sweep_records.jsonl"\n'
    assert named_experiments(planted, experiment_names()) == [(1, "sweep_records"), (2, "detect")]
    assert named_experiments('"""sweep and detect runs"""\nkind = config["kind"]\n', experiment_names()) == []


def test_the_core_names_no_experiment():
    names = experiment_names()
    found = {str(path.relative_to(ROOT)): hits for path in sorted((PACKAGE / "core").rglob("*.py"))
             if (hits := named_experiments(path.read_text(encoding="utf-8"), names))}
    assert not found, f"vrh_interp/core names experiments (declare them in experiments.declared instead): {found}"


# ------------------------------------------------------------------ the worked example: one module, no other edits
@dataclass(frozen=True, kw_only=True)
class ToyCountSpec(RunSpec):
    """What the toy experiment takes: a sample count, a shard, a planted interruption; ``data`` from a grid's
    evaluation samples (only its count is used)."""

    n: int = option(5, "samples", parse=positive_int)
    data: str = option("synthetic:eval:5", "grounding samples (their count is n when given by a grid)",
                       parse=data_spec, grid="eval")
    shard: Any = option(None, "run shard I of N", parse=shard, metavar="I/N")
    stop_after: int | None = option(None, "interrupt after this many records", parse=non_negative_int)

    def plan_faults(self) -> list[Any]:
        def odd() -> None:
            if self.n == 13:
                raise ValueError("--n 13: unlucky (a plan fault found before any work)")
        return [odd]


TOY = Experiment("toy_count", command="toy-count", help="square numbers, one record per sample (a test's)",
                 log="toy_records", record_key=("sample_id",), order=("sample_id",), resumable=True,
                 mergeable=True, spec=f"{__name__}:ToyCountSpec", run=f"{__name__}:toy_run",
                 show=f"{__name__}:toy_show", grid="benchmark", demo=f"{__name__}:toy_step", demo_order=8.5)


def toy_run(spec: ToyCountSpec, vlm: Any, folder: Path) -> int:
    from vrh_interp.core.bookkeeping.runs import RunFolder
    from vrh_interp.core.bookkeeping.shards import shard_config

    assert vlm is None  # a spec without a model (RunSpec): nothing is loaded
    ids = [f"s{i}" for i in range(spec.n)]
    run = RunFolder(folder, shard_config({"kind": TOY.name, "sample_ids": ids}, spec.shard, 2))
    log = TOY.open_log(run)
    done = {r["sample_id"] for r in log.read()}
    mine = spec.shard.select(ids, 2) if spec.shard is not None else ids
    for count, sample_id in enumerate(i for i in mine if i not in done):
        if spec.stop_after is not None and count == spec.stop_after:
            raise KeyboardInterrupt
        log.append([{"sample_id": sample_id, "square": int(sample_id[1:]) ** 2}])
    return len(log.read())


def toy_show(records: int, spec: ToyCountSpec, as_json: bool) -> int:
    print(json.dumps({"records": records}))
    return 0


def toy_step(run: Any) -> None:
    """Its step in ``vrh demo`` (a ``DemoRun``)."""
    run.evidence["toy"] = None


@pytest.fixture
def toy() -> Iterator[Experiment]:
    declared.register(TOY)
    try:
        yield TOY
    finally:
        declared.unregister(TOY.name)


def _records(folder: Path) -> list[dict[str, Any]]:
    return TOY.read_log(folder).read()


def test_a_declared_experiment_is_a_resumable_command(toy, tmp_path, capsys):
    assert "toy-count" in _subcommands() and "toy-count" in declared.resumable_commands()
    out = tmp_path / "toy"
    assert main(["toy-count", "--out", str(out), "--stop-after", "2"]) == 130
    err = capsys.readouterr().err
    assert "interrupted; what is done is kept in" in err and "vrh toy-count --out" in err  # the resume hint
    assert [r["sample_id"] for r in _records(out)] == ["s0", "s1"]
    assert main(["toy-count", "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out) == {"records": 5}
    assert [r["square"] for r in _records(out)] == [0, 1, 4, 9, 16]  # resumed: nothing redone, nothing twice
    assert (out / "run.lock").exists()  # it ran under the folder's lock, like every resumable command


def test_a_declared_experiment_merges_its_shards_like_the_unsharded_run(toy, tmp_path, capsys):
    from vrh_interp.experiments.merge import merge_runs

    assert main(["toy-count", "--out", str(tmp_path / "whole")]) == 0
    for i in range(2):
        assert main(["toy-count", "--out", str(tmp_path / f"shard{i}"), "--shard", f"{i}/2"]) == 0
    merged = merge_runs(tmp_path / "merged", [tmp_path / "shard1", tmp_path / "shard0"])
    assert (merged.kind, merged.shards, merged.records) == ("toy_count", 2, 5)
    for name in ("toy_records.jsonl", "manifest.json"):
        assert (tmp_path / "merged" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    assert main(["merge", str(tmp_path / "merged-cli"), str(tmp_path / "shard0"), str(tmp_path / "shard1"),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["records"] == 5


def test_unregistering_removes_every_trace(tmp_path):
    declared.register(TOY)
    declared.unregister(TOY.name)
    assert "toy-count" not in _subcommands() and declared.by_log("toy_records") is None
    assert "toy-count" not in declared.resumable_commands() and declared.experiments() == declared.BUILTIN


def test_a_declared_experiment_refuses_its_plan_faults_before_any_work(toy, tmp_path, capsys):
    out = tmp_path / "toy"
    assert main(["toy-count", "--out", str(out), "--n", "13"]) == 2
    assert "unlucky" in capsys.readouterr().err and not out.exists()
    with pytest.raises(SystemExit) as exited:  # the field's parser: a whole number >= 1 (argparse's exit)
        main(["toy-count", "--out", str(out), "--n", "0"])
    assert exited.value.code == 2 and "too small" in capsys.readouterr().err and not out.exists()


def test_a_declared_experiment_is_a_grid_experiment_and_a_demo_step(toy, tmp_path):
    from vrh_interp.experiments.demo import demo_steps
    from vrh_interp.experiments.grid import GridSpecError, parse_grid
    from vrh_interp.experiments.grid_execution import run_grid

    text = ('experiments = ["toy_count"]\n[toy_count]\nn = 3\n[models.a]\nmodel = "toy:a"\n'
            '[benchmarks.x]\ndetect = "synthetic:detect:2"\neval = "synthetic:eval:2"\n')
    result = run_grid(parse_grid(text), tmp_path / "grid", progress=False)
    assert not result.failed, result.status
    assert [c.id for c in result.cells] == ["detect:a:x", "toy_count:a:x"]
    assert [r["square"] for r in _records(tmp_path / "grid" / "cells/a/x/toy_count")] == [0, 1, 4]
    with pytest.raises(GridSpecError, match=r"GRID.toml \[toy_count\]: n = 0: 0 is too small"):
        parse_grid(text.replace("n = 3", "n = 0"))
    steps = [declared.name for declared, _ in demo_steps()]
    assert steps.index("transfer") < steps.index("toy_count") < steps.index("vqa_sweep")  # demo_order 8.5
