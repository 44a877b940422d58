"""Streaming reads of Hugging Face style parquet files, and images embedded in them read back one cell at a time.

Loaders never materialise a whole table: ``ParquetTable.rows`` walks the file row group by row group in
small record batches (``pyarrow.ParquetFile.iter_batches``) of the requested (text) columns. An embedded image
(the ``datasets`` Image feature: a struct ``{bytes, path}``) is kept as an ``EmbeddedImage`` (file, column,
row group, index): reading its size or pixels loads that row group's image column chunk, cached one row group
per table, so a pass in file order reads each chunk once and peak memory is one row group of compressed image
bytes (the Hub writes image datasets in row groups of about 100 rows) plus the images being decoded. A cell
holding only a ``path`` (no bytes) names a file relative to the parquet file's folder.

Split files are found the way the Hub lays them out: ``DIR/data/SPLIT-*.parquet``, ``DIR/SPLIT-*.parquet``,
``DIR/SPLIT.parquet``, ``DIR/data/SPLIT.parquet``; a path to one ``.parquet`` file is used as is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from vrh_interp.data.datasets.errors import DatasetError
from vrh_interp.data.datasets.images import ImageData, decode_image, probe_size

BATCH_ROWS = 64


def split_files(path: str | Path, split: str, *, what: str) -> list[Path]:
    """The parquet files of ``split`` under ``path`` (or ``path`` itself when it is a parquet file)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise DatasetError(str(path), f"{what}: no such file or folder")
    patterns = [f"data/{split}-*.parquet", f"{split}-*.parquet", f"{split}.parquet", f"data/{split}.parquet"]
    for pattern in patterns:
        found = sorted(path.glob(pattern))
        if found:
            return found
    present = sorted(p.relative_to(path).as_posix() for p in path.rglob("*.parquet"))[:10]
    raise DatasetError(str(path), f"{what}: no parquet files for split {split!r} (looked for {', '.join(patterns)}; "
                                  f"found {present or 'no parquet files'})")


@dataclass(frozen=True)
class ParquetRow:
    """One row's requested columns, and where it sits in its file."""

    path: Path
    row_group: int
    index_in_group: int
    number: int  # 0-based row number within the file
    values: dict[str, Any]

    @property
    def where(self) -> str:
        return f"{self.path} row {self.number}"


class ParquetTable:
    """One parquet file: column-layout check, streaming rows, and lazy access to single cells."""

    def __init__(self, path: Path, required: Sequence[str], *, layout: str) -> None:
        self.path = Path(path)
        try:
            self._file = pq.ParquetFile(self.path)
        except (OSError, pa.ArrowInvalid) as error:
            raise DatasetError(str(self.path), f"not a readable parquet file: {error}") from error
        self.columns = tuple(self._file.schema_arrow.names)
        missing = [c for c in required if c not in self.columns]
        if missing:
            raise DatasetError(str(self.path), f"unknown column layout for {layout}: missing columns {missing} "
                                               f"(expected {list(required)}, found {list(self.columns)})")
        self._cached_key: tuple[str, int] | None = None
        self._cached_column: pa.Array | None = None

    @property
    def num_rows(self) -> int:
        return self._file.metadata.num_rows

    def rows(self, columns: Sequence[str]) -> Iterator[ParquetRow]:
        number = 0
        for group in range(self._file.num_row_groups):
            index = 0
            for batch in self._file.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=list(columns)):
                for values in batch.to_pylist():
                    yield ParquetRow(self.path, group, index, number, values)
                    index += 1
                    number += 1

    def cell(self, column: str, row_group: int, index: int) -> Any:
        key = (column, row_group)
        if self._cached_key != key:
            self._cached_column = self._file.read_row_group(row_group, columns=[column]).column(0)
            self._cached_key = key
        assert self._cached_column is not None
        return self._cached_column[index].as_py()

    def image(self, column: str, row: ParquetRow) -> "EmbeddedImage":
        """The lazy image in ``column`` of ``row``."""
        return EmbeddedImage(self, column, row.row_group, row.index_in_group, row.where)


def image_data(cell: Any, folder: Path, where: str) -> ImageData:
    """Bytes of an Image-feature cell (``{bytes, path}`` or raw bytes), or the file its ``path`` names."""
    if isinstance(cell, (bytes, bytearray)):
        return bytes(cell)
    if isinstance(cell, dict):
        if cell.get("bytes"):
            return bytes(cell["bytes"])
        if cell.get("path"):
            path = Path(cell["path"])
            return path if path.is_absolute() else folder / path
    raise DatasetError(where, f"no image in this row (expected image bytes or {{bytes, path}}, "
                              f"got {type(cell).__name__})")


@dataclass(frozen=True)
class EmbeddedImage:
    """Image bytes stored in a parquet cell, read back and decoded on ``open()``."""

    table: ParquetTable
    column: str
    row_group: int
    index: int
    where: str

    def _data(self) -> ImageData:
        return image_data(self.table.cell(self.column, self.row_group, self.index), self.table.path.parent, self.where)

    def open(self) -> Image.Image:
        return decode_image(self._data(), self.where)

    def size(self, *, full_decode: bool = False) -> tuple[int, int]:
        return probe_size(self._data(), self.where, full_decode=full_decode)


def open_tables(files: Sequence[Path], required: Sequence[str], *, layout: str) -> list[ParquetTable]:
    return [ParquetTable(path, required, layout=layout) for path in files]
