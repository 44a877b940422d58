"""Grounding loaders on fixtures in the real schemas: boxes in original pixels (xywh vs xyxy), images, units, splits."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from tests.datasets import fixtures
from vrh_interp.core.description.boxes import Box
from vrh_interp.data.datasets.errors import DatasetError
from vrh_interp.data.datasets.jsonl import load_jsonl
from vrh_interp.data.datasets.jxu124_refcoco import load_jxu124_refcoco
from vrh_interp.data.datasets.lmms_refcoco import load_lmms_refcoco
from vrh_interp.data.datasets.refer import load_refer
from vrh_interp.data.datasets.refspatial import center_in_mask, load_refspatial, points_in_mask
from vrh_interp.data.datasets.safe_pickle import UnsafePickleError, load_plain_pickle
from vrh_interp.data.datasets.toloka import image_basename, load_toloka
from vrh_interp.data.checks import check_samples


def test_refer_layout_converts_xywh_and_names_images_from_the_image_id(tmp_path: Path) -> None:
    fixtures.write_refer(tmp_path)
    samples = load_refer(tmp_path, "refcoco", "val")
    assert [s.sample_id for s in samples] == ["refcoco-val-ref1", "refcoco-val-ref2"]
    first, second = samples
    assert first.box == Box(10, 20, 40, 35)  # annotation bbox [10, 20, 30, 15] is xywh
    assert second.box == Box(5, 40, 25, 65)  # read as xyxy it would be invalid (x2 = 20 > ... y2 = 25 < y1 = 40)
    assert first.expression == "left man" and first.meta["sentences"] == ["left man", "man in red"]
    assert first.image_size == (64, 48) and first.image.size == (64, 48)
    assert first.image_source.path.name == "COCO_train2014_000000000009.jpg"  # not the ref's file_name
    # the white rectangle of the fixture lies exactly inside the GT box
    pixels = np.asarray(first.image)
    assert pixels[27, 25].min() > 200 and pixels[5, 5].min() < 200
    check_samples(samples)


def test_refer_units_and_splits(tmp_path: Path) -> None:
    fixtures.write_refer(tmp_path)
    per_expression = load_refer(tmp_path, "refcoco", "val", per="expression")
    assert [s.sample_id for s in per_expression] == ["refcoco-val-ref1-sent10", "refcoco-val-ref1-sent11",
                                                     "refcoco-val-ref2-sent20"]
    assert [s.expression for s in per_expression] == ["left man", "man in red", "tall thing"]
    test_a = load_refer(tmp_path, "refcoco", "testA")
    assert [s.box for s in test_a] == [Box(0, 0, 8, 8)]
    with pytest.raises(DatasetError, match="no samples.*'split': 'testB'"):
        load_refer(tmp_path, "refcoco", "testB")


def test_refer_refcocog_reads_umd_refs(tmp_path: Path) -> None:
    fixtures.write_refer(tmp_path, "refcocog", split_by="umd")
    assert len(load_refer(tmp_path, "refcocog", "val")) == 2
    with pytest.raises(DatasetError, match=r"refs\(google\)\.p.*present: \['refs\(umd\)\.p'\]"):
        load_refer(tmp_path, "refcocog", "val", split_by="google")


def _run_marker(path: str) -> int:
    """Harmless stand-in for a payload: creates a file."""
    Path(path).write_text("code ran")
    return 0


class _CallsMarker:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_run_marker, (self.path,))


class _CallsSystem:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("payload", [_CallsMarker, _CallsSystem])
def test_hostile_refs_pickle_is_refused_without_running_code(tmp_path: Path, payload: type) -> None:
    fixtures.write_refer(tmp_path)
    marker = tmp_path / "marker"
    refs_path = tmp_path / "refcoco" / "refs(unc).p"
    refs_path.write_bytes(pickle.dumps([{"ref_id": 1, "split": "val"}, payload(str(marker))], protocol=2))
    with pytest.raises(DatasetError, match=r"refs\(unc\)\.p: refusing to load global") as raised:
        load_refer(tmp_path, "refcoco", "val")
    assert "can run code" in str(raised.value)
    assert not marker.exists()
    with pytest.raises(UnsafePickleError):
        load_plain_pickle(refs_path)
    assert not marker.exists()


# What Python 2's pickle writes for [{'sent': 'caf\xc3\xa9', 'ids': (1, 2), 'score': 0.5}] (str values are bytes):
PY2_PROTOCOL2 = (b"\x80\x02]q\x00}q\x01(U\x04sentq\x02U\x05caf\xc3\xa9q\x03U\x03idsq\x04K\x01K\x02\x86q\x05"
                 b"U\x05scoreq\x06G?\xe0\x00\x00\x00\x00\x00\x00uaq\x07.")
PY2_PROTOCOL0 = b"(lp0\n(dp1\nS'sent'\np2\nS'man'\np3\nsS'n'\np4\nI7\nsa."


def test_plain_pickle_reads_python2_pickles(tmp_path: Path) -> None:
    (tmp_path / "p2.p").write_bytes(PY2_PROTOCOL2)
    (tmp_path / "p0.p").write_bytes(PY2_PROTOCOL0)
    assert load_plain_pickle(tmp_path / "p2.p") == [{"sent": "café", "ids": (1, 2), "score": 0.5}]
    assert load_plain_pickle(tmp_path / "p0.p") == [{"sent": "man", "n": 7}]


def test_lmms_parquet_boxes_and_units(tmp_path: Path) -> None:
    rows = fixtures.lmms_rows(7)
    fixtures.write_lmms_refcoco(tmp_path, rows, row_group_size=3)
    samples = load_lmms_refcoco(tmp_path, "val")
    assert [s.sample_id for s in samples] == [f"q{i}" for i in range(7)]
    assert [s.box for s in samples] == [Box(*r["xyxy"]) for r in rows]  # bbox column is xywh
    assert samples[6].expression == "object 6" and samples[6].image.size == (64, 48)
    assert samples.selection == {"split": "val", "per": "object"}
    per_expression = load_lmms_refcoco(tmp_path / "data" / "val-00000-of-00001.parquet", per="expression")
    assert [s.sample_id for s in per_expression][:3] == ["q0#0", "q0#1", "q1#0"]
    assert per_expression[1].expression == "thing number 0"


def test_jxu124_parquet_keeps_xyxy_and_resolves_images(tmp_path: Path) -> None:
    fixtures.write_jxu124(tmp_path / "jxu", tmp_path / "coco")
    samples = load_jxu124_refcoco(tmp_path / "jxu", "val", image_root=tmp_path / "coco")
    assert samples.selection["file_split"] == "validation"
    assert [s.box for s in samples] == [Box(10, 20, 40, 35), Box(5, 40, 25, 65)]  # already xyxy
    assert [s.image_source.path.relative_to(tmp_path / "coco").as_posix() for s in samples] == [
        "coco/train2014/COCO_train2014_000000000009.jpg", "COCO_train2014_000000000025.jpg"]
    assert [s.sample_id for s in load_jxu124_refcoco(tmp_path / "jxu", image_root=tmp_path / "coco",
                                                     per="expression")] == ["ref1-sent10", "ref1-sent11", "ref2-sent20"]


def test_toloka_resolves_urls_by_basename_and_checks_the_frame(tmp_path: Path) -> None:
    assert image_basename("https://tlk.s3.yandex.net/wsdm2023/000000123.jpg?x=1") == "000000123.jpg"
    assert image_basename("000000123.jpg") == "000000123.jpg"
    csv_path, image_dir = fixtures.write_toloka(tmp_path, [
        {"name": "000000000001.jpg", "width": 60, "height": 40, "box": (5, 6, 25, 30), "question": "a cup, to drink"},
        {"name": "000000000002.jpg", "width": 30, "height": 50, "box": (1, 2, 29, 49), "question": "a pen"},
    ])
    samples = load_toloka(csv_path, image_dir)
    assert [s.sample_id for s in samples] == ["test_public-0", "test_public-1"]
    assert samples[0].box == Box(5, 6, 25, 30) and samples[0].expression == "a cup, to drink"
    assert samples[1].image_size == (30, 50)


def test_toloka_refuses_an_image_of_another_size(tmp_path: Path) -> None:
    csv_path, image_dir = fixtures.write_toloka(tmp_path, [
        {"name": "a.jpg", "width": 60, "height": 40, "file_width": 30, "file_height": 20, "box": (5, 6, 25, 30),
         "question": "a cup"}])
    with pytest.raises(DatasetError, match=r"test_public\.csv line 2: image .*a\.jpg is 30x20 but the CSV says 60x40"):
        load_toloka(csv_path, image_dir)


@pytest.mark.parametrize("raw", [False, True])
def test_refspatial_box_is_the_tight_mask_box(tmp_path: Path, raw: bool) -> None:
    fixtures.write_refspatial(tmp_path, [(10, 5, 30, 15), (0, 0, 60, 40)], raw=raw)
    samples = load_refspatial(tmp_path, "location")
    assert [s.box for s in samples] == [Box(10, 5, 30, 15), Box(0, 0, 60, 40)]  # exclusive right/bottom edges
    assert samples[0].expression == "the object 0" and samples[0].sample_id == "refspatial-location-0"
    mask = samples[0].mask
    assert mask.shape == (40, 60) and mask.sum() == 20 * 10
    assert points_in_mask([(10.0, 5.0), (29.9, 14.9), (30.0, 10.0), (-1.0, 5.0)], mask) == 0.5
    assert center_in_mask(Box(12, 6, 20, 12), mask) and not center_in_mask(Box(40, 20, 50, 30), mask)
    assert samples.selection["format"] == ("raw" if raw else "parquet")


def test_refspatial_rejects_an_empty_mask(tmp_path: Path) -> None:
    fixtures.write_refspatial(tmp_path, [(10, 5, 30, 15), (10, 5, 10, 15)])
    with pytest.raises(DatasetError, match=r"location-00000-of-00001\.parquet row 1: mask is empty"):
        load_refspatial(tmp_path, "location")
    assert len(load_refspatial(tmp_path, "location", on_error="skip")) == 1


def test_jsonl_reads_xywh_on_request_and_keeps_extra_keys(tmp_path: Path) -> None:
    fixtures.write_image(tmp_path / "img" / "a.png", 64, 48)
    lines = [{"id": "a", "image": "img/a.png", "expression": "left", "box": [1, 2, 11, 22]},
             {"id": "b", "image": str(tmp_path / "img" / "a.png"), "expression": "right", "box": [1, 2, 10, 20],
              "box_format": "xywh", "note": 3}]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    samples = load_jsonl(path)
    assert [s.box for s in samples] == [Box(1, 2, 11, 22), Box(1, 2, 11, 22)]
    assert samples[1].meta["note"] == 3 and samples[1].meta["box_format"] == "xywh"
