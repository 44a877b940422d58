"""Plan-level faults (issue 53) refused before any model loads or any cell runs, in one line naming the option or
the file and field, with exit status 2 from the command line: GRID.toml numbers that mean nothing (NaN, infinity,
negative), a ``summary_k`` outside the ks, status names that two cells share, cell folders inside each other, a grid
file that is a folder or not UTF-8, a Ray address where nothing answers, a plan too large to start unconfirmed,
and the toy trainer's command line (``python -m toy_training.train``). No test here loads a model: the cell
runners are replaced by stubs that record what ran."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from vrh_interp.experiments import grid, grid_execution
from vrh_interp.experiments.grid import GRID_FILE, GridSpecError, load_grid, parse_grid, plan_cells, status_name
from vrh_interp.experiments.grid_execution import read_status, run_grid, status_path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "[models.a]\nmodel = 'toy:a'\n"
BENCH = "[benchmarks.x]\ndetect = 'synthetic:detect:2'\neval = 'synthetic:eval:2'\n"


def _bench(name: str) -> str:
    return f"[benchmarks.{name}]\ndetect = 'synthetic:detect:2'\neval = 'synthetic:eval:2'\n"


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every cell runner replaced by a stub that records the cell (no model is loaded); the ids of the cells run."""
    seen: list[str] = []

    def stub(grid_dir: Path, spec: grid.GridSpec, cell: grid.Cell) -> dict:
        seen.append(cell.id)
        return {}

    monkeypatch.setattr(grid_execution, "_run_declared", stub)  # looked up by run_cell, run_grid in grid_execution
    monkeypatch.setattr(grid_execution, "_run_merge", stub)
    monkeypatch.setattr(grid_execution, "write_summary", lambda *args: pd.DataFrame())
    return seen


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from vrh_interp.apps.cli import main

    code = main(argv)
    return code, capsys.readouterr().err

def _refused_whole(text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """``text`` refused by ``parse_grid`` with ``message`` in one line, and by ``vrh grid`` with exit 2, one line
    on stderr and no output folder made; returns that stderr."""
    with pytest.raises(GridSpecError) as caught:
        parse_grid(text)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    path = tmp_path / "GRID.toml"
    path.write_text(text)
    code, err = _cli(["grid", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "out").exists()
    return err



# ------------------------------------------------------------------------------------- numbers that mean nothing

@pytest.mark.parametrize("text, message", [
    (MODEL + "gpus = nan\n" + BENCH, "GRID.toml [models.a]: gpus = nan must be a finite number >= 0"),
    (MODEL + "memory_gb = inf\n" + BENCH, "GRID.toml [models.a]: memory_gb = inf must be a finite number >= 0"),
    (MODEL + "gpus = -inf\n" + BENCH, "GRID.toml [models.a]: gpus = -inf must be a finite number >= 0"),
    (MODEL + "memory_gb = -2\n" + BENCH, "GRID.toml [models.a]: memory_gb = -2.0 must be a finite number >= 0"),
    (MODEL + "memory_gb = nan\n" + BENCH, "GRID.toml [models.a]: memory_gb = nan must be a finite number >= 0"),
    ("[options]\niou = nan\n" + MODEL + BENCH, "GRID.toml [options]: iou = nan must be a finite number"),
    ("[options]\ncpus = inf\n" + MODEL + BENCH, "GRID.toml [options]: cpus = inf must be a finite number"),
    ("[options]\ncpus = nan\n" + MODEL + BENCH, "GRID.toml [options]: cpus = nan must be a finite number"),
    ("[options]\nretries = -1\n" + MODEL + BENCH,
     "GRID.toml [options]: retries = -1: -1 is too small: use a whole number >= 0"),
])
def test_grid_numbers_that_mean_nothing_are_refused_when_parsed(text: str, message: str, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused_whole(text, message, tmp_path, capsys)
    assert err.startswith(f"vrh grid: error: {message}")


def test_a_grid_spec_made_in_python_with_nan_never_reaches_grid_json(tmp_path: Path, ran: list[str]) -> None:
    """grid.json is strict JSON (other readers refuse NaN / Infinity): a ``GridSpec`` built in Python is checked
    as a parsed one is, before its folder is made."""
    spec = parse_grid(MODEL + BENCH)
    for change in ({"gpus": float("nan")}, {"memory_gb": float("inf")}, {"gpus": -1.0}):
        bad = dataclasses.replace(spec, models={"a": dataclasses.replace(spec.models["a"], **change)})
        with pytest.raises(GridSpecError, match=rf"GRID.toml \[models.a\]: {next(iter(change))} = .* must be a "
                                                "finite number >= 0"):
            run_grid(bad, tmp_path / "out", progress=False)
        with pytest.raises(GridSpecError):
            bad.to_dict()
    options = dataclasses.replace(spec, options=dataclasses.replace(spec.options, cpus=float("nan")))
    with pytest.raises(GridSpecError, match=r"\[options\]: cpus = nan must be a finite number >= 0"):
        run_grid(options, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and ran == []
    run_grid(spec, tmp_path / "out", progress=False)
    json.loads((tmp_path / "out" / GRID_FILE).read_text(), parse_constant=lambda name: pytest.fail(name))


@pytest.mark.parametrize("options, message", [
    ("summary_k = 4\n", 'summary_k = 4 is not among ks = "0,1,3,5,10,20": use one of its head counts > 0: 1, 3, 5, '
                        '10, 20'),
    ("ks = '0,1'\nsummary_k = 2\n", 'summary_k = 2 is not among ks = "0,1"'),
    ("ks = '0,1%,3'\nsummary_k = 2\n", "(a percentage's k depends on the model's head count): use one of its head "
                                       "counts > 0: 3"),
    ("ks = '0,2.5%'\nsummary_k = 1\n", "use a head count > 0 in ks, or leave summary_k out"),
    ("summary_k = 0\n", "summary_k = 0: 0 is too small: use a whole number >= 1"),
])
def test_summary_k_outside_the_ks_is_refused_not_replaced_by_another_k(options: str, message: str, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert "summary_k" in _refused_whole("[options]\n" + options + MODEL + BENCH, message, tmp_path, capsys)


def test_summary_k_among_the_ks_is_kept() -> None:
    assert parse_grid("[options]\nsummary_k = 3\n" + MODEL + BENCH).options.summary_k == 3
    assert parse_grid("[options]\nks = '0,1%,5'\nsummary_k = 5\n" + MODEL + BENCH).options.summary_k == 5
    spec = parse_grid(MODEL + BENCH)
    with pytest.raises(GridSpecError, match="summary_k = 2 is not among ks"):  # a GridSpec made in Python too
        grid.check_numbers(dataclasses.replace(spec, options=dataclasses.replace(spec.options, ks="0,1",
                                                                                 summary_k=2)))


# ------------------------------------------------------------------------------------------ names that collide

TRICKY_IDS = [
    "detect:a:b_c", "detect:a_b:c", "detect:a:b:c", "detect_a_b_c", "detect%3Aa%3Ab_c", "detect%3Aa%3Ab%5Fc",
    "detect:a:b.c", "detect:a.b:c", "sweep:a:x#0/2", "sweep:a:x#0_2", "sweep:a:x_0/2", "sweep:a:x#0/2 ",
    "transfer:a+b:x", "transfer:a_b:x", "transfer:a b:x", "transfer:a%2Bb:x", "x/y", "x%2Fy", "x_2Fy", "x%y", "x%%y",
    "", ".", "..", "-", "~", "%", "_", "a~b", "a~", "é", "e\u0301", "\u00e9\u00e9", "%C3%A9", "ümlaut:ü", "tab\tid",
    "new\nline", "nul\x00id", "a" * 300, "a" * 299 + "b", "a" * 140 + "~" + "0" * 16, "A:b", "a:B",
]


def test_status_names_are_injective_over_adversarial_ids() -> None:
    names = [status_name(i) for i in TRICKY_IDS]
    assert len(set(names)) == len(TRICKY_IDS), [n for n in names if names.count(n) > 1]
    for name in names:
        assert re.fullmatch(r"[A-Za-z0-9.%~-]*", name) and len(name) <= 160 and "/" not in name
    # random ids over the characters that the old scheme ('_' for every run of other characters) merged
    generator = random.Random(53)
    alphabet = "ab_:%#/+.-~ é"
    ids = {"".join(generator.choice(alphabet) for _ in range(generator.randrange(0, 9))) for _ in range(20000)}
    assert len({status_name(i) for i in ids}) == len(ids)
    long = {"cell:" + "x" * 200 + suffix for suffix in ("", "y", "z", "_", ":", "xy")}
    assert len({status_name(i) for i in long}) == len(long)


def test_cells_that_shared_a_status_file_each_run(tmp_path: Path, ran: list[str]) -> None:
    """``detect:a:b_c`` and ``detect:a_b:c`` had one status file (':' -> '_'): the second was skipped as done and the
    grid said "4 of 4 cells done"."""
    text = ("experiments = ['detect']\n" + MODEL + "[models.a_b]\nmodel = 'toy:a'\n" + _bench("b_c") + _bench("c"))
    result = run_grid(parse_grid(text), tmp_path / "grid", progress=False)
    assert sorted(ran) == sorted(["detect:a:b_c", "detect:a:c", "detect:a_b:b_c", "detect:a_b:c"])
    assert not result.failed
    files = sorted(p.name for p in (tmp_path / "grid" / "status").glob("*.json"))
    assert len(files) == 4
    for cell in ran:
        assert json.loads(status_path(tmp_path / "grid", cell).read_text())["cell"] == cell


def test_old_status_files_are_read_only_for_the_cell_they_name(tmp_path: Path) -> None:
    legacy = tmp_path / "status" / "detect_a_b_c.json"  # the name both cells had before
    legacy.parent.mkdir()
    legacy.write_text(json.dumps({"cell": "detect:a:b_c", "status": "done", "seconds": 1.0}))
    assert read_status(tmp_path, "detect:a:b_c")["status"] == "done"  # a grid folder made before: not rerun
    assert read_status(tmp_path, "detect:a_b:c") == {"status": "pending"}  # not the other cell's
    grid_execution.write_status(tmp_path, "detect:a_b:c", "failed", reason="x")
    assert read_status(tmp_path, "detect:a_b:c")["status"] == "failed"
    assert read_status(tmp_path, "detect:a:b_c")["status"] == "done"


@pytest.mark.parametrize("text, message", [
    ("experiments = ['vqa_sweep']\n" + MODEL + BENCH + _bench("vqa_sweep-s") + "[vqa.s]\ndata = 'synthetic:eval:2'\n",
     "cells detect:a:vqa_sweep-s and vqa_sweep:a:s would write into nested folders (cells/a/vqa_sweep-s/detect, "
     "cells/a/vqa_sweep-s)"),
    ("experiments = ['patch']\n" + MODEL + BENCH + _bench("patch"),
     "cells detect:a:patch and patch:a:x would write into nested folders"),
    ("experiments = ['transfer']\n" + "".join(f"[models.{m}]\nmodel = 'toy:a'\n" for m in ("a", "b", "c", "a__b",
                                                                                            "b__c"))
     + BENCH + "[[transfer]]\nmodels = ['a__b', 'c']\n[[transfer]]\nmodels = ['a', 'b__c']\n",
     "cells transfer:a__b+c:x and transfer:a+b__c:x would write into the same folder (transfer/a__b__c__x"),
    (MODEL + "[models.A]\nmodel = 'toy:b'\n" + BENCH,
     "cells detect:a:x and detect:A:x would write into the same folder where file names ignore case"),
    (MODEL + BENCH + _bench("X"), "cells detect:a:x and detect:a:X would write into the same folder where file"),
])
def test_cells_whose_folders_collide_are_refused_before_any_runs(text: str, message: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert message in _refused_whole(text, message, tmp_path, capsys)


def test_every_planned_folder_is_apart_from_the_others() -> None:
    spec = parse_grid("experiments = ['sweep', 'vqa_sweep', 'transfer', 'patch']\n[options]\nshards = 2\n" + MODEL
                      + "[models.b]\nmodel = 'toy:b'\n" + BENCH + _bench("y") + "[vqa.s]\ndata = 'synthetic:eval:2'\n"
                      + "[[transfer]]\nmodels = ['a', 'b']\n")
    assert grid.check_plan(spec) == plan_cells(spec)  # the usual plan passes


# -------------------------------------------------------------------------------------------- the grid file

def test_a_grid_file_that_is_a_folder_or_not_utf8_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "grids"
    folder.mkdir()
    with pytest.raises(GridSpecError, match=r"grid file .*grids is a folder, not a GRID.toml file: name the GRID"):
        load_grid(folder)
    (folder / "GRID.toml").write_text(MODEL + BENCH)
    with pytest.raises(GridSpecError, match=r"is a folder, not a GRID.toml file: did you mean .*grids/GRID.toml\?"):
        load_grid(folder)
    latin = tmp_path / "latin.toml"
    latin.write_bytes(("# modèle\n" + MODEL + BENCH).encode("latin-1"))
    with pytest.raises(GridSpecError) as caught:
        load_grid(latin)
    assert str(caught.value) == f"grid file {latin} is not UTF-8 text (byte 0xe8 at offset 5): save it as UTF-8"
    with pytest.raises(GridSpecError, match="does not exist"):
        load_grid(tmp_path / "missing.toml")
    for path, message in ((folder, "is a folder, not a GRID.toml file"), (latin, "is not UTF-8 text")):
        code, err = _cli(["grid", str(path), "--out", str(tmp_path / "out")], capsys)
        assert code == 2 and err.startswith(f"vrh grid: error: grid file {path} {message}") and err.count("\n") == 1
        assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_grid_file_that_is_a_fifo_is_refused_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "GRID.toml"
    os.mkfifo(fifo)
    with pytest.raises(GridSpecError, match="is not a regular file"):  # reading it would block for ever
        load_grid(fifo)


# ---------------------------------------------------------------------------------------- Ray address, bounded

def _server(reply: bytes | None) -> tuple[int, threading.Event]:
    """A local TCP server on a free port that accepts one connection and sends ``reply`` (None: nothing, ever)."""
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        with listener:
            connection, _ = listener.accept()
            with connection:
                if reply is not None:
                    connection.sendall(reply)
                done.wait(10)

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], done


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_ray_address_where_nothing_answers_is_refused_within_the_stated_timeout() -> None:
    port = _closed_port()
    with pytest.raises(RuntimeError, match=rf"cannot reach a Ray cluster at '127.0.0.1:{port}' \(Connection refused"):
        grid_execution.check_reachable(f"127.0.0.1:{port}", timeout=2)
    silent, done = _server(None)  # accepts, then says nothing (a firewall, a hung host)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as caught:
        grid_execution.check_reachable(f"127.0.0.1:{silent}", timeout=0.5)
    done.set()
    assert time.monotonic() - start < 3
    assert str(caught.value) == (f"no Ray cluster answered at '127.0.0.1:{silent}' within 0.5 s: start one with `ray "
                                 "start --head` and pass the address it prints, e.g. --ray 10.0.0.1:6379")
    web, done = _server(b"HTTP/1.1 400 Bad Request\r\n\r\n")  # something else listens there
    with pytest.raises(RuntimeError, match="is not a Ray cluster"):
        grid_execution.check_reachable(f"127.0.0.1:{web}", timeout=2)
    done.set()
    grpc, done = _server(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))  # a gRPC server's SETTINGS frame: answered
    grid_execution.check_reachable(f"ray://127.0.0.1:{grpc}", timeout=2)
    done.set()
    with pytest.raises(RuntimeError, match="'nowhere' is not a cluster address: use auto or HOST:PORT"):
        grid_execution.check_reachable("nowhere")
    assert grid_execution.CONNECT_TIMEOUT_S == 10.0  # the timeout docs/recipes/grid.md states


def test_auto_probes_only_the_address_that_ray_address_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    grid_execution.check_reachable("auto")  # Ray finds this machine's cluster or starts one: nothing to probe
    port = _closed_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(RuntimeError, match="cannot reach a Ray cluster at"):
        grid_execution.check_reachable("auto")


def test_vrh_grid_ray_at_an_unreachable_address_fails_in_one_line_before_the_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, ran: list[str]) -> None:
    """Ray alone retries a refused address for minutes (its own log lines; measured > 200 s); vrh probes it first
    (``check_reachable``), before Ray is even imported (``import ray`` fails here, installed or not)."""
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError: the probe must come first
    path = tmp_path / "GRID.toml"
    path.write_text(MODEL + BENCH)
    port = _closed_port()
    start = time.monotonic()
    code, err = _cli(["grid", str(path), "--out", str(tmp_path / "out"), "--ray", f"127.0.0.1:{port}"], capsys)
    assert time.monotonic() - start < grid_execution.CONNECT_TIMEOUT_S
    assert code == 2 and err.startswith(f"vrh grid: error: cannot reach a Ray cluster at '127.0.0.1:{port}'")
    assert err.count("\n") == 1 and not (tmp_path / "out").exists() and ran == []


# ------------------------------------------------------------------------------------------------ large plans

def test_a_large_plan_prints_its_size_and_needs_yes(tmp_path: Path, ran: list[str],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    text = MODEL + "".join(_bench(f"b{i}") for i in range(251))  # 502 cells: a detection and a sweep each
    with pytest.raises(GridSpecError) as caught:
        run_grid(parse_grid(text), tmp_path / "big", progress=False)
    message = str(caught.value)
    assert message.startswith("502 cells, 502 to run (0 done); estimate ~42 min one at a time (a toy model's 5 s per "
                              "cell on a 2-core CPU; real models take longer): more than 500 cells run only when "
                              "confirmed: pass --yes") and "\n" not in message
    assert ran == [] and not (tmp_path / "big").exists()
    path = tmp_path / "GRID.toml"
    path.write_text(text)
    code, err = _cli(["grid", str(path), "--out", str(tmp_path / "big")], capsys)
    assert code == 2 and "502 cells" in err and "--yes" in err and err.count("\n") == 1
    assert not (tmp_path / "big").exists()
    code, err = _cli(["grid", str(path), "--out", str(tmp_path / "big"), "--yes", "--json"], capsys)
    assert "confirmed" not in err and len(ran) == 502  # --yes reaches run_grid: every cell runs


def test_a_confirmed_plan_runs_and_the_estimate_uses_the_done_cells(tmp_path: Path, ran: list[str],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    spec = parse_grid(MODEL + BENCH + _bench("y"))  # 4 cells
    with pytest.raises(GridSpecError, match="4 cells, 4 to run .*more than 3 cells run only when confirmed"):
        run_grid(spec, tmp_path / "grid", confirm_above=3)
    assert ran == []
    result = run_grid(spec, tmp_path / "grid", confirm_above=3, yes=True)
    assert not result.failed and len(ran) == 4
    assert "grid: 4 cells, 4 to run (0 done); estimate ~20 s one at a time" in capsys.readouterr().err
    grid_execution.write_status(tmp_path / "grid", "sweep:a:y", "failed", reason="x")
    for cell in ("detect:a:x", "sweep:a:x", "detect:a:y"):
        grid_execution.write_status(tmp_path / "grid", cell, "done", seconds=30.0)
    run_grid(spec, tmp_path / "grid", confirm_above=3)  # one cell to run: no confirmation needed
    assert ("grid: 4 cells, 1 to run (3 done); estimate ~30 s one at a time (30 s per cell, the mean of the 3 done)"
            in capsys.readouterr().err)


def test_a_long_plan_says_its_progress_and_rewrites_grid_json_throttled(tmp_path: Path, ran: list[str],
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Each cell's line names its place and the time left; grid.json is rewritten at most every REFRESH_S while
    cells run (it was rewritten after every cell: about 3 s each on a 20,000-cell grid), then once at the end, and it
    holds every cell's final status."""
    writes: list[int] = []
    real = grid_execution.write_manifest

    def counted(*args: object) -> dict:
        writes.append(1)
        return real(*args)

    monkeypatch.setattr(grid_execution, "write_manifest", counted)
    monkeypatch.setattr(grid_execution, "REFRESH_S", 1e9)
    spec = parse_grid(MODEL + BENCH + "".join(_bench(name) for name in "yzw"))  # 8 cells
    result = run_grid(spec, tmp_path / "grid")
    assert len(ran) == 8 and not result.failed
    assert len(writes) == 3  # before the cells, after the first (due at once), at the end; was 1 + 8 + 1
    cells = json.loads((tmp_path / "grid" / GRID_FILE).read_text())["cells"]
    assert [c["status"] for c in cells] == ["done"] * 8
    err = capsys.readouterr().err
    assert "grid: [1/8] detect:a:x ..." in err and re.search(r"grid: \[8/8, ~\d+ s left\] sweep:a:w \.\.\.", err)


# -------------------------------------------------------------------------------------------- the toy trainer

@pytest.fixture(scope="module")
def trainer():
    """``toy_training.train`` (it imports torch and transformers)."""
    import toy_training.train

    return toy_training.train


@pytest.fixture
def no_training(trainer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing the trainer does after its command line may run."""
    for name in ("train", "ship", "relabel_run", "load", "measure_held_out", "evaluate"):
        monkeypatch.setattr(trainer, name, lambda *args, **kwargs: pytest.fail("the trainer started work"))
    monkeypatch.setattr(trainer.torch, "set_num_threads", lambda *args: pytest.fail("threads set"))


@pytest.mark.parametrize("argv, message", [
    (["--threads", "0"], "argument --threads: 0 is too small: use a whole number from 1 to 1024"),
    (["--threads", "two"], "argument --threads: 'two' is not a whole number"),
    ([], "--out is required to train: the run folder"),
    (["--out", ""], "argument --out: an empty path: name a folder"),
    (["--tower-lr-scale", "nan"], "argument --tower-lr-scale: nan is not a finite number"),
    (["--tower-lr-scale", "inf"], "argument --tower-lr-scale: inf is not a finite number"),
    (["--tower-lr-scale", "-1"], "--tower-lr-scale -1.0: give a fraction >= 0 of the grounding learning rate"),
    (["--lr", "nan"], "argument --lr: nan is out of range: use a finite number 0 < x <= 1"),
    (["--lr", "0"], "argument --lr: 0 is out of range"),
    (["--lr=-inf"], "argument --lr: -inf is out of range"),
    (["--head-dropout", "nan"], "argument --head-dropout: nan is out of range: use a finite number 0 <= x < 1"),
    (["--head-dropout", "1"], "argument --head-dropout: 1 is out of range"),
    (["--warm-start", "CKPT", "--revive-floor", "inf"], "argument --revive-floor: inf is out of range"),
    (["--warm-start", "CKPT", "--revive-floor", "-0.1"], "argument --revive-floor: -0.1 is out of range"),
    (["--steps", "-1"], "argument --steps: -1 is too small: use a whole number >= 0"),
    (["--vision-steps", "-5"], "argument --vision-steps: -5 is too small"),
    (["--eval-every", "0"], "argument --eval-every: 0 is too small: use a whole number >= 1"),
    (["--seed", "-1"], "argument --seed: -1 is too small"),
    (["--split-heads", "L1H1"], "--split-heads need --warm-start"),
    (["--warm-start", "CKPT", "--split-heads", "7,12"], "--split-heads: cannot parse '7' as a head"),
    (["--model", "c", "--warm-start", "CKPT", "--share-attention", "9:6"],
     "--share-attention 9:6: name two different layers of the c model's 0..7"),
    (["--folder", "."], "--folder names the checkpoint --evaluate measures: add --evaluate"),
    (["--ship", "NO-SUCH-RUN", "--dest", "D"], "--ship 'NO-SUCH-RUN' is not there: name a run folder"),
    (["--evaluate", "--folder", "NO-SUCH-RUN"], "--folder 'NO-SUCH-RUN' is not there"),
    (["--relabel", "RUN"], "--relabel makes toy planted-x's run folder"),
])
def test_trainer_command_line_faults_are_one_line_with_status_2(argv: list[str], message: str, tmp_path: Path,
                                                                trainer, no_training: None,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = [] if any(a in argv for a in ("--out", "--ship", "--evaluate", "--relabel")) or not argv else \
        ["--out", str(tmp_path / "run")]
    with pytest.raises(SystemExit) as caught:
        trainer.main([*argv, *out])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m toy_training.train: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_trainer_out_that_is_a_file_is_refused(tmp_path: Path, trainer, no_training: None,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run").write_text("")
    with pytest.raises(SystemExit) as caught:
        trainer.main(["--out", str(tmp_path / "run")])
    assert caught.value.code == 2 and f"--out '{tmp_path / 'run'}' is a file" in capsys.readouterr().err


def test_trainer_options_and_presets_agree(trainer) -> None:
    from toy_training import options

    assert set(options.MODEL_NAMES) == set(trainer.MODEL_PRESETS)
    assert options.DESCRIPTION == trainer.__doc__.splitlines()[0]
    args = trainer._parse_args(["--model", "d", "--warm-start", "CKPT", "--tower-lr-scale", "0.25", "--lr", "1",
                                "--head-dropout", "0", "--revive-floor", "1", "--threads", "1"])
    config = trainer.training_config(args)
    assert (config.tower_lr_scale, config.grounding_lr, config.head_dropout, config.revive_floor) == (0.25, 1, 0, 1)


def test_trainer_refuses_before_torch_loads() -> None:
    """``python -m toy_training.train --threads 0``: one line, status 2, no traceback, torch never imported."""
    probe = ("import atexit, runpy, sys\n"
             "atexit.register(lambda: print('TORCH=' + str('torch' in sys.modules), file=sys.stderr))\n"
             "sys.argv = ['train', *sys.argv[1:]]\n"
             "runpy.run_module('toy_training.train', run_name='__main__', alter_sys=True)\n")
    for argv, message in ((["--threads", "0", "--out", "X"], "argument --threads: 0 is too small"),
                          (["--tower-lr-scale", "nan", "--out", "X"], "--tower-lr-scale: nan is not a finite number"),
                          ([], "--out is required to train")):
        done = subprocess.run([sys.executable, "-c", probe, *argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
        lines = done.stderr.splitlines()
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert lines[0].startswith("python -m toy_training.train: error: ") and message in lines[0]
        assert lines[1:] == ["TORCH=False"]
