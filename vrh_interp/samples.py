"""What the library needs of a grounding sample, whatever loader produced it.

Any object with ``sample_id``, ``image`` (PIL), ``expression`` and ``box`` (a ``Box`` or an xyxy
sequence in ORIGINAL pixels) is a grounding sample: the synthetic scenes, the benchmark loaders and a
user's own data all qualify. ``check_samples`` refuses empty sets, duplicate ids and bad boxes up front,
before any model time is spent.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from PIL import Image

from vrh_interp.boxes import Box, InvalidBoxError


class GroundingSampleLike(Protocol):
    sample_id: str
    image: Image.Image
    expression: str
    box: Any


def as_box(box: Any) -> Box:
    return box if isinstance(box, Box) else Box(*(float(v) for v in box))


def check_samples(samples: Sequence[GroundingSampleLike], *, minimum: int = 1, what: str = "samples") -> None:
    """Raise ValueError / InvalidBoxError for unusable sample sets, naming the offending sample."""
    if len(samples) < minimum:
        raise ValueError(f"need at least {minimum} {what}, got {len(samples)}")
    seen: set[str] = set()
    for sample in samples:
        if sample.sample_id in seen:
            raise ValueError(f"duplicate sample id {sample.sample_id!r} in {what}: ids must be unique")
        seen.add(sample.sample_id)
        try:
            as_box(sample.box).check_inside(*sample.image.size)
        except InvalidBoxError as error:
            raise InvalidBoxError(f"sample {sample.sample_id!r}: {error}") from error
