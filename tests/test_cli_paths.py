"""Every path option of `vrh`, given something it cannot use, is refused up front (issue 34): one line naming the
option and the path, exit 2, nothing created, and before torch, transformers or nnsight load.

Real files and folders in ``tmp_path`` and the real ``main()``; the fail-fast cases run the real entry point in a
fresh interpreter, so that ``sys.modules`` shows what was imported.
"""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
from PIL import Image

from tests.test_cli_hostile import assert_one_clear_error, run_main, scores_file
from vrh_interp.apps.cli import _option_of, build_parser
from vrh_interp.toy import CHECKPOINT_ROOT

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model", "tiny:qwen2_vl", "--batch-size", "2", "--max-new-tokens", "3"]


def layout(t: Path) -> None:
    """A file, a folder, a symlink loop, a dangling link, an image and a scores file in ``t``."""
    (t / "afile").write_text("x")
    (t / "adir").mkdir()
    (t / "loop").symlink_to("loop")
    (t / "dangling").symlink_to("nowhere")
    Image.new("RGB", (32, 32)).save(t / "a.png")
    scores_file(t / "s.json", 2, 4, "tiny")


# (argv, the words the one error line must hold); {t} is the test's folder
CASES: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "--out empty": (["detect", "--out", ""], ("--out ''", "empty path")),
    "--out is a file": (["detect", "--out", "{t}/afile"], ("--out '{t}/afile' is a file, not a folder",)),
    "--out under a file": (["detect", "--out", "{t}/afile/run"], ("--out '{t}/afile/run'", "'{t}/afile' is a file")),
    "--out symlink loop": (["detect", "--out", "{t}/loop"], ("--out '{t}/loop' is a symlink loop",)),
    "--out dangling link": (["detect", "--out", "{t}/dangling"], ("--out '{t}/dangling' is a symlink to 'nowhere'",)),
    "sweep --out empty": (["sweep", "--vrhs", "L0H0", "--out", ""], ("--out ''",)),
    "scan --out is a file": (["scan", "--scores", "{t}/s.json", "--out", "{t}/afile"], ("--out '{t}/afile'",)),
    "design-space --out empty": (["design-space", "--out", ""], ("--out ''",)),
    "demo --out is a file": (["demo", "--out", "{t}/afile"], ("--out '{t}/afile' is a file",)),
    "patch --out empty": (["patch", "--out", ""], ("--out ''",)),
    "reproduce --out is a file": (["reproduce", "--data", "jsonl:{t}/afile", "--out", "{t}/afile"],
                                  ("--out '{t}/afile' is a file",)),
    "merge OUT is a file": (["merge", "{t}/afile", "{t}/adir"], ("OUT '{t}/afile' is a file",)),
    "merge shard missing": (["merge", "{t}/m", "{t}/nope"], ("SHARD_FOLDER '{t}/nope'", "does not exist")),
    "merge shard is a file": (["merge", "{t}/m", "{t}/afile"], ("SHARD_FOLDER '{t}/afile' is a file",)),
    "report RUN empty": (["report", ""], ("RUN ''", "empty path")),
    "report RUN is a file": (["report", "{t}/afile"], ("RUN '{t}/afile' is a file, not a folder",)),
    "--scores missing": (["sweep", "--scores", "{t}/nope.json"], ("--scores '{t}/nope.json'", "does not exist")),
    "--scores is a folder": (["sweep", "--scores", "{t}/adir"], ("--scores '{t}/adir' is a folder, not a file",)),
    "--scores empty": (["scan", "--scores", ""], ("--scores ''", "empty path")),
    "--scores symlink loop": (["sweep", "--scores", "{t}/loop"], ("--scores '{t}/loop' is a symlink loop",)),
    "--data jsonl missing": (["detect", "--data", "jsonl:{t}/nope.jsonl"],
                             ("--data jsonl:{t}/nope.jsonl", "'{t}/nope.jsonl': the data file does not exist")),
    "--data jsonl is a folder": (["detect", "--data", "jsonl:{t}/adir"], ("'{t}/adir' is a folder, not a data file",)),
    "--data refcoco root is a file": (["detect", "--data", "refcoco:{t}/afile"],
                                      ("--data refcoco:{t}/afile", "is a file, not a data folder")),
    "--data refcoco images= missing": (["detect", "--data", "refcoco:{t}/adir:val:images={t}/nope"],
                                       ("images= '{t}/nope'", "image folder does not exist")),
    "--data toloka image dir is a file": (["detect", "--data", "toloka:{t}/afile:{t}/afile"],
                                          ("'{t}/afile' is a file, not a data folder",)),
    "--data lmms path loop": (["detect", "--data", "lmms-refcoco:{t}/loop"], ("'{t}/loop' is a symlink loop",)),
    "--eval-data missing": (["design-space", "--eval-data", "jsonl:{t}/nope"], ("--eval-data jsonl:{t}/nope",)),
    "--detect-data missing (mean ablation)": (["sweep", "--vrhs", "L0H0", "--ablation", "mean", "--detect-data",
                                               "jsonl:{t}/nope"], ("--detect-data jsonl:{t}/nope",)),
    "--vqa path missing": (["reproduce", "--data", "jsonl:{t}/afile", "--vqa", "cvbench:{t}/nope"],
                           ("--vqa cvbench:{t}/nope", "does not exist")),
    "--vqa images= is a file": (["reproduce", "--data", "jsonl:{t}/afile", "--vqa",
                                 "spatialrgpt:{t}/afile:images={t}/afile"], ("images= '{t}/afile' is a file",)),
    "--model folder missing": (["detect", "--model", "{t}/nope"], ("model folder '{t}/nope' does not exist",)),
    "--model is a file": (["detect", "--model", "{t}/afile"], ("is a file, not a model folder",)),
    "--model symlink loop": (["detect", "--model", "{t}/loop"], ("model '{t}/loop'", "cannot look it up")),
    "demo --transfer-model missing": (["demo", "--transfer-model", "./nope"], ("model folder './nope' does not",)),
    "--device meta": (["detect", "--device", "meta"], ("device 'meta' cannot run a model", "--device cpu")),
    "patch --device meta:0": (["patch", "--device", "meta:0"], ("device 'meta:0' cannot run a model",)),
}


def _fill(text: str, t: Path) -> str:
    return text.replace("{t}", str(t))


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_path_option_that_cannot_be_used_is_one_line_naming_it(case: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    layout(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    argv, words = CASES[case]
    code, err = run_main([_fill(a, tmp_path) for a in argv], capsys, limit_s=10)
    assert code == 2, err
    assert_one_clear_error(code, err, *(_fill(w, tmp_path) for w in words))
    assert sorted(os.listdir(tmp_path)) == before  # nothing created: no run folder, no lock in the cwd


def test_a_toy_internvl_folder_by_path_is_one_line_before_its_weights_load(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A shipped InternVL-class toy's folder passed as a path: its processor class is vrh-interp's, not a
    transformers class, so AutoProcessor falls back to the tokenizer; one line naming that and toy:NAME."""
    code, err = run_main(["detect", "--model", str(CHECKPOINT_ROOT / "b"), "--out", str(tmp_path / "run")], capsys,
                         limit_s=30)
    assert_one_clear_error(code, err, "has no image processor transformers can build",
                           "'InternVLImageOnlyProcessor' is not a transformers class", "toy:NAME")


def _immutable(folder: Path) -> Callable[[], None]:
    """``folder`` made unwritable (as root the mode bits do not apply: the immutable flag does); the undo."""
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
            folder.chmod(0o755)
            pytest.skip("cannot make a read-only folder here (root without chattr)")
        return lambda: (subprocess.run(["chattr", "-i", str(folder)], check=True), folder.chmod(0o755))
    return lambda: folder.chmod(0o755)


@pytest.mark.parametrize("target, words", [
    ("ro", ("--out '{t}/ro': no permission to write in this folder",)),
    ("ro/new/run", ("--out '{t}/ro/new/run': no permission to create it in {t}/ro",)),
], ids=["existing folder", "new folder inside"])
def test_an_unwritable_out_is_refused_before_any_work(target: str, words: tuple[str, ...], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ro").mkdir()
    undo = _immutable(tmp_path / "ro")
    try:
        code, err = run_main(["detect", *TINY, "--out", str(tmp_path / target)], capsys, limit_s=10)
    finally:
        undo()
    assert_one_clear_error(code, err, *(_fill(w, tmp_path) for w in words))
    assert list((tmp_path / "ro").iterdir()) == []


def test_an_unreadable_input_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every file whatever its mode")
    scores = scores_file(tmp_path / "s.json", 2, 4, "tiny")
    scores.chmod(0)
    try:
        code, err = run_main(["sweep", *TINY, "--scores", str(scores), "--out", str(tmp_path / "r")], capsys)
    finally:
        scores.chmod(0o644)
    assert_one_clear_error(code, err, f"--scores '{scores}': no permission to read it")


def test_an_empty_out_never_turns_the_current_folder_into_a_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: `--out "$UNSET"` ran in the current folder and exited 0."""
    monkeypatch.chdir(tmp_path)
    code, err = run_main(["detect", "--model", "toy:a", "--data", "synthetic:detect:2", "--out", ""], capsys)
    assert code == 2
    assert_one_clear_error(code, err, "--out")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("rows, words", [
    ("", ("jsonl:{t}/d.jsonl: no samples (it holds no rows)",)),
    ("\n  \n", ("jsonl:{t}/d.jsonl: no samples (it holds no rows)",)),
    ('{"id": "a", "image": "a.png", "expression": "the cup", "expression": "the mug", "box": [1, 1, 9, 9]}\n',
     ("{t}/d.jsonl line 1: key 'expression' is given twice",)),
    ('{"id": "a", "image": "a.png", "expression": "x", "box": [1, 1, 9, 9]}\n'
     '{"id": "b", "image": "a.png", "expression": "x", "box": [1, 1, 9, 9], "meta": {"k": 1, "k": 2}}\n',
     ("{t}/d.jsonl line 2: key 'k' is given twice",)),
    ('{"id": "a", "image": "adir", "expression": "x", "box": [1, 1, 9, 9]}\n',
     ("{t}/d.jsonl line 1: image {t}/adir is a folder, not an image file",)),
    ('{"id": "a", "image": "loop", "expression": "x", "box": [1, 1, 9, 9]}\n',
     ("{t}/d.jsonl line 1: image {t}/loop: cannot look it up",)),
], ids=["empty file", "blank lines", "duplicate key", "duplicate nested key", "image is a folder", "image loop"])
def test_a_jsonl_data_file_is_read_strictly(rows: str, words: tuple[str, ...], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    layout(tmp_path)
    (tmp_path / "d.jsonl").write_text(rows)
    code, err = run_main(["detect", *TINY, "--data", f"jsonl:{tmp_path / 'd.jsonl'}", "--out", str(tmp_path / "r")],
                         capsys)
    assert_one_clear_error(code, err, *(_fill(w, tmp_path) for w in words))
    assert not (tmp_path / "r").exists()


def test_a_full_disk_before_the_first_result_does_not_claim_work_is_kept(tmp_path: Path) -> None:
    """A file-size limit of 10 bytes: the manifest cannot be written, the new folder is removed, and the message
    names the file and its option without the resume hint (nothing is kept)."""
    out = tmp_path / "run"

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (10, 10))

    done = subprocess.run([sys.executable, "-m", "vrh_interp.apps.cli", "detect", *TINY, "--data",
                           "synthetic:detect:2", "--out", str(out)], preexec_fn=limit_file_size, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, timeout=300)
    assert_one_clear_error(done.returncode, done.stderr, f"cannot write {out}/", f"(--out {out}) (File too large)")
    assert "kept" not in done.stderr and "resume" not in done.stderr, done.stderr
    assert not out.exists()


def test_an_os_error_is_named_by_the_option_its_path_came_from(tmp_path: Path) -> None:
    args = build_parser().parse_args(["sweep", "--scores", str(tmp_path / "s.json"), "--data",
                                      f"toloka:{tmp_path / 'q.csv'}:{tmp_path / 'images'}", "--out",
                                      str(tmp_path / "r")])
    assert _option_of(str(tmp_path / "s.json"), args) == f" (--scores {tmp_path / 's.json'})"
    assert _option_of(str(tmp_path / "r" / "detect" / "x.json"), args) == f" (--out {tmp_path / 'r'})"
    assert _option_of(str(tmp_path / "images" / "1.jpg"), args) == \
        f" (--data toloka:{tmp_path / 'q.csv'}:{tmp_path / 'images'})"
    assert _option_of(str(tmp_path / "elsewhere"), args) == "" and _option_of(None, args) == ""


def test_an_os_error_mid_run_names_its_option(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """An OS error that only shows while the command runs (the scores file turned into a folder after the
    checks) ends in one line naming the path and the option, not a bare "[Errno 21] Is a directory"."""
    from vrh_interp.scoring import scores as scores_module

    path = scores_file(tmp_path / "s.json", 2, 4, "tiny")

    def load(cls: type, given: object) -> object:
        raise IsADirectoryError(errno.EISDIR, "Is a directory", str(given))

    monkeypatch.setattr(scores_module.HeadScores, "load", classmethod(load))
    code, err = run_main(["sweep", *TINY, "--scores", str(path), "--data", "synthetic:eval:2", "--out",
                          str(tmp_path / "r")], capsys)
    assert_one_clear_error(code, err, f"{path} (--scores {path}): Is a directory")


FAIL_FAST = {  # wrong inputs whose error needs no model, and what it says
    "missing data file": (["detect", "--data", "jsonl:MISSING.jsonl", "--model", "toy:a", "--out", "X"],
                          "'MISSING.jsonl': the data file does not exist"),
    "missing model folder": (["detect", "--model", "./no-model", "--out", "X"], "does not exist"),
    "empty --out": (["detect", "--out", ""], "--out ''"),
    "--scores is a folder": (["sweep", "--scores", ".", "--out", "X"], "is a folder, not a file"),
    "--device meta": (["detect", "--device", "meta", "--out", "X"], "cannot run a model"),
    "missing vqa path": (["reproduce", "--data", "synthetic:eval:2", "--vqa", "mmstar:nope"], "does not exist"),
}
PROBE = ("import sys\nfrom vrh_interp.apps.cli import main\ncode = main(sys.argv[1:])\n"
         "print('HEAVY=' + ','.join(m for m in ('torch', 'transformers', 'nnsight', 'pandas') if m in sys.modules))\n"
         "sys.exit(code)\n")


@pytest.mark.parametrize("case", sorted(FAIL_FAST))
def test_a_wrong_input_is_reported_before_the_heavy_imports(case: str, tmp_path: Path) -> None:
    argv, words = FAIL_FAST[case]
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    seconds = time.monotonic() - start  # reported, not asserted (a shared CPU): benchmarks/first_error.py times it
    assert done.returncode == 2 and words in done.stderr, (done.stderr, seconds)
    assert done.stdout.strip() == "HEAVY=", (done.stdout, seconds)
    assert list(tmp_path.iterdir()) == []


def test_the_api_refuses_an_empty_run_folder(tmp_path: Path) -> None:
    """`run_dir=""` (an unset variable in a script) is refused by the run folder itself, not the current folder."""
    from vrh_interp.core.bookkeeping.paths import PathOptionError
    from vrh_interp.core.bookkeeping.runs import RunFolder

    with pytest.raises(PathOptionError, match="run_dir '' is an empty path"):
        RunFolder("", {"kind": "x"})
