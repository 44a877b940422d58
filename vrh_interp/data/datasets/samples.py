"""The two sample types every loader produces, and ``SampleSet``, the sequence a loader returns.

* ``GroundingSample``: ``sample_id``, ``expression``, ``box`` (a ``Box``, xyxy in ORIGINAL image pixels,
  already checked against the image size), ``image_size`` (width, height) and ``image`` (a property: the image
  is decoded from its ``ImageSource`` on every read and not kept). It satisfies
  ``vrh_interp.data.checks.GroundingSampleLike``, so detection and sweeps take it directly.
* ``VQASample``: a question about one image with a gold answer and the name of the deterministic scorer that
  judges a response (``vrh_interp.data.datasets.vqa``). ``choices`` are the option texts in letter order;
  ``choices_in_question`` says the question text already lists them (CV-Bench, MMStar, MathVista queries), so
  ``vqa_prompt`` does not append them again.
* ``SampleSet``: the samples (a read-only sequence), where they came from, the selection that produced them
  (split, filters, unit) and the rows skipped with ``on_error="skip"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence, TypeVar, overload

from PIL import Image

from vrh_interp.core.description.boxes import Box, InvalidBoxError
from vrh_interp.data.datasets.errors import DatasetError, RowErrors, SkippedRow
from vrh_interp.data.datasets.images import ImageSource
from vrh_interp.data.checks import MAX_EXPRESSION_CHARS, as_box


@dataclass(frozen=True)
class GroundingSample:
    sample_id: str
    expression: str
    box: Box
    image_size: tuple[int, int]
    image_source: ImageSource = field(repr=False)
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = str(self.meta.get("row", self.sample_id))
        if not isinstance(self.expression, str):
            raise DatasetError(where, f"the expression must be a string, got {type(self.expression).__name__}")
        if len(self.expression) > MAX_EXPRESSION_CHARS:
            raise DatasetError(where, f"expression of {len(self.expression)} characters: the limit is "
                                      f"{MAX_EXPRESSION_CHARS} (vrh_interp.data.checks.MAX_EXPRESSION_CHARS)")
        if not isinstance(self.box, Box):
            if self.box is None:
                raise DatasetError(where, "box is None: a grounding sample needs its ground-truth box, a Box or four "
                                          "xyxy numbers in original image pixels")
            try:
                object.__setattr__(self, "box", as_box(self.box))
            except InvalidBoxError as error:
                raise DatasetError(where, f"box {self.box!r}: {error}") from None

    @property
    def image(self) -> Image.Image:
        return self.image_source.open()


# Longest VQA question accepted (characters): benchmark questions with their options and hints stay under a
# few thousand; the limit only stops a pathological file from asking for unbounded attention memory.
MAX_QUESTION_CHARS = 20_000


@dataclass(frozen=True)
class VQASample:
    sample_id: str
    benchmark: str
    question: str
    answer: str
    scorer: str  # a key of vrh_interp.data.datasets.vqa.SCORERS
    image_source: ImageSource = field(repr=False)
    choices: tuple[str, ...] = ()
    choices_in_question: bool = False
    instruction: str = ""  # the answer-format line that ends the user turn
    max_new_tokens: int = 16
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def image(self) -> Image.Image:
        return self.image_source.open()

    def __post_init__(self) -> None:
        if not isinstance(self.question, str) or len(self.question) > MAX_QUESTION_CHARS:
            raise DatasetError(str(self.meta.get("row", self.sample_id)),
                               f"the question must be a string of at most {MAX_QUESTION_CHARS} characters "
                               f"(vrh_interp.data.datasets.samples.MAX_QUESTION_CHARS), got {len(str(self.question))}")

    @property
    def letters(self) -> tuple[str, ...]:
        return tuple(chr(ord("A") + i) for i in range(len(self.choices)))


SampleT = TypeVar("SampleT", GroundingSample, VQASample)


@dataclass(frozen=True)
class SampleSet(Sequence[SampleT]):
    samples: tuple[SampleT, ...]
    source: str
    selection: Mapping[str, Any] = field(default_factory=dict)
    skipped: tuple[SkippedRow, ...] = ()

    def __len__(self) -> int:
        return len(self.samples)

    @overload
    def __getitem__(self, index: int) -> SampleT: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[SampleT]: ...
    def __getitem__(self, index: int | slice) -> SampleT | Sequence[SampleT]:
        return self.samples[index]

    def __iter__(self) -> Iterator[SampleT]:
        return iter(self.samples)


def finish(samples: Sequence[SampleT], errors: RowErrors, *, source: str,
           selection: Mapping[str, Any]) -> SampleSet[SampleT]:
    """The loaded set. A repeated sample id is a row error (at the row in ``meta["row"]``); an empty set
    (empty split, or every row skipped) is an error naming the source."""
    kept: list[SampleT] = []
    ids: set[str] = set()
    for sample in samples:
        if sample.sample_id in ids:
            errors.reject(DatasetError(str(sample.meta.get("row", source)),
                                       f"duplicate sample id {sample.sample_id!r}"))
            continue
        ids.add(sample.sample_id)
        kept.append(sample)
    if not kept:
        detail = f"{len(errors.skipped)} rows skipped, first: {errors.skipped[0].where}: " \
                 f"{errors.skipped[0].reason}" if errors.skipped else ""
        which = f" for {dict(selection)}" if selection else ""
        raise DatasetError(source, f"no samples{which} ({detail or 'it holds no rows'})")
    return SampleSet(tuple(kept), source, dict(selection), tuple(errors.skipped))
