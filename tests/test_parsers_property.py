"""Property-based tests of every user-facing parser: each input either works (and means what it says) or raises
one of the library's own error types with a message; never a raw exception type, never a silent reinterpretation.

Covered: head specs (``Head.parse``, ``HeadSet.parse``, ``HeadSet(str)``), k lists (``parse_ks``), shard specs,
data specs (``sources``), JSONL rows (``load_jsonl``, compared with an independent reading of the row), box
formats (``Box.from_format`` against the formats' definitions), model specs (``resolve_model_source`` offline,
no loading), device and dtype options (``check_device``, ``load_spec``'s dtype check).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from PIL import Image

from vrh_interp.core.description.boxes import BOX_FORMATS, Box, InvalidBoxError
from vrh_interp.data.datasets.errors import DatasetError
from vrh_interp.data.datasets.jsonl import load_jsonl
from vrh_interp.experiments.ks import KSpecError, parse_ks
from vrh_interp.core.description.heads import Head, HeadGeometry, HeadSet, HeadSpecError
from vrh_interp.core.description.model_source import ModelLoadError, check_device, resolve_model_source
from vrh_interp.data.checks import MAX_EXPRESSION_CHARS, InvalidSampleError, as_box, check_samples
from vrh_interp.core.bookkeeping.shards import Shard, ShardSpecError
from vrh_interp.data.sources import (
    GROUNDING_KINDS, MAX_SYNTHETIC_SCENES, VQA_BENCHMARKS, DataSpecError, _synthetic_args, load_data, load_vqa,
    parse_spec,
)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_own_error(error: BaseException) -> None:
    """The library's own error type, with a message."""
    assert type(error).__module__.startswith("vrh_interp"), f"raw {type(error).__name__}: {error}"
    assert str(error).strip(), f"{type(error).__name__} without a message"


# ------------------------------------------------------------------ head specs
HEAD_TEXT = st.one_of(
    st.text(max_size=40),
    st.from_regex(r"[LlHh0-9, \t]{0,30}", fullmatch=True),
    st.lists(st.tuples(st.integers(0, 99), st.integers(0, 99)), max_size=6).map(
        lambda hs: ",".join(f"L{l}H{h}" for l, h in hs)),
    st.text(max_size=20).map(lambda t: "published:" + t),
)


@FAST
@given(HEAD_TEXT)
def test_head_set_specs_parse_to_exactly_the_heads_written_or_fail_clearly(text: str) -> None:
    try:
        heads = HeadSet.parse(text)
    except Exception as error:  # noqa: BLE001 - the property is about which errors escape
        assert_own_error(error)
        with pytest.raises(type(error)):
            HeadSet(text)  # a string given where a HeadSet is expected is parsed the same way
        return
    assert HeadSet(text) == heads
    if not text.strip().lower().startswith("published:"):
        written = [Head(int(l), int(h)) for l, h in re.findall(r"L(\d+)H(\d+)", text, flags=re.IGNORECASE)]
        assert list(heads) == written
        assert HeadSet.parse(str(heads)) == heads


@FAST
@given(st.text(max_size=20))
def test_single_head_specs(text: str) -> None:
    try:
        head = Head.parse(text)
    except HeadSpecError as error:
        assert_own_error(error)
        return
    assert Head.parse(str(head)) == head


def test_a_string_where_a_head_set_is_expected_is_parsed_not_iterated() -> None:
    assert HeadSet("L2H6,L2H7") == HeadSet([Head(2, 6), Head(2, 7)])
    # head_ablation(vlm, "L2H6,L2H7") and every other API that validates heads against the model's grid
    assert HeadGeometry(3, 8, 8, 16).validate("L2H6,L2H7") == HeadSet([Head(2, 6), Head(2, 7)])
    with pytest.raises(HeadSpecError, match="empty head set"):
        HeadSet.parse(" , ")


def test_dict_samples_are_refused_with_the_sample_type_to_use() -> None:
    with pytest.raises(InvalidSampleError, match=r"samples\[0\] is a dict.*GroundingSample.*jsonl:PATH"):
        check_samples([{"sample_id": "a", "image": None, "expression": "x", "box": [0, 0, 1, 1]}])
    with pytest.raises(InvalidBoxError, match="got True"):
        as_box([True, 0, 5, 5])


# ------------------------------------------------------------------ k lists and shards
K_TEXT = st.one_of(st.text(max_size=20), st.from_regex(r"[0-9.%,e+\-infa ]{0,16}", fullmatch=True))


@FAST
@given(K_TEXT, st.integers(1, 2000))
def test_k_lists_are_counts_or_percentages_or_fail_clearly(text: str, total: int) -> None:
    try:
        ks = parse_ks(text, total)
    except KSpecError as error:
        assert_own_error(error)
        return
    assert ks == sorted(set(ks)) and all(isinstance(k, int) and k >= 0 for k in ks)
    written = [t.strip() for t in text.split(",")]
    assert len(ks) <= len(written)
    for item in written:
        if item.endswith("%"):
            assert 0 <= float(item[:-1]) <= 100
        else:
            assert float(item) == int(float(item)) and int(float(item)) in ks


@FAST
@given(st.one_of(st.text(max_size=12), st.from_regex(r"[0-9/ ²٣]{0,8}", fullmatch=True)))
def test_shard_specs(text: str) -> None:
    try:
        shard = Shard.parse(text)
    except ShardSpecError as error:
        assert_own_error(error)
        return
    assert 0 <= shard.index < shard.count and str(shard) == f"{shard.index}/{shard.count}"


# ------------------------------------------------------------------ data specs
MISSING = Path(tempfile.mkdtemp(prefix="vrh-specs-")) / "missing"
SPEC_PART = st.one_of(st.text(alphabet=st.characters(blacklist_characters=":\x00"), max_size=8),
                      st.sampled_from(["on_error=skip", "on_error=maybe", "verify_images=true", "per=object",
                                       "images=" + str(MISSING), "seed=x", "split_by=unc", "=", ""]))
KIND = st.sampled_from([*GROUNDING_KINDS, *VQA_BENCHMARKS, "", "nope"])


EMPTY_FOLDER = MISSING.parent / "empty"
EMPTY_FOLDER.mkdir()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(KIND.filter(lambda k: k != "synthetic"), st.sampled_from([MISSING, EMPTY_FOLDER]),
       st.lists(SPEC_PART, max_size=3))
def test_file_backed_data_specs_never_escape_a_raw_error(kind: str, folder: Path, parts: list[str]) -> None:
    spec = ":".join([kind, str(folder), *parts])  # a missing path or an empty folder: no data is read
    for load in (load_data, load_vqa):
        with pytest.raises(Exception) as caught:  # noqa: PT011 - the property is about which errors escape
            load(spec)
        assert_own_error(caught.value)


@FAST
@given(st.one_of(st.from_regex(r"synthetic:[a-z]{0,7}(:[0-9a-z²\-]{0,10}){0,3}", fullmatch=True),
                 st.text(max_size=24).map(lambda t: "synthetic:" + t)))
def test_synthetic_specs_are_in_range_or_refused(spec: str) -> None:
    try:
        split, count, level = _synthetic_args(parse_spec(spec))
    except DataSpecError as error:
        assert_own_error(error)
        return
    assert split in ("detect", "eval", "train") and 1 <= count <= MAX_SYNTHETIC_SCENES and level in (0, 1, 2)
    assert spec.split(":")[1:] in ([split, str(int(spec.split(":")[2]))], [split, spec.split(":")[2],
                                                                           spec.split(":")[-1]])


# ------------------------------------------------------------------ box formats
NUMBER = st.one_of(st.integers(-10**12, 10**12), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                   st.integers(10**300, 10**400), st.text(max_size=3), st.none())


def reference_box(values: list[object], box_format: object) -> tuple[float, float, float, float] | None:
    """The formats' definitions, or None where the input is not four plain finite numbers in a known format."""
    if box_format not in ("xyxy", "xywh", "cxcywh") or len(values) != 4:
        return None
    if not all(type(v) in (int, float) and abs(v) <= 1e9 for v in values):
        return None
    a, b, c, d = (float(v) for v in values)
    return {"xyxy": (a, b, c, d), "xywh": (a, b, a + c, b + d),
            "cxcywh": (a - c / 2, b - d / 2, a + c / 2, b + d / 2)}[box_format]


@FAST
@given(st.lists(NUMBER, max_size=6), st.one_of(st.sampled_from(BOX_FORMATS), st.text(max_size=6), st.none()))
def test_box_formats_follow_their_definitions_or_fail_clearly(values: list[object], box_format: object) -> None:
    expected = reference_box(values, box_format)
    try:
        box = Box.from_format(values, box_format)
    except InvalidBoxError as error:
        assert_own_error(error)
        assert expected is None or not (expected[2] > expected[0] and expected[3] > expected[1]) \
            or any(abs(v) > 1e9 for v in expected)
        return
    assert expected is not None and box.as_tuple() == pytest.approx(expected)


# ------------------------------------------------------------------ JSONL rows
DATA = Path(tempfile.mkdtemp(prefix="vrh-jsonl-"))
Image.new("RGB", (64, 48), "white").save(DATA / "a.png")
FIELD = {
    "id": st.one_of(st.text(max_size=6), st.integers(-5, 10**30), st.none(), st.booleans(), st.floats()),
    "image": st.one_of(st.just("a.png"), st.just("missing.png"), st.just(""), st.none(), st.integers()),
    "expression": st.one_of(st.text(max_size=12), st.none(), st.integers(), st.just(""),
                            st.just("x" * (MAX_EXPRESSION_CHARS + 1))),
    "box": st.one_of(st.lists(NUMBER, max_size=5), st.lists(st.integers(0, 64), min_size=4, max_size=4),
                     st.text(max_size=4), st.none()),
}


@st.composite
def jsonl_rows(draw: st.DrawFn) -> dict[str, object]:
    row = {key: draw(strategy) for key, strategy in FIELD.items() if draw(st.integers(0, 9)) > 0}
    if draw(st.booleans()):
        row["box_format"] = draw(st.one_of(st.sampled_from(BOX_FORMATS), st.text(max_size=6), st.none()))
    return row


def reference_sample(row: dict[str, object]) -> tuple[str, str, tuple[float, ...]] | None:
    """What a correct loader reads from ``row`` (64 x 48 image ``a.png``), or None where it must refuse it."""
    if not all(k in row for k in FIELD) or row["image"] != "a.png":
        return None
    sample_id, expression = row["id"], row["expression"]
    if type(sample_id) not in (str, int) or sample_id == "":
        return None
    if not isinstance(expression, str) or not expression.strip() or len(expression) > MAX_EXPRESSION_CHARS:
        return None
    box = reference_box(row["box"], row.get("box_format", "xyxy")) if isinstance(row["box"], list) else None
    if box is None or not (box[2] > box[0] and box[3] > box[1]):
        return None
    if box[0] < -0.5 or box[1] < -0.5 or box[2] > 64.5 or box[3] > 48.5:
        return None
    return str(sample_id), expression, box


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jsonl_rows())
def test_jsonl_rows_read_as_written_or_refused_with_the_line(row: dict[str, object]) -> None:
    path = DATA / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    expected = reference_sample(row)
    try:
        (sample,) = load_jsonl(path)
    except DatasetError as error:
        assert_own_error(error)
        assert expected is None and "rows.jsonl line 1" in str(error), str(error)
        return
    assert expected is not None
    assert (sample.sample_id, sample.expression) == expected[:2]
    assert sample.box.as_tuple() == pytest.approx(expected[2])


@FAST
@given(st.binary(max_size=60))
def test_arbitrary_jsonl_bytes_never_escape_a_raw_error(data: bytes) -> None:
    path = DATA / "bytes.jsonl"
    path.write_bytes(data)
    for on_error in ("raise", "skip"):
        try:
            load_jsonl(path, on_error=on_error)
        except DatasetError as error:
            assert_own_error(error)


# ------------------------------------------------------------------ model specs, devices, dtypes
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=30), st.from_regex(r"[a-zA-Z0-9_.\-]{1,12}/[a-zA-Z0-9_.\-]{1,12}", fullmatch=True)))
def test_model_specs_resolve_or_fail_clearly_offline(spec: str) -> None:
    previous = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"  # never ask the network
    try:
        resolve_model_source(spec)
    except (ModelLoadError, FileNotFoundError) as error:
        assert str(error).strip()
    finally:
        if previous is None:
            del os.environ["HF_HUB_OFFLINE"]
        else:
            os.environ["HF_HUB_OFFLINE"] = previous


@FAST
@given(st.one_of(st.text(max_size=12), st.sampled_from(["cpu", "cuda", "cuda:0", "cuda:-1", "mps", "auto", "meta"])))
def test_device_options(device: str) -> None:
    try:
        check_device(device)
    except ModelLoadError as error:
        assert_own_error(error)


@FAST
@given(st.one_of(st.text(max_size=12), st.sampled_from(["float99", "bfloat16", "float32", "__class__", "nan"])))
def test_dtype_options_are_checked_before_anything_loads(dtype: str) -> None:
    from vrh_interp.specs import load_spec

    with pytest.raises(Exception) as caught:  # noqa: PT011 - the model folder does not exist either way
        load_spec(str(MISSING), dtype=dtype)
    assert isinstance(caught.value, (ModelLoadError, FileNotFoundError)), repr(caught.value)  # dtype, or no folder
    assert "dtype" in str(caught.value) or str(MISSING) in str(caught.value)


@pytest.mark.parametrize("dtype", ["bool", "int8", "float99", "__class__", "finfo"])
def test_dtype_must_be_a_floating_torch_dtype(dtype: str) -> None:
    from vrh_interp.core.description.model_source import parse_dtype

    with pytest.raises(ModelLoadError, match="unknown dtype"):
        parse_dtype(dtype)
    assert parse_dtype("bfloat16") is torch.bfloat16 and parse_dtype(None) is None
