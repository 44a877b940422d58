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

import contextlib
import io
import os
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol, Sequence

from PIL import Image, ImageDraw, UnidentifiedImageError

from vrh_interp.core.description.boxes import Box
from vrh_interp.data.datasets.errors import DatasetError

ImageData = bytes | Path
# Largest image accepted (pixels, from the header, before any decoding): PIL's own decompression-bomb limit
# (~89.5 MP, e.g. 9459 x 9459). A header claiming more is a row error (skippable), never a decode attempt.
MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS or 89_478_485
REGION_COLOURS: tuple[str, ...] = ("red", "blue", "lime", "yellow", "magenta", "cyan")


class ImageSource(Protocol):
    """Where one image lives; ``open()`` decodes it (RGB) on every call, ``size()`` reads only the header."""

    where: str

    def open(self) -> Image.Image: ...

    def size(self, *, full_decode: bool = False) -> tuple[int, int]: ...


def _open(data: ImageData) -> Image.Image:
    with warnings.catch_warnings():  # PIL warns between 1x and 2x its limit; _check_pixels refuses those images
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return Image.open(io.BytesIO(data) if isinstance(data, bytes) else data)


def _check_pixels(image: Image.Image, data: ImageData, where: str) -> None:
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise _too_large(data, where, f"{width} x {height}")


def _too_large(data: ImageData, where: str, claimed: str) -> DatasetError:
    return DatasetError(where, f"image{_named(data)} claims {claimed} pixels, more than the limit of "
                               f"{MAX_IMAGE_PIXELS} (vrh_interp.data.datasets.images.MAX_IMAGE_PIXELS): resize it")


def _named(data: ImageData) -> str:
    return "" if isinstance(data, bytes) else f" {data}"


def _check_file(data: ImageData, where: str) -> None:
    """An image path must be an existing file: a folder, a missing file or a symlink loop named as such."""
    if not isinstance(data, Path):
        return
    try:
        mode = os.stat(data).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise DatasetError(where, f"image file {data} does not exist") from None
    except OSError as error:  # a symlink loop, a name too long (Path.is_file() says False to these)
        raise DatasetError(where, f"image {data}: cannot look it up ({error.strerror})") from None
    if stat.S_ISDIR(mode):
        raise DatasetError(where, f"image {data} is a folder, not an image file")


UNREADABLE = (UnidentifiedImageError, OSError, SyntaxError, ValueError)


def decode_image(data: ImageData, where: str) -> Image.Image:
    """Fully decoded RGB image from bytes or a file; DatasetError if missing, unreadable or truncated."""
    _check_file(data, where)
    with _opened(data, where, "cannot decode image") as handle:
        handle.load()
        return handle.convert("RGB")


def probe_size(data: ImageData, where: str, *, full_decode: bool = False) -> tuple[int, int]:
    """(width, height) from the image header; ``full_decode`` also decodes the pixels (catches truncation)."""
    if full_decode:
        return decode_image(data, where).size
    _check_file(data, where)
    with _opened(data, where, "not a readable image") as handle:
        return handle.size


@contextlib.contextmanager
def _opened(data: ImageData, where: str, failure: str) -> Iterator[Image.Image]:
    """The opened image, its pixel count checked; every failure to open or read it (inside the block too) is a
    ``DatasetError`` starting with ``failure``."""
    try:
        with _open(data) as handle:
            _check_pixels(handle, data, where)
            yield handle
    except DatasetError:
        raise
    except Image.DecompressionBombError:  # PIL's own check, at twice the limit, while opening
        raise _too_large(data, where, "more than twice that") from None
    except UNREADABLE as error:
        raise DatasetError(where, f"{failure}{_named(data)}: {error}") from error


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
class LoadedImage:
    """An image already in memory (a synthetic scene's): ``open()`` returns that same object every time."""

    image: Image.Image = field(repr=False)
    where: str

    def open(self) -> Image.Image:
        return self.image

    def size(self, *, full_decode: bool = False) -> tuple[int, int]:
        return self.image.size


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
