"""Shared conversions between native box coordinates and original pixels.

Families differ only in the frame (0-1 floats, 0-1000 integers, resized-input pixels, 1024 bins) and the
surrounding syntax; the arithmetic lives here once. Relative frames are relative to the ORIGINAL image
unless a family says otherwise.
"""

from __future__ import annotations

import re
from typing import Sequence

from vrh_interp.boxes import Box, BoxParseFailure, InvalidBoxError

NUMBER = r"[-+]?\d+(?:\.\d+)?"
FOUR_NUMBERS = re.compile(rf"({NUMBER})\s*,\s*({NUMBER})\s*,\s*({NUMBER})\s*,\s*({NUMBER})")


def to_relative(box: Box, image_size: tuple[int, int], scale: float) -> tuple[float, float, float, float]:
    """xyxy in a frame where the image spans [0, scale] on both axes."""
    width, height = image_size
    return (box.x1 / width * scale, box.y1 / height * scale, box.x2 / width * scale, box.y2 / height * scale)


def from_relative(values: Sequence[float], image_size: tuple[int, int], scale: float, text: str) -> Box | BoxParseFailure:
    """xyxy relative values (image spans [0, scale]) -> Box in original pixels, or a parse failure."""
    if len(values) != 4:
        return BoxParseFailure(text, f"expected 4 coordinates, found {len(values)}")
    if any(v < 0 or v > scale for v in values):
        return BoxParseFailure(text, f"coordinates {list(values)} outside the 0-{scale:g} frame")
    width, height = image_size
    x1, y1, x2, y2 = values
    try:
        return Box(x1 / scale * width, y1 / scale * height, x2 / scale * width, y2 / scale * height)
    except InvalidBoxError as error:
        return BoxParseFailure(text, str(error))


def first_four_numbers(text: str, pattern: re.Pattern[str] = FOUR_NUMBERS) -> list[float] | None:
    """The first run of four comma-separated numbers matched by ``pattern``, or None."""
    match = pattern.search(text)
    if match is None:
        return None
    return [float(g) for g in match.groups()[:4]]
