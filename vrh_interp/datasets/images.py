"""Images that are decoded only when a sample's ``.image`` is read.

A loader reads each image's header once (``source.size()``: format and size, no pixel decode; with
``full_decode=True`` the pixels too, which catches truncated files) to check the box against the image, and
stores the ``ImageSource``; ``source.open()`` decodes a fresh RGB ``PIL.Image`` every
time it is called and keeps nothing, so holding ten thousand samples costs their metadata, not their pixels.
Decoding failures (corrupt or truncated files) raise ``DatasetError`` naming the file or row.

No EXIF orientation is applied: every benchmark here annotates boxes in the stored pixel frame (COCO, Visual
Genome, Toloka), which is what ``PIL.Image.open`` returns.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

from PIL import Image, ImageDraw, UnidentifiedImageError

from vrh_interp.boxes import Box
from vrh_interp.datasets.errors import DatasetError

ImageData = bytes | Path
REGION_COLOURS: tuple[str, ...] = ("red", "blue", "lime", "yellow", "magenta", "cyan")


class ImageSource(Protocol):
    """Where one image lives; ``open()`` decodes it (RGB) on every call, ``size()`` reads only the header."""

    where: str

    def open(self) -> Image.Image: ...

    def size(self, *, full_decode: bool = False) -> tuple[int, int]: ...


def _open(data: ImageData) -> Image.Image:
    return Image.open(io.BytesIO(data) if isinstance(data, bytes) else data)


def decode_image(data: ImageData, where: str) -> Image.Image:
    """Fully decoded RGB image from bytes or a file; DatasetError if missing, unreadable or truncated."""
    if isinstance(data, Path) and not data.is_file():
        raise DatasetError(where, f"image file {data} does not exist")
    try:
        with _open(data) as handle:
            handle.load()
            return handle.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise DatasetError(where, f"cannot decode image{'' if isinstance(data, bytes) else ' ' + str(data)}: "
                                  f"{error}") from error


def probe_size(data: ImageData, where: str, *, full_decode: bool = False) -> tuple[int, int]:
    """(width, height) from the image header; ``full_decode`` also decodes the pixels (catches truncation)."""
    if full_decode:
        return decode_image(data, where).size
    if isinstance(data, Path) and not data.is_file():
        raise DatasetError(where, f"image file {data} does not exist")
    try:
        with _open(data) as handle:
            return handle.size
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise DatasetError(where, f"not a readable image{'' if isinstance(data, bytes) else ' ' + str(data)}: "
                                  f"{error}") from error


@dataclass(frozen=True)
class ImageFile:
    """An image file on disk."""

    path: Path
    where: str

    def open(self) -> Image.Image:
        return decode_image(self.path, self.where)

    def size(self, *, full_decode: bool = False) -> tuple[int, int]:
        return probe_size(self.path, self.where, full_decode=full_decode)


@dataclass(frozen=True)
class MarkedRegions:
    """``base`` with each box outlined and labelled (the way region questions name "Region [0]" etc.)."""

    base: ImageSource
    boxes: tuple[Box, ...]
    labels: tuple[str, ...]

    @property
    def where(self) -> str:
        return self.base.where

    def open(self) -> Image.Image:
        return draw_regions(self.base.open(), self.boxes, self.labels)

    def size(self, *, full_decode: bool = False) -> tuple[int, int]:
        return self.base.size(full_decode=full_decode)


def draw_regions(image: Image.Image, boxes: Sequence[Box], labels: Sequence[str]) -> Image.Image:
    """A copy of ``image`` with each box outlined (3 px, cycling colours) and its label written above it."""
    if len(boxes) != len(labels):
        raise ValueError(f"{len(boxes)} boxes but {len(labels)} labels")
    marked = image.copy()
    draw = ImageDraw.Draw(marked)
    width = max(2, round(min(image.size) / 200))
    for index, (box, label) in enumerate(zip(boxes, labels)):
        colour = REGION_COLOURS[index % len(REGION_COLOURS)]
        draw.rectangle([box.x1, box.y1, box.x2 - 1, box.y2 - 1], outline=colour, width=width)
        if label:
            draw.text((box.x1 + width, max(0.0, box.y1 - 12)), label, fill=colour)
    return marked
