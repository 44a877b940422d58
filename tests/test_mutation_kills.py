"""Tests written to kill surviving mutants of the modules under mutation testing (docs/testing.md): the box
arithmetic, the box -> token rules, the coordinate frames, the run-record reader and the JSONL reader."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

import pytest

from vrh_interp.core.description.boxes import MAX_COORDINATE, Box, BoxParseFailure, InvalidBoxError, _shown, iou
from vrh_interp.core.description.families import coordinates as co
from vrh_interp.core.bookkeeping.runs import (LOCK_FILE, RecordLog, RunFolder, RunManifestError, RunMismatchError,
                                              RunRecordError, _naming, check_not_running, lock_run_folder,
                                              read_manifest, whole_run_manifest, write_atomic, write_json_atomic)


# ------------------------------------------------------------------ boxes: each value against its definition
def test_box_measures_and_set_operations_follow_their_definitions() -> None:
    box = Box(1, 2, 5, 10)
    assert (box.width, box.height, box.area, box.center) == (4, 8, 32, (3.0, 6.0))
    assert list(box) == [1, 2, 5, 10] and box.as_tuple() == (1, 2, 5, 10)
    other = Box(3, 4, 9, 6)  # overlap [3, 5) x [4, 6): 2 x 2
    assert box.intersection_area(other) == other.intersection_area(box) == 4
    assert box.iou(other) == pytest.approx(4 / (32 + 12 - 4))
    assert Box(0, 0, 1, 1).intersection_area(Box(2, 2, 3, 3)) == 0  # apart on both axes
    assert Box(0, 0, 1, 1).intersection_area(Box(0, 5, 1, 6)) == 0  # overlapping x, apart in y
    assert Box(0, 0, 1, 1).intersection_area(Box(5, 0, 6, 1)) == 0  # overlapping y, apart in x
    assert iou(box, box) == 1.0 and iou(BoxParseFailure("t", "r"), box) == 0.0
    assert Box(-5, -5, 50, 60).clipped(40, 30) == Box(0, 0, 40, 30)
    assert Box(2, 3, 7, 8).clipped(40, 30) == Box(2, 3, 7, 8)


@pytest.mark.parametrize("values, box_format, want", [
    ([1, 2, 3, 4], "xyxy", (1, 2, 3, 4)), ([1, 2, 3, 4], "xywh", (1, 2, 4, 6)),
    ([10, 20, 4, 6], "cxcywh", (8, 17, 12, 23)), ((1.5, 2, 3, 4.5), "xyxy", (1.5, 2, 3, 4.5)),
])
def test_box_formats(values: list[float], box_format: str, want: tuple[float, ...]) -> None:
    got = Box.from_format(values, box_format)
    assert got.as_tuple() == want and all(isinstance(v, float) for v in got)
    assert Box.from_format([1, 2, 3, 4]).as_tuple() == (1, 2, 3, 4)  # xyxy is the default


@pytest.mark.parametrize("coords, words", [
    ((0, 0, 1, "2"), "must be numbers"), ((0, 0, True, 1), "must be numbers"),
    ((0, 0, MAX_COORDINATE + 1, 1), "finite numbers of at most"), ((-MAX_COORDINATE - 1, 0, 1, 1), "at most"),
    ((0, 0, 0, 1), "zero or negative area"), ((0, 1, 1, 1), "zero or negative area"),
])
def test_bad_boxes_name_their_problem(coords: tuple, words: str) -> None:
    with pytest.raises(InvalidBoxError, match=words):
        Box(*coords)
    Box(0, 0, MAX_COORDINATE, MAX_COORDINATE)  # the limit itself is allowed


@pytest.mark.parametrize("values, box_format, words", [
    ([1, 2, 3], "xyxy", "a box is a list of 4 numbers \\(xyxy\\), got \\[1, 2, 3\\]"),
    ("1,2,3,4", "xyxy", "a box is a list of 4 numbers"), ([1, 2, 3, 4], "xyhw", "unknown box format 'xyhw'"),
    ([1, 2, 3, 4], 0, "unknown box format 0"), ([1, True, 3, 4], "xyxy", "must be numbers, got True in"),
    ([1, 2, 10 ** 400, 4], "xyxy", "<integer of 1329 bits> exceeds 1e\\+09 pixels"),
])
def test_box_format_errors_name_the_values(values: object, box_format: object, words: str) -> None:
    with pytest.raises(InvalidBoxError, match=words):
        Box.from_format(values, box_format)


def test_shown_shortens_long_values() -> None:
    assert _shown([1, 2]) == "[1, 2]" and _shown(list(range(9))) == "[0, 1, 2, 3, 4, 5, 6, 7, ...]"
    assert _shown("x" * 200) == repr("x" * 200)[:120] + "..." and _shown("x" * 10) == repr("x" * 10)
    assert _shown(10 ** 10) == "<integer of 34 bits>" and _shown(10 ** 9) == str(10 ** 9)
    assert _shown("y" * 118, limit=120) == repr("y" * 118)  # exactly the limit: kept whole


@pytest.mark.parametrize("box, inside", [
    (Box(-0.5, -0.5, 100.5, 50.5), True), (Box(-0.6, 0, 10, 10), False), (Box(0, -0.6, 10, 10), False),
    (Box(0, 0, 100.6, 10), False), (Box(0, 0, 10, 50.6), False),
])
def test_check_inside_allows_half_a_pixel(box: Box, inside: bool) -> None:
    if inside:
        assert box.check_inside(100, 50) is box
    else:
        with pytest.raises(InvalidBoxError, match="outside the 100x50 image"):
            box.check_inside(100, 50)


# ------------------------------------------------------------------ coordinate frames
def test_relative_frames_round_trip_against_hand_computed_values() -> None:
    box, size = Box(10, 20, 30, 60), (100, 200)
    assert co.whole_image(size) == (0.0, 0.0, 100.0, 200.0)
    assert co.to_relative(box, size, 1000) == (100, 100, 300, 300)
    assert co.quantised_relative(Box(0.4, 0, 100, 199.6), size, 1000) == [4, 0, 1000, 998]
    assert co.quantised_relative(Box(10, 20, 30, 60), size, (50, 40)) == [5, 4, 15, 12]
    assert co.quantised_relative(Box(-3, -3, 103, 203), size, 10) == [0, 0, 10, 10]  # clamped to the frame
    assert co.checked_relative(box, size, 1000) == [100, 100, 300, 300]
    with pytest.raises(InvalidBoxError):
        co.checked_relative(Box(0, 0, 150, 10), size, 1000)
    assert co.from_relative([100, 100, 300, 300], size, 1000, "t") == box
    assert co.from_relative([0, 0, 1000, 1000], size, 1000, "t") == Box(0, 0, 100, 200)  # the frame's edges


@pytest.mark.parametrize("values, words", [
    ([1, 2, 3], "expected 4 coordinates, found 3"), ([-1, 0, 5, 5], "outside the 0-10 frame"),
    ([0, 0, 11, 5], "outside the 0-10 frame"), ([5, 5, 5, 6], "zero or negative area"),
])
def test_from_relative_failures_say_why(values: list[float], words: str) -> None:
    failure = co.from_relative(values, (100, 100), 10, "the text")
    assert isinstance(failure, BoxParseFailure) and failure.text == "the text" and words in failure.reason


def test_four_number_parsers() -> None:
    assert co.first_four_numbers("box: 1, 2.5 ,3,-4 and 5, 6, 7, 8") == [1.0, 2.5, 3.0, -4.0]
    assert co.first_four_numbers("1, 2, 3") is None
    assert co.first_four_numbers("(1, 2, 3, 4) [5, 6, 7, 8]", co.BRACKETED_FOUR_NUMBERS) == [5, 6, 7, 8]
    assert co.first_four_numbers("[ 1 , 2 , 3 , 4 ]", co.BRACKETED_FOUR_NUMBERS) == [1, 2, 3, 4]
    size = (100, 200)
    assert co.parse_four_numbers("10, 20, 30, 40", co.FOUR_NUMBERS, size, 100, "none") == Box(10, 40, 30, 80)
    assert co.parse_four_numbers("20, 10, 40, 30", co.FOUR_NUMBERS, size, 100, "none", y_first=True) == \
        Box(10, 40, 30, 80)
    assert co.parse_four_numbers("junk", co.FOUR_NUMBERS, size, 100, "no numbers") == BoxParseFailure("junk",
                                                                                                     "no numbers")
    within = co.parse_four_numbers("answer", co.FOUR_NUMBERS, size, 100, "none", within="1, 2, 3, 4")
    assert within == Box(1, 4, 3, 8)


def test_relative_boxes_within_a_region() -> None:
    region = (10.0, 20.0, 110.0, 220.0)  # a 100 x 200 view at (10, 20)
    assert co.format_relative_box(Box(10, 20, 60, 120), region) == "[0.00, 0.00, 0.50, 0.50]"
    assert co.format_relative_box(Box(0, 0, 200, 400), region) == "[0.00, 0.00, 1.00, 1.00]"  # clamped
    assert co.format_relative_box(Box(11.234, 20, 60, 120), region) == "[0.01, 0.00, 0.50, 0.50]"
    assert co.parse_relative_box("x [0.5, 0.25, 1, 0.75] y", region) == Box(60, 70, 110, 170)
    assert co.parse_relative_box("0.5, 0.25, 1, 0.75", region).reason == "no [x1, y1, x2, y2] box found"
    assert isinstance(co.parse_relative_box("[0.5, 0.25, 1.5, 0.75]", region), BoxParseFailure)
    assert co.json_bbox_answer([1, 2, 3, 4]) == '```json\n[\n\t{"bbox_2d": [1, 2, 3, 4]}\n]\n```'
    assert co.json_bbox_values('[9, 9, 9, 9] {"bbox_2d": [1, 2, 3, 4]}') == [1, 2, 3, 4]
    assert co.json_bbox_values("[5, 6, 7, 8]") == [5, 6, 7, 8]


# ------------------------------------------------------------------ the run-record reader and run folders
def _log(tmp_path: Path, data: bytes, name: str = "detect_records.jsonl", **kwargs) -> RecordLog:
    """The log keyed as its experiment declares (``experiments.declared.record_log``), or as ``kwargs`` say."""
    from vrh_interp.experiments.declared import record_log

    path = tmp_path / name
    path.write_bytes(data)
    return RecordLog(path, **kwargs) if kwargs else record_log(path)


def test_a_record_log_keeps_each_unit_once_in_file_order(tmp_path: Path) -> None:
    a, b = {"sample_id": "a", "x": 1}, {"sample_id": "b", "x": 2}
    lines = b"".join(json.dumps(r).encode() + b"\n" for r in [a, b, a]) + b"\n  \n"
    assert _log(tmp_path, lines).read() == [a, b]
    assert RecordLog(tmp_path / "missing.jsonl").read() == []
    nan = b'{"sample_id": "n", "x": NaN}\n'
    assert len(_log(tmp_path, nan + nan).read()) == 1  # NaN != NaN, but the same text repeats exactly
    keyed = _log(tmp_path, b'{"sample_id": "a", "condition": "c1"}\n{"sample_id": "a", "condition": "c2"}\n',
                 "sweep_records.jsonl")
    assert keyed.key_fields == ("sample_id", "condition") and len(keyed.read()) == 2
    whole = _log(tmp_path, b'{"k": 1}\n{"k": 1}\n{"k": 2}\n', "other.jsonl")
    assert whole.key_fields is None and whole.read() == [{"k": 1}, {"k": 2}]
    assert RecordLog(tmp_path / "x.jsonl", key_fields=("k",)).key_fields == ("k",)
    assert RecordLog(keyed.path).key_fields is None  # the core names no experiment's log: the caller gives keys


@pytest.mark.parametrize("data, words", [
    (b'{"sample_id": "a", "x": 1}\n{"sample_id": "a", "x": 2}\n',
     "line 2: a second, different record of sample_id='a' (the first is on line 1)"),
    (b'{"sample_id": "a"}\nnot json\n{"sample_id": "b"}\n', "line 2: not a JSON record (JSONDecodeError"),
    (b'{"sample_id": "a"}\n[1, 2]\n', "line 2: expected a JSON object, got list"),
    (b'\n{"x": 1}\n', "line 2: the record has no sample_id (its key)"),
    (b"[" * 100_000 + b"\n", "line 1: not a JSON record (RecursionError"),
])
def test_a_damaged_record_log_names_file_and_line(tmp_path: Path, data: bytes, words: str) -> None:
    log = _log(tmp_path, data)
    with pytest.raises(RunRecordError) as caught:
        log.read()
    assert str(caught.value).startswith(f"{log.path} {words}".split(" (")[0]) and words in str(caught.value)


def test_a_torn_last_line_is_dropped_on_read_and_truncated_by_a_writer(tmp_path: Path) -> None:
    data = b'{"sample_id": "a"}\n{"sample_id": "b", "x'
    assert _log(tmp_path, data).read() == [{"sample_id": "a"}]
    assert (tmp_path / "detect_records.jsonl").read_bytes() == data  # a reader changes nothing
    writer = RecordLog(tmp_path / "detect_records.jsonl", repair=True)
    assert (tmp_path / "detect_records.jsonl").read_bytes() == b'{"sample_id": "a"}\n'
    writer.append([{"sample_id": "c", "z": 1}, {"y": 2, "sample_id": "d"}])
    writer.append([])
    assert (tmp_path / "detect_records.jsonl").read_bytes() == (
        b'{"sample_id": "a"}\n{"sample_id": "c", "z": 1}\n{"sample_id": "d", "y": 2}\n')
    whole = _log(tmp_path, b'{"sample_id": "a"}\n')
    RecordLog(whole.path, repair=True)  # nothing torn: unchanged
    assert whole.path.read_bytes() == b'{"sample_id": "a"}\n'
    fresh = RecordLog(tmp_path / "new" / "deeper" / "detect_records.jsonl", repair=True)
    assert fresh.path.parent.is_dir() and not fresh.path.exists()


def test_writes_are_whole_and_name_their_file(tmp_path: Path) -> None:
    path = write_atomic(tmp_path / "a.txt", "héllo")
    assert path == tmp_path / "a.txt" and path.read_bytes() == "héllo".encode()
    write_atomic(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01" and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
    write_json_atomic(tmp_path / "b.json", {"b": 1, "a": [1]})
    assert (tmp_path / "b.json").read_text() == '{\n  "a": [\n    1\n  ],\n  "b": 1\n}'
    with pytest.raises(OSError) as caught:
        write_atomic(tmp_path / "no" / "c.txt", "x")
    assert caught.value.filename is not None and not list((tmp_path).glob("**/*.tmp"))
    named = _naming(OSError(errno.ENOSPC, "No space left on device"), tmp_path / "d")
    assert (named.errno, named.strerror, named.filename) == (errno.ENOSPC, "No space left on device",
                                                             str(tmp_path / "d"))
    kept = OSError(errno.EIO, "I/O", "other")
    assert _naming(kept, tmp_path) is kept and _naming(ValueError("v"), tmp_path).args == ("v",)
    no_errno = OSError("plain")
    assert _naming(no_errno, tmp_path) is no_errno


def test_manifests_are_read_strictly_and_compared_whole(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path / "run", {"kind": "detect", "seed": 1, "path": Path("p")})
    assert read_manifest(tmp_path / "run" / "manifest.json") == {"kind": "detect", "seed": 1, "path": "p"}
    assert folder.config == {"kind": "detect", "seed": 1, "path": "p"}
    assert folder.log("detect_records").path == tmp_path / "run" / "detect_records.jsonl"
    RunFolder(tmp_path / "run", {"kind": "detect", "seed": 1, "path": "p"})  # the same configuration resumes
    with pytest.raises(RunMismatchError, match="seed: folder has 1, this run has 2"):
        RunFolder(tmp_path / "run", {"kind": "detect", "seed": 2, "path": "p"})
    with pytest.raises(RunMismatchError, match="extra: folder has None, this run has 1"):
        RunFolder(tmp_path / "run", {"kind": "detect", "seed": 1, "path": "p", "extra": 1})
    conditions = {f"random:k=1:seed={i}": [f"L0H{i}"] for i in range(40)}
    RunFolder(tmp_path / "conds", {"conditions": conditions})
    grown = {**conditions, "live:k=1:seed=0": ["L1H0"], "random:k=1:seed=3": ["L1H1"]}
    del grown["random:k=1:seed=9"]
    with pytest.raises(RunMismatchError) as refused:
        RunFolder(tmp_path / "conds", {"conditions": grown})
    assert ("conditions: 1 only in the folder (e.g. random:k=1:seed=9), 1 only in this run (e.g. live:k=1:seed=0), "
            "1 different (e.g. random:k=1:seed=3)") in str(refused.value) and len(str(refused.value)) < 400
    with pytest.raises(RunMismatchError, match=r"model: folder has 'x{196}\.\.\., this run has 'y'"):
        RunFolder(tmp_path / "long", {"model": "x" * 300}) and RunFolder(tmp_path / "long", {"model": "y"})
    assert whole_run_manifest(tmp_path / "run", "detect", "a detection run")["seed"] == 1
    with pytest.raises(RunManifestError, match="holds a 'detect' run, not a sweep"):
        whole_run_manifest(tmp_path / "run", "sweep", "a sweep")
    with pytest.raises(FileNotFoundError, match="is not a run folder"):
        whole_run_manifest(tmp_path, "detect", "x")
    (tmp_path / "run" / "manifest.json").write_text('{"kind": "detect", "shard": {"index": 1, "count": 3}}')
    with pytest.raises(RunManifestError, match="holds shard 1/3 only"):
        whole_run_manifest(tmp_path / "run", "detect", "x")
    for data, words in [(b"[]", "it holds list, not a JSON object"), (b"{", "is damaged \\(JSONDecodeError"),
                        (b"\xff", "is damaged \\(UnicodeDecodeError")]:
        (tmp_path / "run" / "manifest.json").write_bytes(data)
        with pytest.raises(RunManifestError, match=words):
            read_manifest(tmp_path / "run" / "manifest.json")


def test_the_run_lock_is_reentrant_and_emptied_on_release(tmp_path: Path) -> None:
    first = lock_run_folder(tmp_path / "run")
    owner = json.loads((tmp_path / "run" / LOCK_FILE).read_text())
    assert owner["pid"] == os.getpid() and set(owner) == {"pid", "host", "started", "command"}
    assert lock_run_folder(tmp_path / "run") is first  # re-entrant within a process
    check_not_running(tmp_path / "run")  # this process holds it: not "another run"
    check_not_running(tmp_path / "never")  # no lock file: nothing is running, nothing created
    assert not (tmp_path / "never").exists()
    del first
    assert (tmp_path / "run" / LOCK_FILE).read_text() == ""


# ------------------------------------------------------------------ the box -> token rule's arithmetic
def test_overlapping_spans_against_hand_computed_tilings() -> None:
    from vrh_interp.core.description.families.base import overlapping_spans

    assert overlapping_spans(0, 16, 2, 1, 10) == [0, 1]  # 2 px inside span 1: far above the rounding tolerance
    assert overlapping_spans(10, 20, 2, 16, 20) == [1]  # the tiling starts at 10, not 0
    assert overlapping_spans(0, 16, 2, 8, 12) == [1]  # touching span 0's edge is no overlap
    assert overlapping_spans(0, 1, 0, 0, 1) == []  # no spans
    assert overlapping_spans(0, 30, 3, 0, 30) == [0, 1, 2]
    big = 1e6  # at a million pixels the tolerance is 1e-3: a 5e-4 sliver is float rounding, not overlap
    assert overlapping_spans(big, big + 2, 2, big + 1 - 5e-4, big + 2) == [1]
    assert overlapping_spans(big, big + 2, 2, big + 1 - 5e-3, big + 2) == [0, 1]


def test_check_image_box_and_visual_blocks() -> None:
    import torch

    from vrh_interp.core.description.families.base import VisualBlock, check_image_box

    box = Box(0, 0, 1, 1)
    assert check_image_box(box, (1, 1)) is box
    for size in [(0, 5), (5, 0), (-1, 5)]:
        with pytest.raises(InvalidBoxError, match=re.escape(f"image size {size} is not positive")):
            check_image_box(box, size)
    block = VisualBlock("grid", [torch.tensor(3), 4], 1, 2, (0.0, 0.0, 10.0, 10.0))
    assert block.positions == (3, 4) and all(type(p) is int for p in block.positions)
    with pytest.raises(ValueError, match="block 'grid': 3 positions for a 1x2 grid"):
        VisualBlock("grid", [1, 2, 3], 1, 2, (0.0, 0.0, 10.0, 10.0))


def test_a_repeat_with_its_keys_in_another_order_is_the_same_record(tmp_path: Path) -> None:
    log = _log(tmp_path, b'{"sample_id": "a", "x": 1}\n{"x": 1, "sample_id": "a"}\n')
    assert log.read() == [{"sample_id": "a", "x": 1}]


# ------------------------------------------------------------------ the JSONL reader: each refusal, exactly
HELP = 'expected {"id": "a1", "image": "a.jpg", "expression": "the red cup", "box": [x1, y1, x2, y2]}'


@pytest.mark.parametrize("row, reason", [
    (b'{"id": "a", "id": "b", "image": "a.png", "expression": "x", "box": [1, 1, 9, 9]}',
     "key 'id' is given twice in one object: keep one of them"),
    (b'{"id": "a", "image": "a.png", "expression": "x", "box": [1, 1, 9, 9], "m": {"k": 1, "k": 1}}',
     "key 'k' is given twice in one object: keep one of them"),
    (b'{"id": "\xff"}', "not UTF-8 text (invalid start byte at byte 8): save the file as UTF-8"),
    (b"[" * 100_000, "JSON nested too deeply"),
    (b"[1]", f"a line must be one JSON object, got list; {HELP}"),
    (b'{"id": "a"}', f"missing keys ['image', 'expression', 'box']: {HELP}"),
    (b'{"id": true, "image": "a.png", "expression": "x", "box": [1, 1, 9, 9]}',
     '"id" must be a non-empty string or an integer, got true'),
    (b'{"id": "", "image": "a.png", "expression": "x", "box": [1, 1, 9, 9]}',
     '"id" must be a non-empty string or an integer, got ""'),
    (b'{"id": 1.5, "image": "a.png", "expression": "x", "box": [1, 1, 9, 9]}',
     '"id" must be a non-empty string or an integer, got 1.5'),
    (b'{"id": "a", "image": "a.png", "expression": "  ", "box": [1, 1, 9, 9]}',
     f'"expression" must be a non-empty string, got "  "; {HELP}'),
    (b'{"id": "a", "image": 7, "expression": "x", "box": [1, 1, 9, 9]}',
     f'"image" must be a non-empty string, got 7; {HELP}'),
    (b'{"id": "a", "image": "a.png", "expression": "' + b"y" * 100 + b'" , "box": [1, 1, 9, 9], "x": 1}', None),
])
def test_every_jsonl_refusal_names_the_line_and_the_reason(tmp_path: Path, row: bytes, reason: str | None) -> None:
    from PIL import Image

    from vrh_interp.data.datasets.errors import DatasetError
    from vrh_interp.data.datasets.jsonl import load_jsonl

    Image.new("RGB", (16, 16)).save(tmp_path / "a.png")
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'\n{"id": 0, "image": "a.png", "expression": "the cup", "box": [1, 1, 9, 9]}\n' + row + b"\n")
    if reason is None:  # a valid row: read as written, other keys in meta, ids as text
        first, second = load_jsonl(path)
        assert (first.sample_id, second.sample_id, second.expression) == ("0", "a", "y" * 100)
        assert second.meta == {"row": f"{path} line 3", "x": 1} and second.image_size == (16, 16)
        assert second.image_source.path == tmp_path / "a.png" and first.meta["row"] == f"{path} line 2"
        return
    with pytest.raises(DatasetError) as caught:
        load_jsonl(path)
    assert (caught.value.where, caught.value.reason) == (f"{path} line 3", reason)
    skipped = load_jsonl(path, on_error="skip")
    assert len(skipped) == 1 and [(s.where, s.reason) for s in skipped.skipped] == [(f"{path} line 3", reason)]
