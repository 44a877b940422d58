"""Shared conversions between native box coordinates and original pixels.

Families differ only in the frame (0-1 floats, 0-1000 integers, resized-input pixels, 1024 bins) and the
surrounding syntax; the arithmetic lives here once, with the box syntaxes more than one family writes
(LLaVA-style ``[x1, y1, x2, y2]``, the Qwen-VL JSON ``bbox_2d`` answer). Relative frames are relative to
the ORIGINAL image unless a family says otherwise (``BoxFrame.view_region``: the rectangle of the original
image, in original pixels, that the model's coordinates are relative to).
"""

from __future__ import annotations

import numbers
import re
from typing import Sequence

from vrh_interp.core.description.boxes import Box, BoxParseFailure, InvalidBoxError
from vrh_interp.core.description.families.base import check_image_box

Region = tuple[float, float, float, float]  # (x0, y0, x1, y1) in original-image pixels

NUMBER = r"[-+]?\d+(?:\.\d+)?"
FOUR_NUMBERS = re.compile(rf"({NUMBER})\s*,\s*({NUMBER})\s*,\s*({NUMBER})\s*,\s*({NUMBER})")
BRACKETED_FOUR_NUMBERS = re.compile(rf"\[\s*{FOUR_NUMBERS.pattern}\s*\]")
RELATIVE_DECIMALS = 2


def whole_image(image_size: tuple[int, int]) -> Region:
    """The rectangle of the whole image, ``(0, 0, width, height)``."""
    width, height = image_size
    return (0.0, 0.0, float(width), float(height))


def to_relative(box: Box, image_size: tuple[int, int], scale: float) -> tuple[float, float, float, float]:
    """xyxy in a frame where the image spans [0, scale] on both axes."""
    width, height = image_size
    return (box.x1 / width * scale, box.y1 / height * scale, box.x2 / width * scale, box.y2 / height * scale)


def quantised_relative(box: Box, image_size: tuple[int, int], scale: int | tuple[int, int]) -> list[int]:
    """``box`` (original pixels) as integers in a frame where the image spans [0, scale] on both axes.

    A ``(scale_x, scale_y)`` pair gives each axis its own span (e.g. the resized input's pixels). Values are
    rounded to the nearest integer and clamped to the frame.
    """
    scale_x, scale_y = (scale, scale) if isinstance(scale, numbers.Real) else scale
    x1, y1, x2, y2 = to_relative(box, image_size, 1.0)
    return [min(max(round(v * limit), 0), limit)
            for v, limit in zip((x1, y1, x2, y2), (scale_x, scale_y, scale_x, scale_y))]


def checked_relative(box: Box, image_size: tuple[int, int], scale: int | tuple[int, int]) -> list[int]:
    """``quantised_relative`` of a ground-truth box, checked against its image first (InvalidBoxError)."""
    check_image_box(box, image_size)
    return quantised_relative(box, image_size, scale)


def from_relative(values: Sequence[float], image_size: tuple[int, int], scale: float,
                  text: str) -> Box | BoxParseFailure:
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


def parse_four_numbers(text: str, pattern: re.Pattern[str], image_size: tuple[int, int], scale: float,
                       missing: str, y_first: bool = False, within: str | None = None) -> Box | BoxParseFailure:
    """The first four numbers ``pattern`` matches in ``within`` (default: ``text``; ``y_first``: y1, x1, y2, x2),
    relative to [0, ``scale``], as a Box in original pixels; ``BoxParseFailure(text, missing)`` when none match."""
    values = first_four_numbers(text if within is None else within, pattern)
    if values is None:
        return BoxParseFailure(text, missing)
    if y_first:
        y1, x1, y2, x2 = values
        values = [x1, y1, x2, y2]
    return from_relative(values, image_size, scale, text)


def format_relative_box(box: Box, region: Region) -> str:
    """``[x1, y1, x2, y2]`` relative to ``region``, two decimals, clamped to [0, 1] (parts outside the view)."""
    x0, y0, x1, y1 = region
    shifted = Box(box.x1 - x0, box.y1 - y0, box.x2 - x0, box.y2 - y0)
    values = [min(max(v, 0.0), 1.0) for v in to_relative(shifted, (x1 - x0, y1 - y0), 1.0)]
    return "[" + ", ".join(f"{v:.{RELATIVE_DECIMALS}f}" for v in values) + "]"


def parse_relative_box(text: str, region: Region) -> Box | BoxParseFailure:
    """The first ``[x1, y1, x2, y2]`` with values in [0, 1] relative to ``region``, in original pixels."""
    values = first_four_numbers(text, BRACKETED_FOUR_NUMBERS)
    if values is None:
        return BoxParseFailure(text, "no [x1, y1, x2, y2] box found")
    x0, y0, x1, y1 = region
    parsed = from_relative(values, (x1 - x0, y1 - y0), 1.0, text)
    if isinstance(parsed, BoxParseFailure):
        return parsed
    return Box(parsed.x1 + x0, parsed.y1 + y0, parsed.x2 + x0, parsed.y2 + y0)


def json_bbox_answer(values: list[int]) -> str:
    """The Qwen-VL JSON grounding answer for one box (label omitted; Qwen2.5-VL and Qwen3-VL)."""
    x1, y1, x2, y2 = values
    return f'```json\n[\n\t{{"bbox_2d": [{x1}, {y1}, {x2}, {y2}]}}\n]\n```'


def json_bbox_values(text: str) -> list[float] | None:
    """The first ``[x1, y1, x2, y2]`` after a ``bbox_2d`` key, else the first such list in ``text``."""
    key = text.find("bbox_2d")
    return first_four_numbers(text[key:] if key >= 0 else text, BRACKETED_FOUR_NUMBERS)
