"""``--data`` specifications: where grounding samples come from.

* ``synthetic:SPLIT:N[:LEVEL]`` - N seeded scenes of the synthetic split (``detect``/``eval``/``train``),
  one referent per scene (cycling through the objects so every position and kind occurs), difficulty
  LEVEL (default 1);
* ``jsonl:PATH`` - a user's own grounding data, one JSON object per line:
  ``{"id": "...", "image": "relative/or/absolute.jpg", "expression": "...", "box": [x1, y1, x2, y2]}``
  with the box in ORIGINAL image pixels, xyxy (``"box_format": "xywh"`` on a line converts from xywh).
  Relative image paths resolve against the JSONL file's folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from vrh_interp.boxes import Box, InvalidBoxError


@dataclass(frozen=True)
class LoadedGroundingSample:
    sample_id: str
    image: Image.Image
    expression: str
    box: Box
    meta: dict[str, Any] = field(default_factory=dict)


class DataSpecError(ValueError):
    """A ``--data`` specification or data file that cannot be read."""


def synthetic_samples(split: str, count: int, difficulty: int = 1) -> list[Any]:
    from vrh_interp.data import grounding_samples

    if count < 1:
        raise DataSpecError(f"synthetic data needs a positive scene count, got {count}")
    out = []
    for index in range(count):
        options = grounding_samples(split, index, difficulty)  # type: ignore[arg-type]
        if options:
            out.append(options[index % len(options)])
    return out


def jsonl_samples(path: str | Path) -> list[LoadedGroundingSample]:
    path = Path(path)
    if not path.exists():
        raise DataSpecError(f"data file {path} does not exist")
    samples = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{line_no}"
        try:
            row = json.loads(line)
            image_path = Path(row["image"])
            if not image_path.is_absolute():
                image_path = path.parent / image_path
            box_values = [float(v) for v in row["box"]]
            sample_id, expression = str(row["id"]), str(row["expression"])
        except (KeyError, TypeError, ValueError) as error:
            raise DataSpecError(f"{where}: expected keys id, image, expression, box=[x1,y1,x2,y2] ({error})") from error
        if not image_path.exists():
            raise DataSpecError(f"{where}: image file {image_path} does not exist")
        try:
            with Image.open(image_path) as handle:
                image = handle.convert("RGB")
        except (UnidentifiedImageError, OSError) as error:
            raise DataSpecError(f"{where}: cannot read image {image_path}: {error}") from error
        try:
            box = Box.from_xywh(*box_values) if row.get("box_format") == "xywh" else Box(*box_values)
            box.check_inside(*image.size)
        except (InvalidBoxError, TypeError) as error:
            raise DataSpecError(f"{where}: {error}") from error
        samples.append(LoadedGroundingSample(sample_id, image, expression, box, {"source": where}))
    if not samples:
        raise DataSpecError(f"{path} holds no samples")
    return samples


def load_data(spec: str) -> list[Any]:
    kind, _, rest = spec.partition(":")
    if kind == "synthetic":
        parts = rest.split(":")
        if len(parts) not in (2, 3) or parts[0] not in ("train", "detect", "eval"):
            raise DataSpecError(f"bad synthetic spec {spec!r}: use synthetic:SPLIT:N[:LEVEL], SPLIT in detect/eval/train")
        return synthetic_samples(parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else 1)
    if kind == "jsonl":
        return jsonl_samples(rest)
    raise DataSpecError(f"unknown data spec {spec!r}: use synthetic:SPLIT:N or jsonl:PATH")
