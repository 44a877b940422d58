"""Boxes in ORIGINAL image pixels, IoU, and the typed parse failure.

Every box that crosses the public API is a ``Box`` in xyxy original-image pixels (x right, y down,
``x2``/``y2`` exclusive edges, floats). Model-specific frames (0-1000 relative, 0-1 relative, resized
input pixels, PaliGemma's 1024 y-first bins) live only inside each family's ``format_box``/``parse_box``;
nothing here guesses a frame from value ranges, the bug that makes common harnesses misread Qwen2.5-VL.
A model output that is not a box is not an exception but a ``BoxParseFailure`` value, so evaluation can
count parse failures separately from mislocations (the paper's functional-specificity split).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


class InvalidBoxError(ValueError):
    """A ground-truth or user box that cannot be used (zero area, outside the image, NaN, ...)."""


# The layouts a user's box may be written in (``Box.from_format``): corners, corner + size, centre + size.
BOX_FORMATS: tuple[str, ...] = ("xyxy", "xywh", "cxcywh")
MAX_COORDINATE = 1e9  # pixels; boxes are checked against their image anyway, this only bounds the arithmetic


def _shown(value: object, limit: int = 120) -> str:
    """``repr`` for an error message, shortened (and safe for integers too long to print)."""
    if isinstance(value, int) and abs(value) > MAX_COORDINATE:
        return f"<integer of {value.bit_length()} bits>"
    if isinstance(value, (list, tuple)):
        text = "[" + ", ".join(_shown(v, limit) for v in value[:8]) + (", ...]" if len(value) > 8 else "]")
    else:
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass(frozen=True, slots=True)
class Box:
    """Axis-aligned box ``[x1, x2) x [y1, y2)`` in original image pixels."""

    x1: float
    y1: float
    x2: float
    y2: float

    def __post_init__(self) -> None:
        values = (self.x1, self.y1, self.x2, self.y2)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise InvalidBoxError(f"box coordinates must be numbers, got {_shown(values)}")
        if not all(abs(v) <= MAX_COORDINATE for v in values):  # also NaN; never float() of a huge int
            raise InvalidBoxError(f"box coordinates must be finite numbers of at most {MAX_COORDINATE:.0e} pixels, "
                                  f"got {_shown(values)}")
        if self.x2 <= self.x1 or self.y2 <= self.y1:
            raise InvalidBoxError(
                f"box {values} has zero or negative area: expected xyxy with x2 > x1 and y2 > y1 "
                "(is it xywh? use Box.from_xywh)"
            )

    @classmethod
    def from_xywh(cls, x: float, y: float, w: float, h: float) -> "Box":
        return cls(x, y, x + w, y + h)

    @classmethod
    def from_format(cls, values: object, box_format: object = "xyxy") -> "Box":
        """A box from four numbers in ``box_format`` (one of ``BOX_FORMATS``), all in original pixels.

        Strict on purpose: the values must be a list of exactly four real numbers (``True`` is not 1, ``"12"``
        is not 12) and the format one of the names, never guessed from the values.
        """
        if not isinstance(box_format, str) or box_format not in BOX_FORMATS:
            raise InvalidBoxError(f"unknown box format {box_format!r}: use one of {', '.join(BOX_FORMATS)} "
                                  "(xyxy: corners x1, y1, x2, y2; xywh: top-left corner + width, height; cxcywh: "
                                  "centre + width, height)")
        if not isinstance(values, (list, tuple)) or len(values) != 4:
            raise InvalidBoxError(f"a box is a list of 4 numbers ({box_format}), got {_shown(values)}")
        numbers = []
        for value in values:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidBoxError(f"box coordinates must be numbers, got {_shown(value)} in {_shown(values)}")
            if abs(value) > MAX_COORDINATE:  # float() of a 400-digit int overflows
                raise InvalidBoxError(f"box coordinate {_shown(value)} exceeds {MAX_COORDINATE:.0e} pixels")
            numbers.append(float(value))
        a, b, c, d = numbers
        if box_format == "xywh":
            return cls.from_xywh(a, b, c, d)
        if box_format == "cxcywh":
            return cls(a - c / 2, b - d / 2, a + c / 2, b + d / 2)
        return cls(a, b, c, d)

    @property
    def width(self) -> float:
        return self.x2 - self.x1

    @property
    def height(self) -> float:
        return self.y2 - self.y1

    @property
    def area(self) -> float:
        return self.width * self.height

    @property
    def center(self) -> tuple[float, float]:
        return ((self.x1 + self.x2) / 2, (self.y1 + self.y2) / 2)

    def as_tuple(self) -> tuple[float, float, float, float]:
        return (self.x1, self.y1, self.x2, self.y2)

    def __iter__(self) -> Iterator[float]:
        """``x1, y1, x2, y2 = box`` (and ``tuple(box)``, ``Box(*box)``): a box reads as its xyxy sequence."""
        return iter(self.as_tuple())

    def intersection_area(self, other: "Box") -> float:
        w = min(self.x2, other.x2) - max(self.x1, other.x1)
        h = min(self.y2, other.y2) - max(self.y1, other.y1)
        return max(w, 0.0) * max(h, 0.0)

    def iou(self, other: "Box") -> float:
        inter = self.intersection_area(other)
        return inter / (self.area + other.area - inter)

    def clipped(self, width: float, height: float) -> "Box":
        """The part of the box inside a ``width`` x ``height`` image (raises if nothing is left)."""
        return Box(max(self.x1, 0.0), max(self.y1, 0.0), min(self.x2, float(width)), min(self.y2, float(height)))

    def check_inside(self, width: int, height: int, tolerance: float = 0.5) -> "Box":
        """Raise InvalidBoxError unless the box lies inside a ``width`` x ``height`` image."""
        if (
            self.x1 < -tolerance
            or self.y1 < -tolerance
            or self.x2 > width + tolerance
            or self.y2 > height + tolerance
        ):
            raise InvalidBoxError(
                f"box {self.as_tuple()} lies outside the {width}x{height} image: boxes must be xyxy in the "
                "ORIGINAL image's pixels (a box in another frame, or for another image size, gives wrong tokens)"
            )
        return self


@dataclass(frozen=True, slots=True)
class BoxParseFailure:
    """A model output that could not be read as a box in the family's native format."""

    text: str
    reason: str

    def __bool__(self) -> bool:  # a failure is falsy, so `if parsed:` reads naturally
        return False


def iou(a: Box | BoxParseFailure, b: Box) -> float:
    """IoU of a prediction with the ground truth; a parse failure scores 0."""
    return 0.0 if isinstance(a, BoxParseFailure) else a.iou(b)
