"""One writer per run folder, and record logs read as keyed, de-duplicated units (issue 20).

Two real processes started at the same instant on one ``--out``: one runs, the other is refused naming the
first (PID, host, start time), and the folder equals a single run's. A killed holder never leaves a stale lock.
A repeated record line counts once; a conflicting repeat or a damaged line in the middle is refused naming the
file and the line; a torn last line (a kill mid-append) is dropped.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import tiny_vlm
from vrh_interp.experiments.sweep import sweep, sweep_from_run
from vrh_interp.core.bookkeeping.runs import (LOCK_FILE, RecordLog, RunFolder, RunLockedError, RunRecordError,
                                              lock_run_folder)
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.experiments.declared import record_log

ROOT = Path(__file__).resolve().parents[1]
DETECT = ["detect", "--model", "tiny:qwen2_vl", "--data", "synthetic:detect:6", "--batch-size", "2",
          "--max-new-tokens", "3", "--json"]
# waits at a barrier after its imports, so that both processes reach the lock within milliseconds of each other
RACER = textwrap.dedent("""
    import sys, time, pathlib, torch
    torch.set_num_threads(1)
    from vrh_interp.apps import cli
    import vrh_interp.core.description.model, vrh_interp.scoring.detect, vrh_interp.core.description.tiny
    pathlib.Path(sys.argv[1]).touch()
    while not pathlib.Path(sys.argv[2]).exists():
        time.sleep(0.002)
    sys.exit(cli.main(sys.argv[3:]))
""")
HOLDER = "import sys, time; from vrh_interp.core.bookkeeping.runs import lock_run_folder; " \
         "l = lock_run_folder(sys.argv[1]); print('locked', flush=True); time.sleep(600)"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def test_two_processes_on_one_folder_one_runs_the_other_is_refused_and_the_result_is_a_single_runs(tmp_path):
    out = tmp_path / "shared"
    procs = []
    for i in range(2):
        procs.append(subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path / f"ready{i}"), str(tmp_path / "go"),
                                       *DETECT, "--out", str(out)], env=_env(), cwd=tmp_path,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.time() + 300
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
        assert time.time() < deadline and all(p.poll() is None for p in procs), "the racers did not start"
        time.sleep(0.05)
    (tmp_path / "go").touch()
    results = [(p.pid, *p.communicate(timeout=600), p.returncode) for p in procs]
    codes = sorted(code for *_, code in results)
    assert codes == [0, 2], results
    (winner, *_), (_, _, refusal, _) = sorted(results, key=lambda r: r[3])
    assert "Traceback" not in refusal and refusal.count("\n") == 1, refusal
    assert f"is in use by another run (process {winner} on host {socket.gethostname()}, started " in refusal, refusal
    assert "use another --out folder" in refusal
    assert (out / LOCK_FILE).read_text() == ""  # released, and emptied on the clean exit
    single = tmp_path / "single"
    subprocess.run([sys.executable, "-m", "vrh_interp.apps.cli", *DETECT, "--out", str(single)], env=_env(), check=True,
                   capture_output=True, timeout=600)
    assert (out / "detect_records.jsonl").read_bytes() == (single / "detect_records.jsonl").read_bytes()
    assert len(RecordLog(out / "detect_records.jsonl").read()) == 6
    scores = [json.loads((d / "scores-vrh.json").read_text()) for d in (out, single)]
    assert scores[0]["scores"] == scores[1]["scores"] and scores[0]["ranking"] == scores[1]["ranking"]


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], env=_env(), stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunLockedError, match=rf"in use by another run \(process {holder.pid} on host"):
            RunFolder(tmp_path, {"kind": "test"})
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    RunFolder(tmp_path, {"kind": "test"})  # the kernel released the dead holder's lock


def test_the_lock_is_shared_within_a_process_and_released_with_the_last_holder(tmp_path):
    first = RunFolder(tmp_path, {"kind": "test"})
    second = RunFolder(tmp_path, {"kind": "test"})  # e.g. a resume in the same process while `first` lives
    owner = json.loads((tmp_path / LOCK_FILE).read_text())
    assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
    del first
    assert (tmp_path / LOCK_FILE).read_text() != ""
    del second
    assert (tmp_path / LOCK_FILE).read_text() == ""
    lock_run_folder(tmp_path)


def test_a_run_refused_in_the_instant_before_the_holder_writes_its_details_waits_for_them(tmp_path):
    """The race the two-process test can hit: the holder has the lock but has not written who it is yet."""
    import fcntl
    import threading

    fd = os.open(tmp_path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)  # its own open file: flock conflicts with it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        owner = {"pid": 4242, "host": "elsewhere", "started": "2026-12-04T08:00:00+00:00", "command": "vrh sweep"}
        late = threading.Timer(0.3, lambda: os.write(fd, json.dumps(owner).encode()))
        late.start()
        with pytest.raises(RunLockedError, match=r"in use by another run \(process 4242 on host elsewhere, started "):
            RunFolder(tmp_path, {"kind": "test"})
        late.join()
        os.ftruncate(fd, 0)  # a holder that never writes them (or has emptied the file): named as such, no hang
        with pytest.raises(RunLockedError, match=r"another process; it wrote no details"):
            RunFolder(tmp_path, {"kind": "test"})
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    run = tmp_path_factory.mktemp("sweep") / "run"
    vlm = tiny_vlm("qwen2_vl")
    result = sweep(vlm, synthetic_samples("eval", 4), vlm.geometry.all_heads(), ks=(0, 1), random_seeds=(0,),
                   matched=False, batch_size=2, max_new_tokens=3, run_dir=run, progress=False)
    return run, result.summary()


def _lines(run: Path) -> list[str]:
    return (run / "sweep_records.jsonl").read_text().splitlines(keepends=True)


def _write(run: Path, lines: list[str]) -> None:
    (run / "sweep_records.jsonl").write_text("".join(lines))


def test_a_repeated_record_line_counts_once(swept, tmp_path):
    import shutil

    run = Path(shutil.copytree(swept[0], tmp_path / "run"))
    lines = _lines(run)
    _write(run, lines[:3] + [lines[2]] + lines[3:] + [lines[0]])  # as two runs appending the same units leave
    assert len(RecordLog(run / "sweep_records.jsonl").read()) == len(lines)
    pd.testing.assert_frame_equal(sweep_from_run(run).summary(), swept[1])
    vlm = tiny_vlm("qwen2_vl")  # resuming it: nothing to do, the same table
    again = sweep(vlm, synthetic_samples("eval", 4), vlm.geometry.all_heads(), ks=(0, 1), random_seeds=(0,),
                  matched=False, batch_size=2, max_new_tokens=3, run_dir=run, progress=False)
    pd.testing.assert_frame_equal(again.summary(), swept[1])


def test_a_conflicting_repeat_and_a_damaged_middle_line_are_refused_naming_file_and_line(swept, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = _lines(swept[0])
    record = json.loads(lines[1])
    log = run / "sweep_records.jsonl"
    _write(run, lines + [json.dumps({**record, "answer": "something else"}) + "\n"])
    with pytest.raises(RunRecordError, match=rf"{log} line {len(lines) + 1}: a second, different record of "
                                             rf"sample_id='{record['sample_id']}', condition='{record['condition']}' "
                                             r"\(the first is on line 2\)"):
        record_log(log).read()
    for damage, what in [('{"sample_id": "torn\n', "not a JSON record"), ("[1, 2]\n", "expected a JSON object"),
                         ('{"answer": "x"}\n', "has no sample_id, condition")]:
        _write(run, lines[:2] + [damage] + lines[2:])
        with pytest.raises(RunRecordError, match=rf"{log} line 3: .*{what}.*start over"):
            record_log(log).read()


def test_a_torn_last_line_is_dropped_by_readers_and_repaired_by_the_writer(swept, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = _lines(swept[0])
    torn = "".join(lines) + '{"sample_id": "ev'
    (run / "sweep_records.jsonl").write_text(torn)
    assert len(RecordLog(run / "sweep_records.jsonl").read()) == len(lines)
    assert (run / "sweep_records.jsonl").read_text() == torn  # a reader never writes (the writer may be live)
    RunFolder(run, {"kind": "test"}).log("sweep_records")
    assert (run / "sweep_records.jsonl").read_text() == "".join(lines)
