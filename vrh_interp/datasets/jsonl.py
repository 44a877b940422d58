"""A user's own grounding data as JSON Lines.

One JSON object per line: ``{"id": "...", "image": "relative/or/absolute.jpg", "expression": "...",
"box": [x1, y1, x2, y2]}`` with the box in ORIGINAL image pixels, xyxy; ``"box_format": "xywh"`` on a line
reads the box as [x, y, w, h]. Relative image paths resolve against the JSONL file's folder. Blank lines are
ignored; other keys go to ``meta``.
"""

from __future__ import annotations

import json
from pathlib import Path

from vrh_interp.boxes import Box
from vrh_interp.datasets.errors import DatasetError, OnError, RowErrors
from vrh_interp.datasets.images import ImageFile, probe_size
from vrh_interp.datasets.samples import GroundingSample, SampleSet, finish

JSONL_KEYS: tuple[str, ...] = ("id", "image", "expression", "box")


def load_jsonl(path: str | Path, *, on_error: OnError = "raise",
               verify_images: bool = False) -> SampleSet[GroundingSample]:
    path = Path(path)
    if not path.is_file():
        raise DatasetError(str(path), "data file does not exist")
    errors = RowErrors(on_error)
    samples: list[GroundingSample] = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path} line {line_no}"
            with errors.row(where):
                row = json.loads(line)
                missing = [k for k in JSONL_KEYS if k not in row]
                if missing:
                    raise DatasetError(where, f"missing keys {missing}: expected id, image, expression, "
                                              "box=[x1, y1, x2, y2]")
                image_path = Path(row["image"])
                image_path = image_path if image_path.is_absolute() else path.parent / image_path
                size = probe_size(image_path, where, full_decode=verify_images)
                values = [float(v) for v in row["box"]]
                box = (Box.from_xywh(*values) if row.get("box_format") == "xywh" else Box(*values)).check_inside(*size)
                samples.append(GroundingSample(
                    sample_id=str(row["id"]), expression=str(row["expression"]), box=box, image_size=size,
                    image_source=ImageFile(image_path, where),
                    meta={"row": where, **{k: v for k, v in row.items() if k not in JSONL_KEYS}}))
    return finish(samples, errors, source=f"jsonl:{path}", selection={})
