"""What the library needs of a grounding sample, whatever loader produced it.

Any object with ``sample_id``, ``image`` (PIL), ``expression`` and ``box`` (a ``Box`` or an xyxy
sequence in ORIGINAL pixels) is a grounding sample: the synthetic scenes, the benchmark loaders and a
user's own data all qualify. ``check_samples`` refuses empty sets, duplicate ids and bad boxes up front,
before any model time is spent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

from vrh_interp.core.description.boxes import Box, InvalidBoxError

if TYPE_CHECKING:
    from PIL import Image


class GroundingSampleLike(Protocol):
    sample_id: str
    image: Image.Image
    expression: str
    box: Any


# Longest referring expression accepted (characters). RefCOCOg's longest are a few hundred; the prompt of a
# much longer one costs attention memory quadratic in its length (a 300k-character one asks for ~115 GB).
MAX_EXPRESSION_CHARS = 2000
DIFFICULTY_LEVELS: tuple[int, ...] = (0, 1, 2)  # the synthetic scenes' curriculum levels (scenes.make_scene)


class InvalidSampleError(ValueError):
    """Something given as a grounding sample that is not one (a dict, a tuple, an object without ``box``)."""


SAMPLE_HELP = ("a grounding sample is an object with attributes sample_id, image (PIL), expression and box, e.g. "
               "vrh_interp.data.datasets.GroundingSample; for dicts or files write JSON Lines and load them with "
               "load_data('jsonl:PATH') (vrh_interp.data.datasets.jsonl)")


def as_box(box: Any) -> Box:
    """``box`` as a ``Box``: a ``Box`` or four xyxy numbers (``Box.from_format``: ``True`` is not 1)."""
    if isinstance(box, Box):
        return box
    try:
        values = [v.item() if hasattr(v, "item") else v for v in box]  # numpy / torch scalars to Python numbers
    except TypeError:
        raise InvalidBoxError(f"a box is a Box or four xyxy numbers, got {type(box).__name__}") from None
    return Box.from_format(values, "xyxy")


def check_samples(samples: Sequence[GroundingSampleLike], *, minimum: int = 1, what: str = "samples") -> None:
    """Raise ValueError / InvalidBoxError for unusable sample sets, naming the offending sample."""
    if len(samples) < minimum:
        raise ValueError(f"need at least {minimum} {what}, got {len(samples)}")
    seen: set[str] = set()
    for index, sample in enumerate(samples):
        if isinstance(sample, Mapping) or not all(hasattr(type(sample), a) or hasattr(sample, a)
                                                  for a in ("sample_id", "expression", "box")):
            raise InvalidSampleError(f"{what}[{index}] is a {type(sample).__name__}, not a grounding sample: "
                                     f"{SAMPLE_HELP}")
        if not isinstance(sample.expression, str) or len(sample.expression) > MAX_EXPRESSION_CHARS:
            raise InvalidSampleError(f"{what}[{index}] ({sample.sample_id!r}): the expression must be a string of at "
                                     f"most {MAX_EXPRESSION_CHARS} characters "
                                     "(vrh_interp.data.checks.MAX_EXPRESSION_CHARS)"
                                     f", got {type(sample.expression).__name__} of {len(str(sample.expression))}")
        if sample.sample_id in seen:
            raise ValueError(f"duplicate sample id {sample.sample_id!r} in {what}: ids must be unique")
        seen.add(sample.sample_id)
        try:
            as_box(sample.box).check_inside(*sample.image.size)
        except InvalidBoxError as error:
            raise InvalidBoxError(f"sample {sample.sample_id!r}: {error}") from error
