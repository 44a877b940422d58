"""Loading streams row groups and reads only image headers; pixels are decoded when ``.image`` is read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.datasets import fixtures
from vrh_interp.data.datasets import images as image_module
from vrh_interp.data.datasets import parquet as parquet_module
from vrh_interp.data.datasets.lmms_refcoco import load_lmms_refcoco
from vrh_interp.data.datasets.parquet import ParquetTable


@pytest.fixture
def decode_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    original = image_module.decode_image

    def counting(data: Any, where: str) -> Any:
        calls.append(where)
        return original(data, where)

    monkeypatch.setattr(image_module, "decode_image", counting)
    monkeypatch.setattr(parquet_module, "decode_image", counting)
    return calls


@pytest.fixture
def row_group_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, tuple[str, ...]]]:
    reads: list[tuple[int, tuple[str, ...]]] = []
    original = pq.ParquetFile.read_row_group

    def counting(self: pq.ParquetFile, index: int, columns: Any = None, **kwargs: Any) -> Any:
        reads.append((index, tuple(columns or ())))
        return original(self, index, columns=columns, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counting)
    return reads


def test_loading_decodes_no_pixels_and_reads_each_image_row_group_once(
        tmp_path: Path, decode_calls: list[str], row_group_reads: list[tuple[int, tuple[str, ...]]]) -> None:
    fixtures.write_lmms_refcoco(tmp_path, fixtures.lmms_rows(25), row_group_size=10)
    samples = load_lmms_refcoco(tmp_path)
    assert len(samples) == 25 and decode_calls == []
    assert row_group_reads == [(0, ("image",)), (1, ("image",)), (2, ("image",))]  # sizes: one pass, in order
    row_group_reads.clear()
    sizes = [s.image.size for s in samples]
    assert sizes == [(64, 48)] * 25 and len(decode_calls) == 25
    assert row_group_reads == [(0, ("image",)), (1, ("image",)), (2, ("image",))]
    samples[3].image
    assert len(decode_calls) == 26  # nothing is kept: every read decodes again


def test_rows_stream_in_batches_with_their_positions(tmp_path: Path) -> None:
    path = fixtures.write_parquet(tmp_path / "t.parquet", {"a": list(range(150))}, row_group_size=70)
    table = ParquetTable(path, ["a"], layout="test")
    rows = list(table.rows(["a"]))
    assert [r.values["a"] for r in rows] == list(range(150))
    assert [(r.row_group, r.index_in_group) for r in rows[68:72]] == [(0, 68), (0, 69), (1, 0), (1, 1)]
    assert rows[149].number == 149 and rows[149].where == f"{path} row 149"
    assert table.cell("a", 2, 5) == 145 and table.num_rows == 150
