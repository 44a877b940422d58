"""A user's own grounding data as JSON Lines.

One JSON object per line: ``{"id": "...", "image": "relative/or/absolute.jpg", "expression": "...",
"box": [x1, y1, x2, y2]}`` with the box in ORIGINAL image pixels, xyxy; ``"box_format"`` on a line names
another layout (``"xywh"``: [x, y, w, h]; ``"cxcywh"``: [centre x, centre y, w, h]; ``boxes.BOX_FORMATS``).
Relative image paths resolve against the JSONL file's folder. Blank lines are ignored; other keys go to ``meta``.

Rows are read strictly, so nothing is silently reinterpreted: ``id`` is a string or an integer, ``image`` and
``expression`` non-empty strings (an ``"expression": null`` is an error, not the text "None"), the box four
numbers (``true`` is not 1, ``"12"`` is not 12), an unknown ``box_format`` an error, and so is a key given twice
in one object (plain JSON keeps the last one). Limits (docs/datasets.md):
expressions of at most ``vrh_interp.data.checks.MAX_EXPRESSION_CHARS`` characters, images of at most
``images.MAX_IMAGE_PIXELS`` pixels, coordinates of at most ``boxes.MAX_COORDINATE``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vrh_interp.core.description.boxes import Box
from vrh_interp.data.datasets.errors import DatasetError, OnError, RowErrors
from vrh_interp.data.datasets.images import ImageFile, probe_size
from vrh_interp.data.datasets.samples import GroundingSample, SampleSet, finish

JSONL_KEYS: tuple[str, ...] = ("id", "image", "expression", "box")
ROW_HELP = 'expected {"id": "a1", "image": "a.jpg", "expression": "the red cup", "box": [x1, y1, x2, y2]}'


def _text(row: dict[str, Any], key: str, where: str) -> str:
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(where, f'"{key}" must be a non-empty string, got {json.dumps(value)[:80]}; {ROW_HELP}')
    return value


def _unique_keys(where: str) -> Any:
    """A ``json.loads`` object hook that refuses a key given twice (json keeps the last one, silently)."""
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        row: dict[str, Any] = {}
        for key, value in pairs:
            if key in row:
                raise DatasetError(where, f"key {key!r} is given twice in one object: keep one of them")
            row[key] = value
        return row
    return hook


def _row(line: bytes, where: str) -> dict[str, Any]:
    """One line as a JSON object with the required keys (DatasetError naming the problem otherwise)."""
    try:
        row = json.loads(line.decode("utf-8"), object_pairs_hook=_unique_keys(where))
    except UnicodeDecodeError as error:
        raise DatasetError(where, f"not UTF-8 text ({error.reason} at byte {error.start}): save the file as UTF-8")
    except RecursionError:
        raise DatasetError(where, "JSON nested too deeply") from None
    if not isinstance(row, dict):
        raise DatasetError(where, f"a line must be one JSON object, got {type(row).__name__}; {ROW_HELP}")
    missing = [k for k in JSONL_KEYS if k not in row]
    if missing:
        raise DatasetError(where, f"missing keys {missing}: {ROW_HELP}")
    if isinstance(row["id"], bool) or not isinstance(row["id"], (str, int)) or row["id"] == "":
        raise DatasetError(where, f'"id" must be a non-empty string or an integer, got {json.dumps(row["id"])[:80]}')
    return row


def load_jsonl(path: str | Path, *, on_error: OnError = "raise",
               verify_images: bool = False) -> SampleSet[GroundingSample]:
    path = Path(path)
    if not path.is_file():
        raise DatasetError(str(path), "data file does not exist")
    errors = RowErrors(on_error)
    samples: list[GroundingSample] = []
    with open(path, "rb") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path} line {line_no}"
            with errors.row(where):
                row = _row(line, where)
                expression = _text(row, "expression", where)
                image_path = Path(_text(row, "image", where))
                image_path = image_path if image_path.is_absolute() else path.parent / image_path
                box = Box.from_format(row["box"], row.get("box_format", "xyxy"))
                size = probe_size(image_path, where, full_decode=verify_images)
                samples.append(GroundingSample(
                    sample_id=str(row["id"]), expression=expression, box=box.check_inside(*size), image_size=size,
                    image_source=ImageFile(image_path, where),
                    meta={"row": where, **{k: v for k, v in row.items() if k not in JSONL_KEYS}}))
    return finish(samples, errors, source=f"jsonl:{path}", selection={})
