"""Hostile and careless uses of the `vrh` command line: models that cannot load, scores of another model,
damaged or busy run folders, unwritable folders, dead remote servers, malformed pickles, Ctrl-C (issue 20).

Every case ends with a non-zero exit code and ONE clear message on stderr (no "Traceback"), within seconds, and
leaves nothing half-written: no temporary file, every JSON file whole, every record log ending in a newline, and
no folder at all where the command made a new one and failed before its first result. Most cases run ``main()``
in-process; Ctrl-C and a full disk (a file-size limit: every write past it fails like a full disk) run the real
entry point in a subprocess, and then resume to exactly what an uninterrupted run writes.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

from tests.datasets import fixtures
from tests.test_remote_timeouts import server
from vrh_interp.apps.cli import main
from vrh_interp.core.bookkeeping.runs import LOCK_FILE
from vrh_interp.scoring.design import resolve_design
from vrh_interp.scoring.scores import HeadScores
from tests.ndif_server import client_host, free_port

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model", "tiny:qwen2_vl", "--batch-size", "2", "--max-new-tokens", "3"]
DETECT = ["detect", *TINY, "--data", "synthetic:detect:4"]


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str], limit_s: float = 30) -> tuple[int, str]:
    start = time.monotonic()
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    assert time.monotonic() - start < limit_s, f"{argv} took {time.monotonic() - start:.1f} s"
    return int(code or 0), capsys.readouterr().err


PROGRESS_BAR = re.compile(r"\|.*\| *\d+/\d+ \[")  # tqdm's lines (loading weights, scoring samples)


def assert_one_clear_error(code: int, err: str, *words: str) -> None:
    """A non-zero exit, no traceback, and one message line (besides progress bars) holding every word."""
    assert code != 0, err
    assert "Traceback" not in err, err
    lines = [line for line in re.split(r"[\r\n]", err) if line.strip() and not PROGRESS_BAR.search(line)]
    assert len(lines) == 1 and lines[0].startswith("vrh "), err
    for word in words:
        assert word in lines[0], (word, err)


def assert_nothing_half_written(folder: Path) -> None:
    if not folder.exists():
        return
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert not [p for p in files if p.name.endswith(".tmp")], files
    for path in files:
        if path.suffix == ".json":
            json.loads(path.read_text())
        if path.suffix == ".jsonl" and path.stat().st_size:
            assert path.read_bytes().endswith(b"\n"), path


def scores_file(path: Path, layers: int, heads: int, model_id: str) -> Path:
    scores = HeadScores(scores=np.arange(layers * heads, dtype=float).reshape(layers, heads),
                        design=resolve_design("vrh"), sample_ids=["detect-0"],
                        provenance={"model": {"model_id": model_id, "revision": None, "architecture": "X",
                                              "geometry": {"layers": layers, "heads": heads}}})
    return scores.save(path)


def tiny_folder(tmp_path: Path) -> Path:
    from vrh_interp.core.description.tiny import build_tiny

    tiny = build_tiny("qwen2_vl")
    tiny.model.save_pretrained(tmp_path / "saved")
    tiny.processor.save_pretrained(tmp_path / "saved")
    return tmp_path / "saved"


def no_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The hub at a closed local port (refused at once, with or without a network here) and an empty HF cache."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def hub_unreachable(t: Path, m: pytest.MonkeyPatch, stack: ExitStack) -> list[str]:
    no_hub(m, t)
    return ["detect", "--model", "models/mine"]  # a relative path with one slash that does not exist


def hub_offline(t: Path, m: pytest.MonkeyPatch, stack: ExitStack) -> list[str]:
    no_hub(m, t)
    m.setenv("HF_HUB_OFFLINE", "1")
    return ["detect", "--model", "Qwen/Qwen2-VL-2B-Instruct"]


def bad_dtype(spec: str) -> Callable[[Path, pytest.MonkeyPatch, ExitStack], list[str]]:
    def setup(t: Path, m: pytest.MonkeyPatch, stack: ExitStack) -> list[str]:
        no_hub(m, t)
        return ["detect", "--model", spec or str(tiny_folder(t)), "--dtype", "float99"]
    return setup


def scores_not_json(t: Path, m: pytest.MonkeyPatch, stack: ExitStack) -> list[str]:
    (t / "in" / "s.json").write_text("{not json")
    return ["sweep", *TINY, "--scores", str(t / "in" / "s.json")]


def malformed_pickle(t: Path, m: pytest.MonkeyPatch, stack: ExitStack) -> list[str]:
    fixtures.write_refer(t / "refer")
    (t / "refer" / "refcoco" / "refs(unc).p").write_bytes(b"\x80\x02K\x01K\x02a.")  # APPEND onto an int
    return ["detect", *TINY, "--data", f"refcoco:{t / 'refer'}:val"]


def silent_server(t: Path, m: pytest.MonkeyPatch, stack: ExitStack) -> list[str]:
    m.setenv("VRH_REMOTE_CONNECT_TIMEOUT", "1")
    stack.enter_context(client_host(stack.enter_context(server("never"))))
    return ["detect", "--model", "toy:a", "--data", "synthetic:detect:2", "--remote"]


def unresolvable_host(t: Path, m: pytest.MonkeyPatch, stack: ExitStack) -> list[str]:
    stack.enter_context(client_host("http://no-such-host.invalid"))  # .invalid never resolves (RFC 2606)
    return ["detect", "--model", "toy:a", "--data", "synthetic:detect:2", "--remote"]


def plain(*argv: str) -> Callable[[Path, pytest.MonkeyPatch, ExitStack], list[str]]:
    return lambda t, m, stack: [a.format(t=t) for a in argv]


CASES: dict[str, tuple[Callable[[Path, pytest.MonkeyPatch, ExitStack], list[str]], tuple[str, ...]]] = {
    "empty model spec": (plain("detect", "--model", ""), ("the model spec is empty",)),
    "model spec is a file": (plain("detect", "--model", "{t}/in/weights.bin"), ("is a file, not a model folder",)),
    "folder without config.json": (plain("detect", "--model", "{t}/in"), ("has no config.json",)),
    "missing ./folder": (plain("detect", "--model", "./no-such-model"), ("does not exist",)),
    "one-slash path, hub unreachable": (hub_unreachable, ("'models/mine' is not a local folder",
                                                          "did not answer within", "HF_HUB_OFFLINE")),
    "hub id, HF_HUB_OFFLINE=1, not cached": (hub_offline, ("HF_HUB_OFFLINE is set but the HF cache has no copy",)),
    "invalid hub id": (plain("detect", "--model", "a b/c"), ("not a valid hub id",)),
    "unknown device": (plain("detect", "--model", "toy:a", "--device", "gpu9"), ("unknown device 'gpu9'",)),
    **{f"--dtype float99, {kind}": (bad_dtype(spec), ("unknown dtype 'float99'",))
       for kind, spec in [("toy", "toy:a"), ("tiny", "tiny:qwen2_vl"), ("folder", ""), ("hub id", "org/name")]},
    "scores of a bigger model": (
        lambda t, m, stack: ["sweep", *TINY, "--scores", str(scores_file(t / "in" / "s.json", 4, 8, "big/model")),
                             "--data", "synthetic:eval:3", "--ks", "0,1"],
        ("computed on big/model (4 layers x 8 heads)", "has 2 layers x 4 heads", "L3H7 do not exist")),
    "scores file is not JSON": (scores_not_json, ("s.json is not a vrh-interp head-scores file",)),
    "malformed refs pickle": (malformed_pickle, ("refs(unc).p: not a readable pickle (AttributeError",)),
    "remote server accepts and never answers": (silent_server, ("did not answer within 1 s to accept the "
                                                                "connection", "is an NDIF API")),
    "remote host does not resolve": (unresolvable_host, ("could not resolve the NDIF host "
                                                         "http://no-such-host.invalid", "spelling")),
}
if not torch.cuda.is_available():
    CASES["--device cuda without CUDA"] = (plain("detect", "--model", "toy:a", "--device", "cuda"),
                                           ("no usable CUDA device", "use --device cpu"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_case_fails_with_one_clear_message_and_writes_nothing(case: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    setup, words = CASES[case]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "weights.bin").write_bytes(b"\0" * 16)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    with ExitStack() as stack:
        argv = setup(tmp_path, monkeypatch, stack)
        capsys.readouterr()  # what the setup printed
        code, err = run_main([*argv, "--out", str(out)], capsys, limit_s=60 if "folder" in case else 30)
    assert_one_clear_error(code, err, *words)
    assert_nothing_half_written(out)
    if not case.startswith("remote"):  # a remote run has written its manifest (a resumable folder) when it fails
        assert not out.exists(), sorted(p.name for p in out.iterdir())  # failed before its first result


@pytest.fixture(scope="module")
def detected(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("detected") / "run"
    assert main([*DETECT, "--out", str(out), "--json"]) == 0
    return out


@pytest.mark.parametrize("damage, words", [
    (lambda lines: lines[:1] + ['{"sample_id": "synth\n'] + lines[1:], ("detect_records.jsonl line 2: not a JSON",)),
    (lambda lines: lines + [lines[0].replace('"answer": "', '"answer": "x', 1)],
     ("detect_records.jsonl line 5: a second, different record of sample_id=", "the first is on line 1")),
], ids=["corrupt middle line", "conflicting repeat"])
def test_a_damaged_run_folder_is_refused_naming_file_and_line(detected: Path, damage: Callable[[list[str]], list[str]],
                                                               words: tuple[str, ...], tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = Path(shutil.copytree(detected, tmp_path / "run"))
    log = out / "detect_records.jsonl"
    log.write_text("".join(damage(log.read_text().splitlines(keepends=True))))
    before = log.read_bytes()
    code, err = run_main([*DETECT, "--out", str(out)], capsys)
    assert_one_clear_error(code, err, *words, "start over")
    assert log.read_bytes() == before  # refused before writing


def test_a_folder_another_process_writes_is_refused_naming_it(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; "
                               "from vrh_interp.core.bookkeeping.runs import lock_run_folder; "
                               "l = lock_run_folder(sys.argv[1]); print('locked', flush=True); time.sleep(600)",
                               str(tmp_path / "run")], env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, err = run_main([*DETECT, "--out", str(tmp_path / "run")], capsys)
    finally:
        holder.kill()
        holder.wait()
    assert_one_clear_error(code, err, f"is in use by another run (process {holder.pid} on host", "another --out")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [LOCK_FILE]


def test_a_read_only_run_folder_is_refused_before_any_work(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    out.mkdir()
    out.chmod(0o555)
    immutable = False
    try:
        if os.access(out, os.W_OK):  # root ignores the mode: make the folder immutable instead
            immutable = subprocess.run(["chattr", "+i", str(out)], capture_output=True).returncode == 0
            if not immutable:
                pytest.skip("cannot make a read-only folder here (root without chattr)")
        code, err = run_main([*DETECT, "--out", str(out)], capsys)
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(out)], check=True)
        out.chmod(0o755)
    assert_one_clear_error(code, err, f"--out '{out}': no permission to write in this folder", "make it writable")
    assert list(out.iterdir()) == []


def _cli(argv: list[str], **kwargs: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "vrh_interp.apps.cli", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)  # type: ignore[call-overload]


def _default_sigint() -> None:
    """In the child, before Python starts: SIGINT back to its default. A test run started as a background job inherits
    SIGINT ignored, and a Python started with it ignored never raises KeyboardInterrupt (the run then ends normally)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _resumes_to_a_fresh_run(argv: list[str], out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--out", str(out), "--json"]) == 0
    assert main([*argv, "--out", str(tmp_path / "fresh"), "--json"]) == 0
    capsys.readouterr()
    assert (out / "detect_records.jsonl").read_bytes() == (tmp_path / "fresh" / "detect_records.jsonl").read_bytes()
    got, want = (HeadScores.load(d / "scores-vrh.json").scores for d in (out, tmp_path / "fresh"))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)


def test_ctrl_c_prints_one_line_with_the_resume_command_and_the_run_resumes(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    # 160 samples: on a quiet machine 24 finished (~30 samples/s) before the interrupt landed, and the run exited 0
    argv = ["detect", *TINY, "--data", "synthetic:detect:160"]
    out = tmp_path / "run"
    proc = _cli([*argv, "--out", str(out)], preexec_fn=_default_sigint)
    log = out / "detect_records.jsonl"
    deadline = time.time() + 300
    while not (log.exists() and log.read_text().count("\n") >= 2):
        assert time.time() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert_one_clear_error(proc.returncode, err, "interrupted")
    assert "KeyboardInterrupt" not in err and err.rstrip().endswith(
        f"vrh detect: interrupted; what is done is kept in {out}: rerun the same command to resume it: "
        f"vrh {' '.join(argv)} --out {out}"), err
    assert_nothing_half_written(out)
    assert 0 < log.read_text().count("\n") < 160
    _resumes_to_a_fresh_run(argv, out, tmp_path, capsys)


def test_a_full_disk_is_one_line_and_the_run_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file-size limit makes every write past it fail (EFBIG) exactly where a full disk would (ENOSPC)."""
    argv = ["detect", *TINY, "--data", "synthetic:detect:8"]
    out = tmp_path / "run"
    limit = 6000  # the manifest and a few records fit; the first statistics file does not

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = _cli([*argv, "--out", str(out)], preexec_fn=limit_file_size)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2, err
    assert_one_clear_error(proc.returncode, err, f"cannot write {out / 'detect_stats'}/batch-", "(File too large)",
                           f"rerun the same command to resume it: vrh {' '.join(argv)} --out {out}")
    assert "Traceback" not in err, err
    assert_nothing_half_written(out)
    _resumes_to_a_fresh_run(argv, out, tmp_path, capsys)


def test_scores_of_another_model_that_fit_are_used_as_a_transfer_and_recorded(tmp_path: Path,
                                                                              capsys: pytest.CaptureFixture[str]):
    """Cross-model index transfer is a feature: allowed when every head exists, said in the output and recorded
    in the run folder's manifest as the heads' source."""
    path = scores_file(tmp_path / "s.json", 2, 4, "other/model")
    out = tmp_path / "run"
    code = main(["sweep", *TINY, "--scores", str(path), "--data", "synthetic:eval:2", "--ks", "0,1",
                 "--random-sets", "1", "--out", str(out), "--json"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert ("vrh sweep: warning: head scores of other/model (2 layers x 4 heads) applied by index to tiny:qwen2_vl "
            "(2 layers x 4 heads): an index transfer") in err
    source = json.loads((out / "manifest.json").read_text())["heads_source"]
    assert source["kind"] == "scores-transfer" and source["scores_model"]["model_id"] == "other/model"
    code = main(["scan", *TINY, "--scores", str(path), "--data", "synthetic:eval:1", "--limit", "1", "--heads",
                 "L0H0", "--out", str(tmp_path / "scan"), "--json"])
    err = capsys.readouterr().err
    assert code == 0 and "vrh scan: warning: head scores of other/model" in err, err
    assert json.loads((tmp_path / "scan" / "scan" / "manifest.json").read_text())["heads_source"] == source


def test_an_unreachable_hub_falls_back_to_the_cached_copy_at_once(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The positive side of failing fast: a hub id whose copy is in the HF cache loads without the hub (one
    short request, then ``local_files_only``), and is the model that was cached."""
    from vrh_interp.specs import load_spec
    from vrh_interp.core.description.tiny import build_tiny

    no_hub(monkeypatch, tmp_path)
    tiny = build_tiny("llava")  # its processor rebuilds through AutoProcessor (the image-only fixtures' do not)
    snapshot = tmp_path / "hf-cache" / "models--org--tiny" / "snapshots" / ("a" * 40)
    tiny.model.save_pretrained(snapshot)
    tiny.processor.save_pretrained(snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("a" * 40)
    started = time.monotonic()
    with pytest.warns(UserWarning, match="the hub did not answer .*using the cached copy of org/tiny"):
        vlm = load_spec("org/tiny")
    assert time.monotonic() - started < 30
    inputs = {"input_ids": torch.tensor([[1, 2, 3]])}
    with torch.no_grad():
        torch.testing.assert_close(vlm.hf_model(**inputs).logits, tiny.model(**inputs).logits, rtol=0, atol=0)


def test_every_module_the_library_imports_is_a_core_dependency() -> None:
    """The class behind `vrh demo` dying on a missing matplotlib after minutes of work: every third-party module
    imported anywhere in vrh_interp comes with `pip install vrh-interp` (a core dependency or one of theirs)."""
    import ast
    import importlib.metadata as md

    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    core = [Requirement(r).name for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
            ["dependencies"]]
    installed, todo = set(), list(core)
    while todo:  # the core dependencies and everything they require (without extras)
        name = todo.pop().lower().replace("_", "-")
        if name in installed:
            continue
        installed.add(name)
        for text in md.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    providers = md.packages_distributions()
    missing: dict[str, set[str]] = {}
    for path in (ROOT / "vrh_interp").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for top in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"vrh_interp"}:
                dists = {d.lower().replace("_", "-") for d in providers.get(top, [top])}
                if not dists & installed:
                    missing.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    # optional extras: imported only by the module that needs them, which refuses in one line naming the extra
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    optional = {"transformer_lens": "tl", "ray": "ray"}
    for top, extra in optional.items():
        assert any(Requirement(r).name.replace("-", "_") == top for r in extras[extra]), (top, extra)
        missing.pop(top, None)
    assert not missing, f"imported but not installed with vrh-interp's core dependencies: {missing}"


@pytest.mark.parametrize("argv, words", [
    (["demo", "--model", "toy:nosuch"], "no such toy model"),
    (["demo", "--model", "tiny:nosuch"], "no such tiny family"),
    (["demo", "--model", "tiny:llava", "--transfer-model", "toy:nosuch"], "no such toy model"),
    (["demo", "--model", "tiny:llava", "--transfer-model", "tiny:llava"], "is the main model"),
    (["demo", "--model", "tiny:llava", "--budget-seconds", "0"], "not a positive number"),
    (["demo", "--model", "tiny:llava", "--budget-seconds", "nan"], "outside"),
])
def test_a_demo_plan_fault_is_refused_before_any_step(argv: list[str], words: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 53: a typo'd model or transfer model, the main model as its own transfer partner (cross-masked with
    itself it reads as transfer) and a zero or non-finite cap are refused before the positive control or any other
    step: exit 2, one line naming the option, no step begun, no run folder left."""
    out = tmp_path / "demo"
    try:
        code = main([*argv, "--out", str(out), "--no-positive-control"])
    except SystemExit as stop:  # argparse's refusal of a value
        code = stop.code
    captured = capsys.readouterr()
    assert code == 2 and words in captured.err and "Traceback" not in captured.err
    assert "[2/10]" not in captured.out and not out.exists()


def test_an_out_folder_vrh_did_not_make_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 53: ``--out`` (or a link to it) naming a non-empty folder with no vrh run marker in it is refused
    before any work, its contents untouched; an empty folder and a vrh run folder are accepted."""
    foreign = tmp_path / "etc"
    foreign.mkdir()
    (foreign / "passwd").write_text("root:x:0:0\n")
    link = tmp_path / "link"
    link.symlink_to(foreign)
    for out in (foreign, link):
        assert main([*DETECT, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "no vrh run made" in err and "passwd" in err and "Traceback" not in err
        assert sorted(os.listdir(foreign)) == ["passwd"]
    assert "a link to" in (main([*DETECT, "--out", str(link)]) == 2 and capsys.readouterr().err)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([*DETECT, "--out", str(empty), "--json"]) == 0
    capsys.readouterr()
    assert main([*DETECT, "--out", str(empty), "--json"]) == 0  # its own run folder: resumed
