"""Hostile and careless command lines: options and data fields that used to be misread, and resource limits.

Every case ends with a non-zero exit code and one clear message on stderr (no "Traceback"), within seconds, and
writes nothing. Most run ``main()`` in-process (options are checked before any model loads); two run the real
``vrh`` entry point as a subprocess, and the JSONL row cases run end to end on the toy model.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from PIL import Image

from vrh_interp.apps.cli import main
from vrh_interp.data.datasets.errors import DatasetError
from vrh_interp.data.sources import load_data

OPTION_CASES = [  # (argv, words the message must contain)
    (["detect", "--top", "-5"], "--top: -5 is too small"),
    (["detect", "--top", "0"], "--top: 0 is too small"),
    (["merge", "out", "a", "--top", "-1"], "--top"),
    (["patch", "--vrhs", ""], "empty head set"),
    (["patch", "--vrhs", " , "], "empty head set"),
    (["sweep", "--vrhs", ""], "empty head set"),
    (["patch", "--vrhs", "L2H6,L2H6"], "duplicate head L2H6"),
    (["scan", "--scores", "s.json", "--heads", "L1"], "cannot parse 'L1' as a head"),
    (["sweep", "--scores", "s.json", "--ks", ""], "no k values"),
    (["sweep", "--scores", "s.json", "--ks", "1,inf"], "k value 'inf'"),
    (["sweep", "--scores", "s.json", "--ks", "-3"], "k value '-3'"),
    (["sweep", "--scores", "s.json", "--ks", "150%"], "between 0% and 100%"),
    (["sweep", "--scores", "s.json", "--seeds", "1,1"], "distinct seeds"),
    (["sweep", "--scores", "s.json", "--seeds", "a"], "distinct seeds"),
    (["sweep", "--scores", "s.json", "--iou", "nan"], "--iou: nan is outside 0 .. 1"),
    (["sweep", "--scores", "s.json", "--iou", "1.5"], "outside 0 .. 1"),
    (["sweep", "--scores", "s.json", "--random-sets", "0"], "--random-sets: 0 is too small"),
    (["detect", "--batch-size", "0"], "--batch-size: 0 is too small"),
    (["detect", "--max-new-tokens", "-1"], "--max-new-tokens"),
    (["detect", "--batch-size", "1" * 5000], "is not a whole number"),
    (["detect", "--shard", "3/2"], "shard index 3 is out of range"),
    (["detect", "--shard", "²/3"], "is not INDEX/COUNT"),
    (["detect", "--data", "synthetic:detect:100000000"], "scene count 100000000 out of range"),
    (["detect", "--data", "synthetic:detect:5:7"], "difficulty level 7 does not exist"),
    (["detect", "--data", "synthetic:detect:5:-1"], "LEVEL 0, 1 or 2"),
    (["detect", "--data", "synthetic:test:5"], "unknown synthetic split 'test'"),
    (["detect", "--data", "nope:x"], "unknown data spec 'nope:x'"),
    (["detect", "--data", "jsonl:a.jsonl:on_error=skip:on_error=raise"], "option 'on_error' given twice"),
    (["detect", "--preset", "nope"], "unknown preset 'nope'"),
    (["reproduce", "--data", "synthetic:eval:3", "--vqa", "nope:x"], "unknown VQA benchmark in 'nope:x'"),
    (["scan", "--scores", "s.json", "--limit", "0"], "--limit: 0 is too small"),
    (["design-space", "--k", "0"], "--k: 0 is too small"),
    (["demo", "--budget-seconds", "-1"], "--budget-seconds"),
    (["patch", "--pairs", "0"], "--pairs: 0 is too small"),
    (["patch", "--probe-scenes", "100000000"], "above the limit of 100000"),
    (["demo", "--eval-scenes", "100000000"], "above the limit of 100000"),
]


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    start = time.monotonic()
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse errors
        code = stop.code
    assert time.monotonic() - start < 30
    return int(code or 0), capsys.readouterr().err


@pytest.mark.parametrize(("argv", "words"), OPTION_CASES, ids=lambda v: str(v)[:40])
def test_bad_options_fail_with_one_clear_message(argv: list[str], words: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main([*argv, "--out", str(tmp_path / "run")] if argv[0] not in ("merge",) else argv, capsys)
    assert code != 0
    assert words in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1
    assert not (tmp_path / "run").exists()


def test_good_specs_still_parse(capsys: pytest.CaptureFixture[str]) -> None:
    from vrh_interp.apps.cli import build_parser

    args = build_parser().parse_args(["sweep", "--scores", "s.json", "--ks", "0,1%,2.5%,5", "--seeds", "0,3",
                                      "--iou", "0.5", "--data", "synthetic:eval:20:2"])
    assert (args.ks, args.seeds, args.iou, args.data) == ("0,1%,2.5%,5", "0,3", 0.5, "synthetic:eval:20:2")
    assert build_parser().parse_args(["patch", "--vrhs", "L2H6,L2H7", "--top", "3"]).vrhs == "L2H6,L2H7"


def run_vrh(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real ``vrh`` entry point (the console script when installed, else ``python -m vrh_interp.apps.cli``)."""
    command = [str(Path(sys.executable).parent / "vrh")] if (Path(sys.executable).parent / "vrh").exists() \
        else [sys.executable, "-m", "vrh_interp.apps.cli"]
    return subprocess.run([*command, *argv], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize(("argv", "words"), [
    (["detect", "--top", "-5"], "--top: -5 is too small"),
    (["detect", "--data", "synthetic:detect:100000000"], "out of range"),
])
def test_the_real_entry_point_prints_no_traceback(argv: list[str], words: str, tmp_path: Path) -> None:
    result = run_vrh(*argv, "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode != 0 and words in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` pixels (no image data follows)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + header
    end = struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(header)) + chunk + struct.pack(">I", zlib.crc32(chunk)) + end


def write_rows(folder: Path, rows: list[dict[str, object]]) -> Path:
    Image.new("RGB", (64, 48), "white").save(folder / "a.png")
    (folder / "bomb.png").write_bytes(png_header(200_000, 200_000))  # PIL's own bomb check
    (folder / "big.png").write_bytes(png_header(10_000, 10_000))  # above our limit, below PIL's
    path = folder / "data.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


GOOD = {"id": "ok", "image": "a.png", "expression": "the cup", "box": [1, 2, 30, 40]}
ROW_CASES = [  # (changes to a good row, words of the error)
    ({"box_format": "cxcywh2"}, "unknown box format 'cxcywh2'"),
    ({"box_format": None}, "unknown box format None"),
    ({"expression": None}, '"expression" must be a non-empty string, got null'),
    ({"expression": "x" * 300_000}, "expression of 300000 characters: the limit is 2000"),
    ({"box": [True, 2, 30, 40]}, "box coordinates must be numbers, got True"),
    ({"box": [1, 2, 30, 10**400]}, "exceeds 1e+09 pixels"),
    ({"box": ["1", 2, 30, 40]}, "box coordinates must be numbers, got '1'"),
    ({"image": "bomb.png"}, "pixels, more than the limit of 89478485"),
    ({"image": "big.png"}, "claims 10000 x 10000 pixels, more than the limit of 89478485"),
    ({"id": None}, '"id" must be a non-empty string or an integer'),
]


@pytest.mark.parametrize(("change", "words"), ROW_CASES, ids=lambda v: str(v)[:30])
def test_jsonl_rows_are_refused_with_the_line_and_skipped_on_request(change: dict[str, object], words: str,
                                                                     tmp_path: Path) -> None:
    path = write_rows(tmp_path, [{**GOOD, **change}, {**GOOD, "id": "ok2"}])
    with pytest.raises(DatasetError) as caught:
        load_data(f"jsonl:{path}")
    assert words in str(caught.value) and "data.jsonl line 1" in str(caught.value)
    kept = load_data(f"jsonl:{path}:on_error=skip")  # on_error=skip holds for every row error, the bomb too
    assert [s.sample_id for s in kept] == ["ok2"] and words in kept.skipped[0].reason


def test_cxcywh_is_read_as_centre_and_size(tmp_path: Path) -> None:
    path = write_rows(tmp_path, [{**GOOD, "box": [20, 24, 10, 8], "box_format": "cxcywh"}])
    (sample,) = load_data(f"jsonl:{path}")
    assert sample.box.as_tuple() == (15.0, 20.0, 25.0, 28.0)


def test_a_jsonl_row_error_ends_the_cli_run_with_one_message(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = write_rows(tmp_path, [{**GOOD, "box_format": "cxcywh2"}])
    code, err = run_main(["detect", "--data", f"jsonl:{path}", "--out", str(tmp_path / "run")], capsys)
    assert code != 0 and "unknown box format 'cxcywh2'" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()
