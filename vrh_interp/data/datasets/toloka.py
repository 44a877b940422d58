"""Toloka VQA grounding (Toloka/WSDMCup2023, CC BY 4.0) from its CSV files.

On disk: a CSV with header ``image,width,height,left,top,right,bottom,question``; the box is
(left, top, right, bottom) = xyxy integer pixels of an image ``width`` x ``height``; ``image`` is a URL or a
bare file name (``000000xxxxxx.jpg``). Images are looked up by basename in a local folder (nothing is
downloaded), and the file's header size must equal the CSV's width and height, since the box is in that
frame. The ``question`` is the referring expression. Files: train (38,990 rows), train_sample (1,000),
test_public (1,705, the paper's set), test_private (4,504). Sample ids are ``<csv stem>-<data row>``.
"""

from __future__ import annotations

import csv
from pathlib import Path
from urllib.parse import urlsplit

from vrh_interp.core.description.boxes import Box
from vrh_interp.data.datasets.errors import DatasetError, OnError, RowErrors
from vrh_interp.data.datasets.images import ImageFile, probe_size
from vrh_interp.data.datasets.samples import GroundingSample, SampleSet, finish

TOLOKA_COLUMNS: tuple[str, ...] = ("image", "width", "height", "left", "top", "right", "bottom", "question")


def image_basename(reference: str) -> str:
    """The file name of a URL or path (``https://host/a/000000123.jpg?x=1`` -> ``000000123.jpg``)."""
    return Path(urlsplit(reference).path if "://" in reference else reference).name


def load_toloka(csv_path: str | Path, image_dir: str | Path, *, on_error: OnError = "raise",
                verify_images: bool = False) -> SampleSet[GroundingSample]:
    csv_path, image_dir = Path(csv_path), Path(image_dir)
    if not csv_path.is_file():
        raise DatasetError(str(csv_path), "Toloka CSV does not exist")
    if not image_dir.is_dir():
        raise DatasetError(str(image_dir), "Toloka image folder does not exist")
    errors = RowErrors(on_error)
    samples: list[GroundingSample] = []
    with open(csv_path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in TOLOKA_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise DatasetError(str(csv_path), f"unknown column layout: missing columns {missing} (expected header "
                                              f"{','.join(TOLOKA_COLUMNS)}, found {reader.fieldnames})")
        for index, row in enumerate(reader):
            where = f"{csv_path} line {reader.line_num}"
            with errors.row(where):
                size = (int(row["width"]), int(row["height"]))
                path = image_dir / image_basename(row["image"])
                found = probe_size(path, where, full_decode=verify_images)
                if found != size:
                    raise DatasetError(where, f"image {path} is {found[0]}x{found[1]} but the CSV says "
                                              f"{size[0]}x{size[1]} (the box is in the CSV's frame)")
                box = Box(*(float(row[c]) for c in ("left", "top", "right", "bottom"))).check_inside(*size)
                samples.append(GroundingSample(
                    sample_id=f"{csv_path.stem}-{index}", expression=row["question"], box=box, image_size=size,
                    image_source=ImageFile(path, where), meta={"image": row["image"], "row": where}))
    return finish(samples, errors, source=f"toloka:{csv_path}", selection={"file": csv_path.name})
