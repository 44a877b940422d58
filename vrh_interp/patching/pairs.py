"""Clean/corrupted pairs for grounding, built exactly from the synthetic scenes.

Four kinds, each isolating a different input change (the synthetic scenes make the edits pixel-exact):

* ``expression_swap``: same image, the referring expression of ANOTHER object in it. The image tokens are
  identical, so any difference in the answer comes from which object the text asks for: the retrieval.
* ``referent_moved``: same expression, the referent shifted to a free spot (every other pixel identical).
  The answer must follow the object: where the heads read the referent's location from.
* ``referent_recoloured``: same expression, the referent's colour swapped with a same-shape distractor's,
  so the expression now names the distractor (two objects' pixels change, the layout stays).
* ``different_image``: same expression on another scene (the corrupted referent may not exist there).

Every pair keeps the clean sample's box (what the answer should be) and, where the corrupted input has
one, the corrupted referent's box (``corrupted.box``; ``None`` in ``corrupted_box`` otherwise).
"""

from __future__ import annotations

import html
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Literal, SupportsIndex, overload

from vrh_interp.data.scenes import (
    ExpressionSpec,
    NounPhrase,
    Scene,
    Split,
    grounding_samples,
    make_scene,
    move_object,
    recolour_object,
    resolve,
    scene_sample,
)
from vrh_interp.core._display import Card, shorten
from vrh_interp.data.datasets.samples import GroundingSample

PairKind = Literal["expression_swap", "referent_moved", "referent_recoloured", "different_image"]
PAIR_KINDS: tuple[PairKind, ...] = ("expression_swap", "referent_moved", "referent_recoloured", "different_image")

Box = tuple[int, int, int, int]
MIN_MOVE_PX = 20


def _box_text(box: Any) -> str:
    return "none" if box is None else "(" + ", ".join(f"{v:g}" for v in box) + ")"


@dataclass(frozen=True, repr=False)
class PatchingPair(Card):
    """A clean and a corrupted grounding input; ``clean.box`` is the answer the clean input asks for. Shown as a
    few lines (the two expressions and boxes), not the images."""

    pair_id: str
    kind: PairKind
    clean: GroundingSample
    corrupted: GroundingSample
    corrupted_box: Box | None
    distractor_boxes: tuple[Box, ...] = field(default=())  # other objects of the clean scene

    def _card(self) -> tuple[str, list[tuple[str, str]]]:
        size = "x".join(str(v) for v in self.clean.image.size)
        return (f"PatchingPair {self.pair_id} ({self.kind})",
                [("clean", f"{shorten(repr(self.clean.expression))} -> box {_box_text(self.clean.box)}, image {size}"),
                 ("corrupted", f"{shorten(repr(self.corrupted.expression))} -> box {_box_text(self.corrupted_box)}"),
                 ("distractors", str(len(self.distractor_boxes)))])


class PatchingPairs(Card, list):
    """The pairs ``make_pairs`` returns: a plain list of ``PatchingPair`` (index, slice, iterate, pass to
    ``prepare_pairs``) that shows itself as a few lines and, in a notebook, a table of the first pairs."""

    @overload
    def __getitem__(self, index: SupportsIndex) -> PatchingPair: ...
    @overload
    def __getitem__(self, index: slice) -> "PatchingPairs": ...
    def __getitem__(self, index: Any) -> Any:
        found = list.__getitem__(self, index)
        return PatchingPairs(found) if isinstance(index, slice) else found

    def _card(self) -> tuple[str, list[tuple[str, str]]]:
        kinds = Counter(getattr(p, "kind", type(p).__name__) for p in self)
        rows = [("kinds", ", ".join(f"{kind} {n}" for kind, n in kinds.items()) or "none")]
        if self:
            first = self[0]
            rows.append(("first", f"{first.pair_id}: {shorten(repr(first.clean.expression), 40)} vs "
                                  f"{shorten(repr(first.corrupted.expression), 40)}"))
        return f"PatchingPairs: {len(self)} clean/corrupted pairs (pairs[i] for one)", rows

    def _card_table(self) -> str:
        names = ("pair", "kind", "clean expression", "clean box", "corrupted expression", "corrupted box")
        rows = [(p.pair_id, p.kind, p.clean.expression, _box_text(p.clean.box), p.corrupted.expression,
                 _box_text(p.corrupted_box)) for p in list(self)[:10] if isinstance(p, PatchingPair)]
        head = "".join(f"<th>{name}</th>" for name in names)
        body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(str(v))}</td>" for v in row)
                       + "</tr>" for row in rows)
        more = f"<p>... {len(self) - 10} more</p>" if len(self) > 10 else ""
        return f"<table><tr>{head}</tr>{body}</table>{more}"


def _attribute_spec(sample: GroundingSample) -> ExpressionSpec:
    q = sample.meta["query_attributes"]
    return ExpressionSpec("attribute", NounPhrase(shape=q["shape"], colour=q["colour"], size=q["size"]))


def _with_scene(sample: GroundingSample, scene: Scene, box: Box, suffix: str) -> GroundingSample:
    meta = dict(sample.meta, object_boxes=[o.box for o in scene.objects],
                object_attributes=[(o.colour, o.shape, o.size) for o in scene.objects])
    return scene_sample(scene, f"{sample.sample_id}-{suffix}", sample.expression, box, meta)


def _distractors(sample: GroundingSample) -> tuple[Box, ...]:
    target = sample.meta["target_index"]
    return tuple(tuple(b) for i, b in enumerate(sample.meta["object_boxes"]) if i != target)


def _first_edited_pair(sample: GroundingSample, kind: PairKind,
                       edits: Iterable[tuple[Scene, int]]) -> PatchingPair | None:
    """``sample`` and its expression on the first edited scene where the expression picks exactly the edit's
    object (id suffix: the kind's last word); ``None`` if no edit qualifies. ``edits`` is consumed lazily."""
    suffix = kind.split("_")[-1]
    for edited, referent in edits:
        if resolve(_attribute_spec(sample), edited.objects) == [referent]:
            box = edited.objects[referent].box
            return PatchingPair(f"{sample.sample_id}-{suffix}", kind, sample, _with_scene(sample, edited, box, suffix),
                                box, _distractors(sample))
    return None


def _moves(scene: Scene, target: int) -> Iterator[tuple[Scene, int]]:
    """Up to 200 seeded random shifts of object ``target`` by >= ``MIN_MOVE_PX`` to a free spot."""
    rng = random.Random(scene.seed * 16 + target)
    for _ in range(200):
        dx, dy = rng.randint(-60, 60), rng.randint(-60, 60)
        if abs(dx) + abs(dy) < MIN_MOVE_PX:
            continue
        try:
            moved = move_object(scene, target, dx, dy)
        except ValueError:
            continue
        yield moved, target


def _colour_swaps(scene: Scene, target: int) -> Iterator[tuple[Scene, int]]:
    """Object ``target``'s colour swapped with each same-shape object's of another colour (that object is then
    the one the original expression names)."""
    referent = scene.objects[target]
    for other, obj in enumerate(scene.objects):
        if other != target and obj.shape == referent.shape and obj.colour != referent.colour:
            yield recolour_object(recolour_object(scene, target, obj.colour), other, referent.colour), other


def expression_swap_pairs(split: Split, index: int, difficulty: int = 1) -> list[PatchingPair]:
    """Pairs (object i's expression, object j's expression) on one scene, j = the next referable object."""
    samples = grounding_samples(split, index, difficulty)
    pairs = []
    for i, clean in enumerate(samples):
        if len(samples) < 2:
            break
        corrupted = samples[(i + 1) % len(samples)]
        pairs.append(PatchingPair(f"{clean.sample_id}-swap", "expression_swap", clean, corrupted,
                                  tuple(corrupted.box), _distractors(clean)))
    return pairs


def referent_moved_pairs(split: Split, index: int, difficulty: int = 1) -> list[PatchingPair]:
    """Attribute samples of the scene with the referent moved >= ``MIN_MOVE_PX`` to a free spot."""
    scene = make_scene(split, index, difficulty)
    candidates = (_first_edited_pair(s, "referent_moved", _moves(scene, s.meta["target_index"]))
                  for s in grounding_samples(split, index, difficulty, kinds=("attribute",)))
    return [pair for pair in candidates if pair is not None]


def referent_recoloured_pairs(split: Split, index: int, difficulty: int = 1) -> list[PatchingPair]:
    """Colour-naming attribute samples whose referent swaps colour with a same-shape distractor."""
    scene = make_scene(split, index, difficulty)
    candidates = (_first_edited_pair(s, "referent_recoloured", _colour_swaps(scene, s.meta["target_index"]))
                  for s in grounding_samples(split, index, difficulty, kinds=("attribute",))
                  if s.meta["query_attributes"]["colour"] is not None)
    return [pair for pair in candidates if pair is not None]


def different_image_pairs(split: Split, index: int, difficulty: int = 1) -> list[PatchingPair]:
    """Each sample's expression on the NEXT scene of the split; ``corrupted_box`` only where it resolves."""
    other = make_scene(split, index + 1, difficulty)
    pairs = []
    for sample in grounding_samples(split, index, difficulty, kinds=("attribute",)):
        found = resolve(_attribute_spec(sample), other.objects)
        box = other.objects[found[0]].box if len(found) == 1 else None
        corrupted = _with_scene(sample, other, box if box is not None else tuple(sample.box), "other-image")
        pairs.append(PatchingPair(f"{sample.sample_id}-other-image", "different_image", sample, corrupted, box,
                                  _distractors(sample)))
    return pairs


_BUILDERS = {
    "expression_swap": expression_swap_pairs,
    "referent_moved": referent_moved_pairs,
    "referent_recoloured": referent_recoloured_pairs,
    "different_image": different_image_pairs,
}


def make_pairs(kind: PairKind, n: int, *, split: Split = "eval", difficulty: int = 1, start: int = 0,
               same_expression_length: bool = False) -> PatchingPairs:
    """The first ``n`` pairs of ``kind`` from scenes ``start, start+1, ...`` of ``split`` (deterministic).

    ``same_expression_length`` keeps only pairs whose two expressions have the same number of words
    (needed to patch at every position of an expression swap; other kinds share the expression). A
    ``PatchingPairs``: a list that shows itself in a few lines.
    """
    if kind not in _BUILDERS:
        raise ValueError(f"unknown pair kind {kind!r}; expected one of {PAIR_KINDS}")
    step = 2 if kind == "different_image" else 1  # never reuse a corrupted scene as a clean one
    pairs: list[PatchingPair] = []
    index = start
    while len(pairs) < n:
        for pair in _BUILDERS[kind](split, index, difficulty):
            if same_expression_length and len(pair.clean.expression.split()) != len(pair.corrupted.expression.split()):
                continue
            pairs.append(pair)
        index += step
        if index - start > 50 * max(n, 1):
            raise RuntimeError(f"could not build {n} {kind} pairs from {index - start} scenes")
    return PatchingPairs(pairs[:n])
