"""RefSpatial-Bench (BAAI, from RoboRefer; apache-2.0): spatial referring with masks, scored as boxes or points.

On disk, either parquet ``DIR/data/{location,placement,unseen}-*.parquet`` (100 / 100 / 77 rows) with id,
image, mask (a binary image, embedded), object, prompt, suffix, step, or the raw folders
``DIR/{Location,Placement,Unseen}/question.json`` (a list of {id, object, prompt, suffix, rgb_path,
mask_path, category, step}, paths relative to that folder) with ``image/`` and ``mask/``.

The benchmark has no boxes. Grounding uses ``object`` (the referring expression) and, as GT, the tight
bounding box of the mask's nonzero pixels (xyxy, exclusive right/bottom edges), the most plausible reading
of the paper's box IoU on the location split [I]. The mask must have the image's size. Two mask-based
scorers are offered beside IoU: ``points_in_mask`` (the official metric: share of predicted points inside
the mask) and ``center_in_mask`` (a predicted box's centre inside the mask).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from vrh_interp.core.description.boxes import Box, BoxParseFailure
from vrh_interp.data.datasets.errors import DatasetError, OnError, RowErrors
from vrh_interp.data.datasets.images import ImageFile, ImageSource
from vrh_interp.data.datasets.parquet import open_tables, split_files
from vrh_interp.data.datasets.samples import GroundingSample, SampleSet, finish

REFSPATIAL_SPLITS: tuple[str, ...] = ("location", "placement", "unseen")
REFSPATIAL_COLUMNS: tuple[str, ...] = ("id", "image", "mask", "object")


@dataclass(frozen=True)
class RefSpatialSample(GroundingSample):
    mask_source: ImageSource | None = field(default=None, repr=False)

    @property
    def mask(self) -> np.ndarray:
        """Boolean [height, width] mask (decoded on every read)."""
        if self.mask_source is None:
            raise ValueError(f"sample {self.sample_id} has no mask")
        return mask_array(self.mask_source)


def mask_array(source: ImageSource) -> np.ndarray:
    return np.asarray(source.open().convert("L")) > 0


def mask_box(mask: np.ndarray, where: str) -> Box:
    """Tight xyxy box of the nonzero pixels (x2, y2 one past the last pixel)."""
    rows, cols = np.nonzero(mask)
    if rows.size == 0:
        raise DatasetError(where, "mask is empty: no referent pixels")
    return Box(float(cols.min()), float(rows.min()), float(cols.max() + 1), float(rows.max() + 1))


def points_in_mask(points: Sequence[tuple[float, float]], mask: np.ndarray) -> float:
    """Share of (x, y) points, in original pixels, that fall on a mask pixel (0 for no points)."""
    if not points:
        return 0.0
    height, width = mask.shape
    inside = 0
    for x, y in points:
        col, row = math.floor(x), math.floor(y)
        inside += 0 <= col < width and 0 <= row < height and bool(mask[row, col])
    return inside / len(points)


def center_in_mask(box: Box | BoxParseFailure, mask: np.ndarray) -> bool:
    """Whether a predicted box's centre falls on a mask pixel (a parse failure is False)."""
    if isinstance(box, BoxParseFailure):
        return False
    return points_in_mask([box.center], mask) == 1.0


def _sample(sample_id: str, expression: str, image: ImageSource, image_size: tuple[int, int], mask: ImageSource,
            where: str, meta: dict[str, Any]) -> RefSpatialSample:
    mask_pixels = mask_array(mask)
    if mask_pixels.shape != (image_size[1], image_size[0]):
        raise DatasetError(where, f"mask is {mask_pixels.shape[1]}x{mask_pixels.shape[0]} but the image is "
                                  f"{image_size[0]}x{image_size[1]}")
    box = mask_box(mask_pixels, where)
    return RefSpatialSample(sample_id=sample_id, expression=expression, box=box, image_size=image_size,
                            image_source=image, meta=meta, mask_source=mask)


def load_refspatial(path: str | Path, split: str = "location", *, on_error: OnError = "raise",
                    verify_images: bool = False) -> SampleSet[RefSpatialSample]:
    if split not in REFSPATIAL_SPLITS:
        raise ValueError(f"RefSpatial-Bench split must be one of {REFSPATIAL_SPLITS}, got {split!r}")
    path = Path(path)
    raw = path / split.capitalize() / "question.json"
    if raw.is_file():
        return _from_raw(raw, split, on_error, verify_images)
    return _from_parquet(path, split, on_error, verify_images)


def _from_parquet(path: Path, split: str, on_error: OnError, verify_images: bool) -> SampleSet[RefSpatialSample]:
    errors = RowErrors(on_error)
    samples: list[RefSpatialSample] = []
    for table in open_tables(split_files(path, split, what="RefSpatial-Bench parquet"), REFSPATIAL_COLUMNS,
                             layout="RefSpatial-Bench (id, image, mask, object)"):
        columns = [c for c in ("id", "object", "prompt", "step") if c in table.columns]
        for row in table.rows(columns):
            with errors.row(row.where):
                image = table.image("image", row)
                meta = {"prompt": row.values.get("prompt"), "step": row.values.get("step"), "row": row.where}
                samples.append(_sample(f"refspatial-{split}-{row.values['id']}", str(row.values["object"]), image,
                                       image.size(full_decode=verify_images), table.image("mask", row),
                                       row.where, meta))
    return finish(samples, errors, source=f"refspatial:{path}", selection={"split": split, "format": "parquet"})


def _from_raw(questions: Path, split: str, on_error: OnError, verify_images: bool) -> SampleSet[RefSpatialSample]:
    try:
        items = json.loads(questions.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise DatasetError(str(questions), f"not valid JSON: {error}") from error
    if not isinstance(items, list):
        raise DatasetError(str(questions), f"expected a JSON list of questions, got {type(items).__name__}")
    errors = RowErrors(on_error)
    samples: list[RefSpatialSample] = []
    for index, item in enumerate(items):
        where = f"{questions} item {index}"
        with errors.row(where):
            image = ImageFile(questions.parent / item["rgb_path"], where)
            meta = {"prompt": item.get("prompt"), "step": item.get("step"), "category": item.get("category"),
                    "row": where}
            samples.append(_sample(f"refspatial-{split}-{item['id']}", str(item["object"]), image,
                                   image.size(full_decode=verify_images),
                                   ImageFile(questions.parent / item["mask_path"], where), where, meta))
    return finish(samples, errors, source=f"refspatial:{questions}", selection={"split": split, "format": "raw"})
