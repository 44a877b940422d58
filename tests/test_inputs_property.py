"""Property-based tests of the inputs added or hardened in issue 34, and of run-folder contents: each input either
works (and means what it says) or raises one of the library's own error types with a message, never an unrelated
exception.

Covered: path options (``core.bookkeeping.paths``) against a folder holding a file, a folder, a symlink loop and a
dangling link; the paths in data specs (``sources.check_paths``); answer budgets
(``core.execution.limits.check_answer_budget``); JSONL rows with repeated keys; run folders' record logs
(``RecordLog.read`` over arbitrary bytes, against an independent reading), manifests (``RunFolder``,
``whole_run_manifest``) and head-scores files (``HeadScores.load``). The parsers of head specs, k lists, shards, data
specs, boxes and model specs are in tests/test_parsers_property.py.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st
from PIL import Image

from tests.test_parsers_property import assert_own_error
from vrh_interp.core.bookkeeping import paths
from vrh_interp.core.execution.limits import InputLimitError, check_answer_budget
from vrh_interp.core.bookkeeping.runs import RunFolder, RunRecordError, whole_run_manifest
from vrh_interp.data.datasets.errors import DatasetError
from vrh_interp.data.datasets.jsonl import load_jsonl
from vrh_interp.data.sources import check_paths
from vrh_interp.experiments.declared import record_log
from vrh_interp.scoring.scores import HeadScores

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])
FOLDER = Path(tempfile.mkdtemp(prefix="vrh-props-"))  # one layout for every example: nothing in it is written
(FOLDER / "afile").write_text("x")
(FOLDER / "adir").mkdir()
(FOLDER / "adir" / "inner").write_text("x")
(FOLDER / "loop").symlink_to("loop")
(FOLDER / "dangling").symlink_to("nowhere")
NAMES = ["afile", "adir", "adir/inner", "loop", "dangling", "nope", "afile/x", "loop/x", "adir/nope/deeper", "."]
PATH_TEXT = st.one_of(
    st.text(max_size=30),
    st.sampled_from(NAMES).map(lambda name: str(FOLDER / name)),
    st.lists(st.sampled_from(["afile", "adir", "loop", "..", ".", "", "x\x00y", "é"]), max_size=4).map(
        lambda parts: str(FOLDER) + "/" + "/".join(parts)),
    st.just("a" * 5000),
)
CHECKS = [paths.output_folder, paths.input_file, paths.input_folder, paths.input_path]


@FAST
@given(PATH_TEXT, st.sampled_from(CHECKS))
def test_a_path_check_accepts_a_usable_path_or_names_the_option(text: str, check) -> None:
    before = sorted(os.listdir(FOLDER))
    try:
        result = check(text, "--opt")
    except paths.PathOptionError as error:
        assert_own_error(error)
        assert str(error).startswith("--opt "), error
        return
    finally:
        assert sorted(os.listdir(FOLDER)) == before  # a check creates nothing
    assert result == Path(text)
    if check is paths.output_folder:
        assert not os.path.exists(text) or os.path.isdir(text)
    elif check is paths.input_file:
        assert os.path.isfile(text) and os.access(text, os.R_OK)
    elif check is paths.input_folder:
        assert os.path.isdir(text)
    else:
        assert os.path.exists(text)


def test_the_path_checks_refuse_the_named_hostile_cases() -> None:
    """The property's oracle on its own: each hostile case is refused, with the words that say why."""
    cases = {("", paths.output_folder): "empty path", ("afile", paths.output_folder): "is a file, not a folder",
             ("afile/x", paths.output_folder): "is a file, not a folder, so nothing", ("loop", paths.input_file):
             "symlink loop", ("dangling", paths.input_path): "is a symlink to 'nowhere'",
             ("adir", paths.input_file): "is a folder, not a file", ("afile", paths.input_folder): "is a file",
             ("nope", paths.input_path): "does not exist"}
    for (name, check), words in cases.items():
        with pytest.raises(paths.PathOptionError, match=words):
            check(str(FOLDER / name) if name else "", "--opt")
    with pytest.raises(paths.PathOptionError, match="must be a path"):
        paths.input_file(3, "--opt")  # type: ignore[arg-type]


SPEC_TEXT = st.one_of(
    st.text(max_size=40),
    st.tuples(st.sampled_from(["jsonl", "refcoco", "lmms-refcoco", "jxu124-refcoco", "toloka", "refspatial",
                               "synthetic", "cvbench", "vaw", "spatialrgpt"]),
              st.lists(st.one_of(st.sampled_from(NAMES).map(lambda n: str(FOLDER / n)), st.text(max_size=8),
                                 st.sampled_from(NAMES).map(lambda n: f"images={FOLDER / n}")), max_size=3)
              ).map(lambda kp: ":".join([kp[0], *kp[1]])),
)


@FAST
@given(SPEC_TEXT, st.booleans())
def test_a_data_spec_names_paths_that_exist_or_fails_clearly(spec: str, vqa: bool) -> None:
    try:
        parsed = check_paths(spec, "--data", vqa=vqa)
    except Exception as error:  # noqa: BLE001 - the property is about which errors escape
        assert_own_error(error)
        return
    if parsed.kind != "synthetic":  # the first part is the data's path in every kind (later ones may be splits)
        assert os.path.exists(parsed.positional[0]), spec
    if "images" in parsed.options and parsed.kind in ("refcoco", "refcoco+", "refcocog", "jxu124-refcoco", "vaw",
                                                      "spatial457", "spatialrgpt"):  # others refuse it when loading
        assert os.path.isdir(parsed.options["images"]), spec


@FAST
@given(st.one_of(st.integers(-10, 10_000), st.floats(allow_nan=True), st.booleans(), st.text(max_size=5),
                 st.none()))
def test_an_answer_budget_fits_the_context_or_is_refused(budget: object) -> None:
    from tests.conftest import tiny_vlm

    vlm = tiny_vlm("qwen2_vl")
    limit = vlm.hf_model.config.get_text_config().max_position_embeddings
    try:
        check_answer_budget(vlm, budget)
    except InputLimitError as error:
        assert_own_error(error)
        assert isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget < limit
        return
    assert isinstance(budget, int) and not isinstance(budget, bool) and 1 <= budget < limit


KEY = st.sampled_from(["id", "image", "expression", "box", "note"])


@FAST
@given(st.lists(st.tuples(KEY, st.sampled_from(['"a"', '"a.png"', '"the cup"', "[1, 1, 9, 9]", "1"])),
                min_size=1, max_size=7))
def test_a_jsonl_row_with_a_key_given_twice_is_refused_naming_the_line(pairs: list[tuple[str, str]]) -> None:
    folder = Path(tempfile.mkdtemp(dir=FOLDER.parent))
    Image.new("RGB", (16, 16)).save(folder / "a.png")
    good = '{"id": "g", "image": "a.png", "expression": "x", "box": [1, 1, 9, 9]}\n'
    row = "{" + ", ".join(f'"{k}": {v}' for k, v in pairs) + "}\n"
    (folder / "d.jsonl").write_text(good + row)
    keys = [k for k, _ in pairs]
    try:
        samples = load_jsonl(folder / "d.jsonl")
    except DatasetError as error:
        assert_own_error(error)
        assert str(error).startswith(f"{folder / 'd.jsonl'} line 2: ")
        if len(set(keys)) < len(keys):
            assert "given twice" in str(error)
        return
    assert len(set(keys)) == len(keys) and len(samples) == 2


RECORD = st.fixed_dictionaries({"sample_id": st.sampled_from(["a", "b", "c"])},
                               optional={"answer": st.text(max_size=5), "iou": st.floats(allow_nan=True)})
LINE = st.one_of(RECORD.map(lambda r: json.dumps(r, sort_keys=True).encode()), st.binary(max_size=12),
                 st.just(b"[1, 2]"), st.just(b'{"answer": 1}'), st.just(b""), st.just(b"{\"sample_id\": \"a\""))


@FAST
@given(st.lists(LINE, max_size=8), st.booleans())
def test_a_record_log_reads_each_unit_once_or_names_the_damaged_line(lines: list[bytes], torn: bool) -> None:
    folder = Path(tempfile.mkdtemp(dir=FOLDER.parent))
    path = folder / "detect_records.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines) + (b'{"sample_id": "z", "ans' if torn else b""))
    try:
        records = record_log(path).read()
    except RunRecordError as error:
        assert_own_error(error)
        assert str(error).startswith(f"{path} line "), error
        return
    # an independent reading: every complete non-blank line is a JSON object with a sample_id; each id's
    # lines are one identical record; the torn last piece is dropped
    expected: dict[str, str] = {}
    for line in lines:
        if line.strip():
            record = json.loads(line)
            assert isinstance(record, dict) and "sample_id" in record
            expected.setdefault(record["sample_id"], json.dumps(record, sort_keys=True))
            assert expected[record["sample_id"]] == json.dumps(record, sort_keys=True)
    assert [json.dumps(r, sort_keys=True) for r in records] == list(expected.values())


MANIFEST = st.one_of(st.binary(max_size=20), st.just(b"[]"), st.just(b'{"kind": 3}'), st.just(b'{"kind": "detect"}'),
                     st.just(b'{"kind": "detect", "shard": 1}'), st.just(b'{"kind": "detect", "shard": {}}'),
                     st.just(b"\xff\xfe"), st.just(b"null"), st.just(b'"text"'))


@FAST
@given(MANIFEST)
def test_a_damaged_manifest_is_refused_with_the_library_s_error(data: bytes) -> None:
    folder = Path(tempfile.mkdtemp(dir=FOLDER.parent))
    (folder / "manifest.json").write_bytes(data)
    for read in (lambda: whole_run_manifest(folder, "detect", "a detection run"),
                 lambda: RunFolder(folder, {"kind": "detect"})):
        try:
            read()
        except Exception as error:  # noqa: BLE001 - the property is about which errors escape
            assert_own_error(error)
            assert str(folder) in str(error), error


@FAST
@given(st.one_of(st.binary(max_size=30), st.just(b"{}"), st.just(b'{"format": "vrh-interp-head-scores"}'),
                 st.just(b"[]"), st.just(b"null")))
def test_a_damaged_scores_file_is_refused_naming_it(data: bytes) -> None:
    path = Path(tempfile.mkdtemp(dir=FOLDER.parent)) / "s.json"
    path.write_bytes(data)
    try:
        HeadScores.load(path)
    except Exception as error:  # noqa: BLE001
        assert isinstance(error, ValueError), f"raw {type(error).__name__}: {error}"
        assert str(path) in str(error)
        return
    assume(False)  # nothing here is a whole scores file
