"""``vrh grid``: GRID.toml parsing, the plan, the local executor's summary, and the Ray executor equal to it (a local
Ray cluster of 2 CPUs started and stopped here): a worker killed mid-cell by its PID is retried from the cell's
records, a killed driver is rerun and the grid resumes; every cell's records equal the local executor's byte for
byte. The grid is 2 x 2 (toy:a, toy:b x two synthetic benchmarks) at a few samples and two control sets per kind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from vrh_interp.experiments.grid import (GRID_FILE, HEATMAP, SUMMARY_CSV, GridSpecError, cell_resources, parse_grid,
                                         plan_cells)
from vrh_interp.experiments.grid_execution import read_status, run_grid, status_path

GRID = """
[options]
ks = "0,1"
random_sets = 2
batch_size = 4
max_batch_rows = 4   # one condition per generation: a sweep cell takes several passes (the kill tests need them)
live = false         # the census per cell: test_grid_sweep_draws_live_head_controls_from_the_census

[models.a]
model = "toy:a"

[models.b]
model = "toy:b"

[benchmarks.easy]
detect = "synthetic:detect:2:0"
eval = "synthetic:eval:3:0"

[benchmarks.hard]
detect = "synthetic:detect:2:2"
eval = "synthetic:eval:3:2"
"""


def _files(grid_dir: Path) -> dict[str, bytes]:
    """Every file the cells wrote (records, statistics, manifests, summaries), without the lock files and the scores
    files (their provenance holds a creation time)."""
    return {str(p.relative_to(grid_dir)): p.read_bytes() for top in ("cells", "transfer")
            for p in sorted((grid_dir / top).rglob("*"))
            if p.is_file() and p.name != "run.lock" and not p.name.startswith("scores-")}


def _attempts(grid_dir: Path, cell_id: str) -> list[dict]:
    path = status_path(grid_dir, cell_id).with_suffix(".attempts.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def grid_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("grid") / "GRID.toml"
    path.write_text(GRID)
    return path


@pytest.fixture(scope="module")
def local(grid_file: Path) -> Path:
    out = grid_file.parent / "local"
    result = run_grid(grid_file, out, progress=False)
    assert not result.failed, result.status
    return out


# ------------------------------------------------------------------------------------------------ parsing, plan

BENCH = "[benchmarks.x]\ndetect = 'synthetic:detect:2'\neval = 'synthetic:eval:2'\n"
MODEL = "[models.a]\nmodel = 'toy:a'\n"


@pytest.mark.parametrize("text, message", [
    ("[models.a]\nmodel = 3\n" + BENCH, "GRID.toml [models.a]: model = 3 is not a model spec"),
    (MODEL + "devcie = 'cpu'\n" + BENCH, "[models.a]: unknown key 'devcie'"),
    (MODEL + "[benchmarks.x]\ndetect = 'synthetic:detect:2'\n", "[benchmarks.x]: missing 'eval'"),
    (MODEL + "[benchmarks.x]\ndetect = 'nosuch:1'\neval = 'synthetic:eval:2'\n", "[benchmarks.x]: detect = 'nosuch:1'"),
    ("experiments = ['sweep', 'dance']\n" + MODEL + BENCH, "unknown experiment 'dance'"),
    ("[options]\nks = '0,x'\n" + MODEL + BENCH, "[options]: ks = '0,x': k value 'x'"),
    ("[options]\nrandom_sets = 0\n" + MODEL + BENCH, "random_sets = 0: 0 is too small: use a whole number >= 1"),
    ("[options]\nrandom_sets = 'many'\n" + MODEL + BENCH, "random_sets = 'many': 'many' is not a whole number"),
    (MODEL + "remote = 'yes'\n" + BENCH, "remote = 'yes'"),
    ("[models]\n" + BENCH, "[models] is empty"),
    (MODEL, "no [benchmarks.NAME] tables"),
    ("experiments = ['vqa_sweep']\n" + MODEL + BENCH, "there is no [vqa.NAME] table"),
    ("[options]\nlive = 'yes'\n" + MODEL + BENCH, "live = 'yes' is not true or false"),
    ("models = [", "not valid TOML"),
])
def test_bad_grid_files_fail_with_one_line(text: str, message: str) -> None:
    with pytest.raises(GridSpecError) as caught:
        parse_grid(text)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_transfer_and_vqa_references_are_checked() -> None:
    base = GRID + "[vqa.s]\ndata = 'synthetic:eval:1'\nheads_from = 'medium'\n"
    with pytest.raises(GridSpecError, match="heads_from = 'medium' is not a benchmark"):
        parse_grid("experiments = ['sweep', 'vqa_sweep']\n" + base)
    with pytest.raises(GridSpecError, match="'c' is not a model of the grid"):
        parse_grid("experiments = ['transfer']\n" + GRID + "[[transfer]]\nmodels = ['a', 'c']\n")


def test_plan_orders_cells_after_their_dependencies() -> None:
    spec = parse_grid("experiments = ['sweep', 'vqa_sweep', 'transfer']\n"
                      + GRID.replace("max_batch_rows = 4", "shards = 2")
                      + "[vqa.s]\ndata = 'synthetic:eval:1'\n[[transfer]]\nmodels = ['a', 'b']\n")
    cells = plan_cells(spec)
    ids = [c.id for c in cells]
    for cell in cells:
        assert all(ids.index(d) < ids.index(cell.id) for d in cell.depends)
    assert {c.kind for c in cells} == {"detect", "sweep-shard", "sweep-merge", "vqa_sweep", "transfer"}
    assert "sweep:a:easy#1/2" in ids and ids[-1] == "transfer:a+b:easy"
    assert cell_resources(spec, cells[0]) == {"num_cpus": 1.0, "num_gpus": 0.0}


# ----------------------------------------------------------------------------------------------- local executor

def test_local_grid_summary_manifest_and_heatmap(local: Path, grid_file: Path) -> None:
    summary = pd.read_csv(local / SUMMARY_CSV)
    assert list(summary[["model", "benchmark"]].itertuples(index=False, name=None)) == [
        ("a", "easy"), ("a", "hard"), ("b", "easy"), ("b", "hard")]
    assert (summary["k"] == 1).all() and summary["verdict"].notna().all()
    from vrh_interp.experiments.sweep import sweep_from_run
    from vrh_interp.experiments.verdicts import sweep_claims

    cell_result = sweep_from_run(local / "cells/b/hard/sweep")  # the cell's own folder, read back
    cell = cell_result.summary()
    row = summary[(summary["model"] == "b") & (summary["benchmark"] == "hard")].iloc[0]
    base = cell[cell["condition"] == "baseline"]["accuracy"].iloc[0]
    top = cell[cell["condition"] == "top"]["accuracy"].iloc[0]
    assert row["baseline"] == pytest.approx(base) and row["drop"] == pytest.approx(base - top)
    assert row["verdict"] == sweep_claims(cell_result).iloc[0]["verdict"] == "inconclusive"  # 3 items decide nothing
    manifest = json.loads((local / GRID_FILE).read_text())
    assert [c["status"] for c in manifest["cells"]] == ["done"] * 8 and manifest["executor"] == "local"
    assert (local / HEATMAP).stat().st_size > 1000
    before = _files(local)
    assert not run_grid(grid_file, local, progress=False).failed  # a rerun does nothing: each cell ran once
    assert _files(local) == before and all(len(_attempts(local, c["id"])) == 1 for c in manifest["cells"])


def test_grid_sweep_draws_live_head_controls_from_the_census(tmp_path: Path) -> None:
    """``live = true`` (the default): the census of the cell's first evaluation items in its folder, live-head sets
    drawn only from its live heads outside the top k, their mean in the summary; ``live = false``: none."""
    from vrh_interp.core.description.heads import Head
    from vrh_interp.evaluation.census import CENSUS_CSV, Census
    from vrh_interp.scoring.scores import HeadScores

    text = "[options]\nks = '0,2'\nrandom_sets = 2\nbatch_size = 4\n" + MODEL + BENCH
    result = run_grid(parse_grid(text), tmp_path / "live", progress=False)
    assert not result.failed, result.status
    cell = tmp_path / "live" / "cells/a/x/sweep"
    pool = Census.load(cell / CENSUS_CSV, 32)
    top = set(HeadScores.load(cell.parent / "detect" / "scores-vrh.json").top(2))
    live_sets = [{Head.parse(h) for h in heads}
                 for key, heads in json.loads((cell / "manifest.json").read_text())["conditions"].items()
                 if key.startswith("live:")]
    assert len(live_sets) == 2
    assert all(len(drawn) == 2 and drawn <= set(pool.live) and not drawn & top for drawn in live_sets)
    summary = pd.read_csv(tmp_path / "live" / SUMMARY_CSV)
    assert summary["live"].notna().all()
    bare = run_grid(parse_grid(text.replace("random_sets = 2", "random_sets = 2\nlive = false")),
                    tmp_path / "bare", progress=False)
    assert not bare.failed and not (tmp_path / "bare" / "cells/a/x/sweep" / CENSUS_CSV).exists()
    assert pd.read_csv(tmp_path / "bare" / SUMMARY_CSV)["live"].isna().all()


def test_a_failed_cell_is_reported_and_the_rest_runs(tmp_path: Path) -> None:
    # toy:a has 32 heads: at k = 30 too few heads lie outside the top 30 for the controls; the sweep fails, its
    # detection stays done
    spec = parse_grid("[options]\nks = '0,30'\nrandom_sets = 1\n" + MODEL
                      + "[benchmarks.x]\ndetect = 'synthetic:detect:1'\neval = 'synthetic:eval:1'\n")
    result = run_grid(spec, tmp_path / "grid", progress=False)
    assert result.failed == ["sweep:a:x"]
    reason = result.status["sweep:a:x"]["reason"]
    assert reason.startswith("ValueError: k=30") and "\n" not in reason
    assert json.loads((tmp_path / "grid" / GRID_FILE).read_text())["cells"][1]["reason"] == reason
    assert read_status(tmp_path / "grid", "detect:a:x")["status"] == "done"


def test_rerun_may_change_scheduling_not_results(grid_file: Path, local: Path, tmp_path: Path) -> None:
    changed = tmp_path / "GRID.toml"
    changed.write_text(GRID.replace("[options]", "[options]\ncpus = 2\nretries = 5").replace(
        'model = "toy:b"', 'model = "toy:b"\ngpus = 1'))
    assert not run_grid(changed, local, progress=False).failed  # nothing to redo: every cell is done
    changed.write_text(GRID.replace("random_sets = 2", "random_sets = 3"))
    with pytest.raises(GridSpecError, match="made by a different GRID.toml \\(options differ\\)"):
        run_grid(changed, local, progress=False)


def test_cli_grid_help_and_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vrh_interp.apps.cli import main

    with pytest.raises(SystemExit):
        main(["grid", "--help"])
    assert "--ray auto|ADDRESS" in capsys.readouterr().out
    bad = tmp_path / "GRID.toml"
    bad.write_text(MODEL + "devcie = 'cpu'\n" + BENCH)
    assert main(["grid", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vrh grid: error: GRID.toml [models.a]: unknown key 'devcie'") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()  # a grid that fails before running leaves no folder


def test_ray_executor_without_ray_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError, as where it is not installed
    with pytest.raises(RuntimeError, match=r"--ray needs Ray, an optional extra: pip install 'vrh-interp\[ray\]'"):
        run_grid(parse_grid(MODEL + BENCH), tmp_path / "grid", ray="auto", progress=False)


# ------------------------------------------------------------------------------------------------ patching cells

PATCH_GRID = """
experiments = ["patch"]

[options]
batch_size = 4

[models.l]
model = "tiny:llava"

[benchmarks.x]
detect = "synthetic:detect:2"
eval = "synthetic:eval:2"

[patch]
top = 2
pairs = 2
probe_scenes = 12
random_sets = 1
targets = "ground_truth"
"""
PATCH_ARGS = ["--top", "2", "--pairs", "2", "--probe-scenes", "12", "--seeds", "0", "--targets", "ground_truth"]


def _folder(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "run.lock"}


def _same_study(a: dict[str, bytes], b: dict[str, bytes]) -> None:
    """Every file byte for byte, patching.json but for the seconds the study took."""
    assert sorted(a) == sorted(b)
    assert {k: v for k, v in a.items() if k != "patching.json"} == {k: v for k, v in b.items() if k != "patching.json"}
    manifests = [json.loads(files["patching.json"]) for files in (a, b)]
    for manifest in manifests:
        manifest["facts"].pop("seconds")
    assert manifests[0] == manifests[1]


@pytest.fixture(scope="module")
def patching_grid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("patching") / "grid"
    result = run_grid(parse_grid(PATCH_GRID), out, progress=False)
    assert not result.failed, result.status
    assert [c.id for c in result.cells] == ["detect:l:x", "patch:l:x"]
    return out


def test_patching_cell_holds_what_vrh_patch_writes(patching_grid: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from vrh_interp.apps.cli import main
    from vrh_interp.experiments.patching_study import PatchingStudy, headline
    from vrh_interp.scoring.detect import scores_from_run

    heads = [str(h) for h in scores_from_run(patching_grid / "cells/l/x/detect", "vrh").top(2)]
    assert read_status(patching_grid, "patch:l:x")["heads"] == heads
    direct = tmp_path / "patch"
    assert main(["patch", "--model", "tiny:llava", "--vrhs", ",".join(heads), *PATCH_ARGS, "--out", str(direct)]) == 0
    assert "**Location** (referent_moved" in capsys.readouterr().out
    _same_study(_folder(patching_grid / "cells/l/patch"), _folder(direct))
    # the grid's patching table is the study's own headline, read back from vrh patch's folder here
    table = pd.read_csv(patching_grid / "grid_patching.csv")
    expected = headline(PatchingStudy.load(direct))
    assert list(table["kind"]) == list(expected["kind"]) == ["referent_moved", "referent_recoloured",
                                                              "expression_swap", "different_image"]
    for column in ("recovery", "ci_low", "all_heads", "random_mean", "random_rank", "matched_p"):
        assert table[column].tolist() == pytest.approx(expected[column].tolist(), nan_ok=True)
    assert (table["model"] == "l").all() and (table["random_sets"] == 1).all()
    assert "## Patching" in (patching_grid / "grid_summary.md").read_text()


def test_patching_rerun_repeats_no_work_and_a_killed_cell_resumes_from_its_parts(
        patching_grid: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from vrh_interp.experiments import patching_study
    from vrh_interp.apps.show import grid as print_grid
    from vrh_interp.experiments.grid_execution import write_status

    cell = patching_grid / "cells/l/patch"
    before = _folder(cell)
    result = run_grid(parse_grid(PATCH_GRID), patching_grid, progress=False)
    assert not result.failed
    assert _folder(cell) == before and len(_attempts(patching_grid, "patch:l:x")) == 1
    assert print_grid(result, None, False) == 0 and "Patching: recovery of the studied heads" in capsys.readouterr().out
    assert print_grid(result, None, True) == 0
    assert len(json.loads(capsys.readouterr().out)["patching"]) == 4  # one row per pair kind

    def no_work(*args, **kwargs):
        raise AssertionError("a finished part was computed again")

    monkeypatch.setattr(patching_study, "_kind_tables", no_work)
    monkeypatch.setattr(patching_study, "readout_probes", no_work)
    # killed while saving: every part done, the tables and patching.json not written
    for name in [n for n in before if "/" not in n]:
        (cell / name).unlink()
    write_status(patching_grid, "patch:l:x", "running", pid=0, host="gone")
    assert not run_grid(parse_grid(PATCH_GRID), patching_grid, progress=False).failed
    _same_study(_folder(cell), before)
    attempts = _attempts(patching_grid, "patch:l:x")
    assert len(attempts) == 2 and attempts[1]["records_before"] == 5  # four pair kinds and the probes


def test_patching_plan_and_spec_round_trip() -> None:
    from vrh_interp.experiments.grid import GridSpec, cell_spec

    spec = parse_grid("experiments = ['sweep', 'patch']\n" + GRID + "[patch]\nheads_from = 'hard'\n")
    patching = [c for c in plan_cells(spec) if c.kind == "patch"]
    study = cell_spec(Path("g"), spec, patching[0])
    assert (study.random_sets, study.control_seeds()) == (2, [0, 1])  # the grid's random_sets by default
    assert study.scores == "g/cells/a/hard/detect/scores-vrh.json"
    assert GridSpec.from_dict(spec.to_dict()) == spec  # what a Ray task gets
    assert [(c.id, c.folder, c.depends) for c in patching] == [
        ("patch:a:hard", "cells/a/patch", ("detect:a:hard",)),
        ("patch:b:hard", "cells/b/patch", ("detect:b:hard",))]
    assert "tables" not in parse_grid(GRID).to_dict()  # grids without one keep their grid.json


@pytest.mark.parametrize("table, message", [
    ("[patch]\npairs = 0\n", "GRID.toml [patch]: pairs = 0: 0 is too small: use a whole number >= 1"),
    ("[patch]\ntop = 'many'\n", "[patch]: top = 'many': 'many' is not a whole number"),
    ("[patch]\nmetric = 'logit'\n", "[patch]: metric = 'logit': use one of answer, first_token"),
    ("[patch]\ntargets = 'best'\n", "[patch]: targets = 'best': use one of greedy, ground_truth"),
    ("[patch]\nheads_from = 'nope'\n", "[patch]: heads_from = 'nope' is not a benchmark of the grid (x)"),
    ("[patch]\nseedz = 3\n", "[patch]: unknown key 'seedz'; the keys are out, model"),
    ("[models.r]\nmodel = 'toy:b'\nremote = true\n", "[models.r]: remote = true: patch runs only here"),
    ("[models.r]\nmodel = 'toy:b'\nremote = 'local'\n", "set remote = false, or remove \"patch\" from experiments"),
])
def test_bad_patching_options_are_refused_before_any_work(table: str, message: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from vrh_interp.apps.cli import main

    with pytest.raises(GridSpecError) as caught:
        parse_grid("experiments = ['patch']\n" + MODEL + BENCH + table)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    grid = tmp_path / "GRID.toml"
    grid.write_text("experiments = ['patch']\n" + MODEL + BENCH + table)
    assert main(["grid", str(grid), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vrh grid: error: GRID.toml") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
    with pytest.raises(GridSpecError, match='a \\[patch\\] table but experiments has no "patch"'):
        parse_grid(MODEL + BENCH + "[patch]\ntop = 2\n")
    with pytest.raises(GridSpecError, match="unknown experiment 'patching' \\(now named 'patch'"):
        parse_grid("experiments = ['patching']\n" + MODEL + BENCH)


# ------------------------------------------------------------------------------------------------- Ray executor

@pytest.fixture(scope="module")
def cluster() -> str:
    """A local Ray cluster of 2 CPUs for this module's tests; skips where Ray is not installed."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'vrh-interp[ray]'): the Ray executor "
                                            "tests need it")
    context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield context.address_info["gcs_address"]
    ray.shutdown()


def _wait(condition, timeout: float = 600.0, what="") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what() if callable(what) else what}"
        time.sleep(0.02)


def _records(folder: Path) -> int:
    path = folder / "sweep_records.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_ray_cells_needing_absent_gpus_fail_at_once(cluster: str, tmp_path: Path) -> None:
    spec = parse_grid(MODEL.replace("'toy:a'", "'toy:a'\ngpus = 1") + BENCH)
    result = run_grid(spec, tmp_path / "grid", ray=cluster, progress=False)
    for cell in ("detect:a:x", "sweep:a:x"):
        assert result.status[cell]["reason"].startswith("needs 1 gpus and the Ray cluster has 0 in all: add nodes")


def test_ray_grid_equals_local(cluster: str, grid_file: Path, local: Path) -> None:
    out = grid_file.parent / "ray"
    result = run_grid(grid_file, out, ray=cluster, progress=False)
    assert not result.failed
    assert _files(out) == _files(local)
    assert (out / SUMMARY_CSV).read_bytes() == (local / SUMMARY_CSV).read_bytes()
    assert json.loads((out / GRID_FILE).read_text())["executor"] == "ray"


def test_ray_worker_killed_mid_cell_is_retried_from_its_records(cluster: str, grid_file: Path, local: Path) -> None:
    out = grid_file.parent / "ray-killed"
    sweep_dir = out / "cells/a/hard/sweep"
    finished: dict = {}
    driver = threading.Thread(target=lambda: finished.update(result=run_grid(grid_file, out, ray=cluster,
                                                                             progress=False)))
    driver.start()
    _wait(lambda: _records(sweep_dir) > 0, what="the first pass of sweep:a:hard")
    pid = json.loads((sweep_dir / "run.lock").read_text())["pid"]  # the worker holding the cell's folder
    assert pid != os.getpid()
    os.kill(pid, signal.SIGKILL)
    driver.join(timeout=600)
    assert not finished["result"].failed, finished["result"].status
    first, *retries = _attempts(out, "sweep:a:hard")
    assert first["pid"] == pid and first["records_before"] == 0
    assert retries and retries[-1]["pid"] != pid and retries[-1]["records_before"] > 0  # resumed, not redone
    assert _files(out) == _files(local)
    assert (out / SUMMARY_CSV).read_bytes() == (local / SUMMARY_CSV).read_bytes()


def test_ray_driver_killed_then_rerun_resumes(cluster: str, grid_file: Path, local: Path) -> None:
    out = grid_file.parent / "ray-driver"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH",
                                                                                                         "")])}
    log = grid_file.parent / "driver.log"
    with open(log, "wb") as handle:
        driver = subprocess.Popen([sys.executable, "-m", "vrh_interp.apps.cli", "grid", str(grid_file), "--out",
                                   str(out), "--ray", cluster], env=env, stdout=handle, stderr=subprocess.STDOUT)
    cells = plan_cells(parse_grid(GRID))
    interrupted: list[str] = []

    def started() -> bool:  # a cell done and a sweep cell part way
        states = {c.id: read_status(out, c.id)["status"] for c in cells}
        interrupted[:] = [c.id for c in cells if c.kind == "sweep" and states[c.id] == "running"
                          and _records(out / c.folder)]
        return "done" in states.values() and bool(interrupted)

    try:
        _wait(started, what=lambda: f"a finished cell and a started one; the driver printed: {log.read_text()[-2000:]}")
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    done_before = {c.id for c in cells if read_status(out, c.id)["status"] == "done"}
    assert done_before and interrupted[0] not in done_before
    result = run_grid(grid_file, out, ray=cluster, progress=False)
    assert not result.failed
    assert all(len(_attempts(out, cell)) == 1 for cell in done_before)  # finished cells were not run again
    attempts = _attempts(out, interrupted[0])
    assert len(attempts) == 1 or attempts[-1]["records_before"] > 0  # rerun: resumed from its records
    assert _files(out) == _files(local)
    assert (out / SUMMARY_CSV).read_bytes() == (local / SUMMARY_CSV).read_bytes()


@pytest.mark.parametrize("threads", [1, 2])
def test_a_cell_runs_on_the_threads_its_spec_fixes_whatever_the_process_has(threads: int, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The cell's torch thread count comes from ``[options] threads`` (CPU reductions depend on it: a Ray worker
    inherits OMP_NUM_THREADS=1, a test process 2), and the process's own count is restored after the cell."""
    import torch

    from vrh_interp.experiments import grid_execution

    seen = []
    monkeypatch.setattr(grid_execution, "_run_declared", lambda *_: seen.append(torch.get_num_threads()) or {})
    spec = parse_grid(MODEL + BENCH + f"[options]\nthreads = {threads}\n")
    before = torch.get_num_threads()
    other = 3 if threads != 3 else 2
    torch.set_num_threads(other)
    try:
        grid_execution.run_cell(tmp_path, spec, "detect:a:x")
        assert seen == [threads] and torch.get_num_threads() == other
    finally:
        torch.set_num_threads(before)
    with pytest.raises(GridSpecError, match="threads = 0: 0 is too small: use a whole number >= 1"):
        parse_grid(MODEL + BENCH + "[options]\nthreads = 0\n")
