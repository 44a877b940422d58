"""Unusable input fails with the file and row named, or is skipped and listed with ``on_error="skip"``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from tests.datasets import fixtures
from vrh_interp.core.description.boxes import Box
from vrh_interp.data.datasets.errors import DatasetError, SkippedRow
from vrh_interp.data.datasets.jsonl import load_jsonl
from vrh_interp.data.datasets.lmms_refcoco import load_lmms_refcoco
from vrh_interp.data.datasets.refer import load_refer
from vrh_interp.data.datasets.toloka import load_toloka

PARQUET = "val-00000-of-00001.parquet"


def _replace_image(folder: Path, row: int, data: bytes) -> None:
    path = folder / "data" / PARQUET
    table = pq.read_table(path)
    images = table.column("image").to_pylist()
    images[row] = {"bytes": data, "path": None}
    field = table.schema.field("image")
    replaced = table.set_column(table.schema.get_field_index("image"), field, pa.array(images, type=field.type))
    pq.write_table(replaced, path, row_group_size=2)


def test_corrupt_embedded_image_names_file_and_row_or_is_skipped(tmp_path: Path) -> None:
    fixtures.write_lmms_refcoco(tmp_path, fixtures.lmms_rows(5))
    _replace_image(tmp_path, 3, b"this is not an image")
    with pytest.raises(DatasetError, match=rf"data/{PARQUET} row 3: not a readable image"):
        load_lmms_refcoco(tmp_path)
    loaded = load_lmms_refcoco(tmp_path, on_error="skip")
    assert [s.sample_id for s in loaded] == ["q0", "q1", "q2", "q4"]
    assert len(loaded.skipped) == 1 and isinstance(loaded.skipped[0], SkippedRow)
    assert loaded.skipped[0].where.endswith(f"{PARQUET} row 3")


def test_truncated_image_is_caught_when_verifying_and_when_opened(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(buffer, format="JPEG")
    data = buffer.getvalue()
    fixtures.write_lmms_refcoco(tmp_path, fixtures.lmms_rows(3))
    _replace_image(tmp_path, 1, data[: len(data) * 2 // 3])  # header intact, pixels cut off
    lazy = load_lmms_refcoco(tmp_path)  # the header alone looks fine
    with pytest.raises(DatasetError, match=rf"{PARQUET} row 1: cannot decode image"):
        lazy[1].image
    with pytest.raises(DatasetError, match=rf"{PARQUET} row 1: cannot decode image"):
        load_lmms_refcoco(tmp_path, verify_images=True)


def test_box_outside_its_image(tmp_path: Path) -> None:
    rows = fixtures.lmms_rows(3)
    rows[2]["xywh"] = [50, 6, 20, 10]  # x2 = 70 > width 64
    fixtures.write_lmms_refcoco(tmp_path, rows)
    with pytest.raises(DatasetError, match=rf"{PARQUET} row 2: .*lies outside the 64x48 image"):
        load_lmms_refcoco(tmp_path)
    assert len(load_lmms_refcoco(tmp_path, on_error="skip").skipped) == 1


def test_missing_image_file_in_refer_layout(tmp_path: Path) -> None:
    layout = fixtures.write_refer(tmp_path)
    (layout["image_dir"] / "COCO_train2014_000000000025.jpg").unlink()
    with pytest.raises(DatasetError, match=r"refs\(unc\)\.p item 1 \(ref_id 2\): image file .*000000000025\.jpg "
                                           "does not exist"):
        load_refer(tmp_path, "refcoco", "val")
    skipped = load_refer(tmp_path, "refcoco", "val", on_error="skip")
    assert [s.sample_id for s in skipped] == ["refcoco-val-ref1"] and len(skipped.skipped) == 1


def test_resized_coco_image_is_refused(tmp_path: Path) -> None:
    layout = fixtures.write_refer(tmp_path)
    fixtures.write_image(layout["image_dir"] / "COCO_train2014_000000000009.jpg", 32, 24)
    with pytest.raises(DatasetError, match="is 32x24 but instances.json says 64x48"):
        load_refer(tmp_path, "refcoco", "val")


def test_every_row_skipped_or_empty_split_is_an_error(tmp_path: Path) -> None:
    fixtures.write_lmms_refcoco(tmp_path, fixtures.lmms_rows(2))
    _replace_image(tmp_path, 0, b"x")
    _replace_image(tmp_path, 1, b"y")
    with pytest.raises(DatasetError, match=r"no samples for \{'split': 'val', 'per': 'object'\} \(2 rows skipped"):
        load_lmms_refcoco(tmp_path, on_error="skip")
    with pytest.raises(DatasetError, match=r"no parquet files for split 'testB'"):
        load_lmms_refcoco(tmp_path, "testB")
    fixtures.write_lmms_refcoco(tmp_path / "empty", [])
    with pytest.raises(DatasetError, match="no samples"):
        load_lmms_refcoco(tmp_path / "empty")


def test_repeated_sample_id_is_a_row_error(tmp_path: Path) -> None:
    rows = fixtures.lmms_rows(3)
    rows[2]["question_id"] = "q0"
    fixtures.write_lmms_refcoco(tmp_path, rows)
    with pytest.raises(DatasetError, match=rf"{PARQUET} row 2: duplicate sample id 'q0'"):
        load_lmms_refcoco(tmp_path)
    loaded = load_lmms_refcoco(tmp_path, on_error="skip")
    assert [s.box for s in loaded] == [Box(*r["xyxy"]) for r in rows[:2]] and len(loaded.skipped) == 1


def test_unknown_column_layout_names_the_file_and_the_columns(tmp_path: Path) -> None:
    fixtures.write_parquet(tmp_path / "data" / PARQUET, {"id": [1], "caption": ["x"]})
    with pytest.raises(DatasetError, match=rf"{PARQUET}: unknown column layout for lmms-lab RefCOCO.*missing columns "
                                           r"\['question_id', 'image', 'answer', 'bbox'\]"):
        load_lmms_refcoco(tmp_path)
    csv_path = tmp_path / "bad.csv"
    csv_path.write_text("url,x,y\na,1,2\n")
    with pytest.raises(DatasetError, match=r"bad\.csv: unknown column layout: missing columns"):
        load_toloka(csv_path, tmp_path)


def test_jsonl_row_errors(tmp_path: Path) -> None:
    fixtures.write_image(tmp_path / "a.png", 20, 10)
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join([
        json.dumps({"id": "ok", "image": "a.png", "expression": "x", "box": [0, 0, 5, 5]}),
        "{not json",
        json.dumps({"id": "gone", "image": "missing.png", "expression": "x", "box": [0, 0, 5, 5]}),
        json.dumps({"id": "swap", "image": "a.png", "expression": "x", "box": [2, 3, 5, 1]}),
        json.dumps({"id": "nobox", "image": "a.png", "expression": "x"}),
    ]) + "\n")
    with pytest.raises(DatasetError, match=r"data\.jsonl line 2: JSONDecodeError"):
        load_jsonl(path)
    loaded = load_jsonl(path, on_error="skip")
    assert [s.sample_id for s in loaded] == ["ok"]
    reasons = {row.where.rsplit(" ", 1)[1]: row.reason for row in loaded.skipped}
    assert set(reasons) == {"2", "3", "4", "5"}
    assert "missing.png does not exist" in reasons["3"]
    assert "zero or negative area" in reasons["4"] and "missing keys ['box']" in reasons["5"]
