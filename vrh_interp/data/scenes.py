"""Seeded synthetic scenes with exact boxes, unique referring expressions and VQA items.

Methodological choices
----------------------
* Every scene is a pure function of ``(split, index, difficulty)``: the RNG seed is
  ``SPLIT_SEED_RANGES[split][0] + index``. Seed ranges of the splits are disjoint, so a train
  scene can never reappear in the detection (head-scoring) or evaluation split:

  ============  ===============================  =============================================
  split         seed range (start inclusive,     use
                end exclusive)
  ============  ===============================  =============================================
  ``train``     ``[0, 1_000_000_000)``           model training
  ``detect``    ``[1_000_000_000, 1_100_000_000)`` scoring heads (VRH detection)
  ``eval``      ``[1_100_000_000, 1_200_000_000)`` held-out accuracy, masking experiments
  ============  ===============================  =============================================

* Boxes are ``(x1, y1, x2, y2)`` integer pixels of the ORIGINAL image, with an EXCLUSIVE right and
  bottom edge (``x2 = last column + 1``). They are the tight box of the pixels actually drawn for the
  object (computed from the per-object mask after drawing, not from the shape parameters), so they
  are exact by construction. Objects never overlap and keep a margin, so every object is fully
  visible and the per-pixel object index map is unambiguous.
* Shapes are drawn without anti-aliasing in one flat colour from a fixed palette on a flat
  background: the pixel test ``image[mask] == colour`` holds exactly.
* A referring expression is generated from a structured spec (``ExpressionSpec``) and then
  RESOLVED against the scene by an independent function (``resolve``); an expression is only
  emitted when it resolves to exactly one object. Relational and ordinal expressions are only
  emitted when their head noun phrase alone is ambiguous, so the relation/ordinal is needed.
* Difficulty levels form a curriculum in which the query is always necessary (never a single-object
  scene): level 0 = 2-3 objects with distinct (colour, shape) and attribute queries; level 1 = 3-5
  objects with distractors sharing the colour or the shape of the referent; level 2 = level 1 plus
  relational ("the square left of the blue circle") and ordinal ("the second triangle from the
  left") expressions.

* Samples are the library's one data model (``vrh_interp.data.datasets.samples``): ``GroundingSample`` (the box
  a ``Box``, the scene's image held in memory) and ``VQASample``; what only a scene knows (its seed, level,
  every object's box and attributes, the referent's index, the attributes the query names) is in ``meta``.

This module is free of torch on purpose: it only needs Pillow and numpy.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Literal

import numpy as np
from PIL import Image, ImageDraw

from vrh_interp.core.description.boxes import Box
from vrh_interp.data.checks import DIFFICULTY_LEVELS
from vrh_interp.data.datasets.images import LoadedImage
from vrh_interp.data.datasets.samples import GroundingSample, VQASample

IMAGE_SIZE = 96
BACKGROUND_RGB = (48, 48, 48)
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 190, 60),
    "blue": (50, 100, 240),
    "yellow": (235, 215, 40),
    "purple": (160, 60, 210),
    "white": (235, 235, 235),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond")
SIZES: dict[str, tuple[int, int]] = {"small": (12, 16), "big": (22, 28)}
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
ORDINALS: tuple[str, ...] = ("first", "second", "third")
ORDER_DIRECTIONS: tuple[str, ...] = ("left", "right", "top", "bottom")
EXPRESSION_KINDS: tuple[str, ...] = ("attribute", "relational", "ordinal")
OBJECT_MARGIN_PX = 3
MIN_ORDER_GAP_PX = 4

Split = Literal["train", "detect", "eval"]
SPLIT_SEED_RANGES: dict[str, tuple[int, int]] = {
    "train": (0, 1_000_000_000),
    "detect": (1_000_000_000, 1_100_000_000),
    "eval": (1_100_000_000, 1_200_000_000),
}

PixelBox = tuple[int, int, int, int]  # xyxy integer pixels, exclusive right/bottom edge


@dataclasses.dataclass(frozen=True)
class SceneObject:
    """One drawn object; ``box`` is xyxy in pixels with exclusive right/bottom edge."""

    colour: str
    shape: str
    size: str
    box: PixelBox

    @property
    def centre(self) -> tuple[float, float]:
        x1, y1, x2, y2 = self.box
        return ((x1 + x2) / 2.0, (y1 + y2) / 2.0)


@dataclasses.dataclass(frozen=True)
class Scene:
    """A rendered scene: the image, its objects and the per-pixel object index (-1 = background)."""

    seed: int
    image: Image.Image
    objects: tuple[SceneObject, ...]
    object_index_map: np.ndarray


@dataclasses.dataclass(frozen=True)
class NounPhrase:
    """Attributes that a noun phrase constrains; ``None`` leaves the attribute free."""

    shape: str
    colour: str | None = None
    size: str | None = None

    def text(self) -> str:
        words = [w for w in (self.size, self.colour, self.shape) if w is not None]
        return " ".join(words)

    def matches(self, obj: SceneObject) -> bool:
        return (
            obj.shape == self.shape
            and (self.colour is None or obj.colour == self.colour)
            and (self.size is None or obj.size == self.size)
        )


@dataclasses.dataclass(frozen=True)
class ExpressionSpec:
    """Structured referring expression. ``kind`` selects which optional fields are used."""

    kind: str
    target: NounPhrase
    relation: str | None = None
    anchor: NounPhrase | None = None
    ordinal: str | None = None
    direction: str | None = None

    def text(self) -> str:
        if self.kind == "attribute":
            return f"the {self.target.text()}"
        if self.kind == "relational":
            assert self.anchor is not None and self.relation is not None
            return f"the {self.target.text()} {self.relation} the {self.anchor.text()}"
        if self.kind == "ordinal":
            return f"the {self.ordinal} {self.target.text()} from the {self.direction}"
        raise ValueError(f"unknown expression kind {self.kind!r}")


def scene_seed(split: Split, index: int) -> int:
    """Seed of scene ``index`` of ``split``; raises if the index leaves the split's seed range."""
    start, end = SPLIT_SEED_RANGES[split]
    if not 0 <= index < end - start:
        raise IndexError(f"index {index} outside split {split!r} (size {end - start})")
    return start + index


def _shape_mask(shape: str, side: int) -> Image.Image:
    mask = Image.new("L", (side, side), 0)
    draw = ImageDraw.Draw(mask)
    last = side - 1
    if shape == "circle":
        draw.ellipse((0, 0, last, last), fill=255)
    elif shape == "square":
        draw.rectangle((0, 0, last, last), fill=255)
    elif shape == "triangle":
        draw.polygon([(0, last), (last, last), (last / 2.0, 0)], fill=255)
    elif shape == "diamond":
        draw.polygon([(last / 2.0, 0), (last, last / 2.0), (last / 2.0, last), (0, last / 2.0)], fill=255)
    else:
        raise ValueError(f"unknown shape {shape!r}")
    return mask


def _attributes_for_level(rng: random.Random, difficulty: int) -> list[tuple[str, str, str]]:
    """(colour, shape, size) triples. Level 0: distinct (colour, shape); else shared-attribute distractors."""
    colours, shapes = list(COLOURS), list(SHAPES)
    if difficulty == 0:
        n = rng.randint(2, 3)
        combos = rng.sample([(c, s) for c in colours for s in shapes], n)
        return [(c, s, rng.choice(list(SIZES))) for c, s in combos]
    n = rng.randint(3, 5)
    first = (rng.choice(colours), rng.choice(shapes))
    attrs = [first]
    # at least one distractor that shares the colour or the shape of an existing object
    while len(attrs) < n:
        base = rng.choice(attrs)
        mode = rng.random()
        if mode < 0.35:
            attrs.append((base[0], rng.choice(shapes)))
        elif mode < 0.7:
            attrs.append((rng.choice(colours), base[1]))
        else:
            attrs.append((rng.choice(colours), rng.choice(shapes)))
    return [(c, s, rng.choice(list(SIZES))) for c, s in attrs]


def _place(rng: random.Random, sides: Sequence[int], image_size: int) -> list[tuple[int, int]] | None:
    placed: list[tuple[int, int, int]] = []
    for side in sides:
        for _ in range(200):
            x = rng.randint(1, image_size - side - 1)
            y = rng.randint(1, image_size - side - 1)
            m = OBJECT_MARGIN_PX
            if all(
                x + side + m <= px or px + ps + m <= x or y + side + m <= py or py + ps + m <= y
                for px, py, ps in placed
            ):
                placed.append((x, y, side))
                break
        else:
            return None
    return [(x, y) for x, y, _ in placed]


def make_scene(split: Split, index: int, difficulty: int = 1, image_size: int = IMAGE_SIZE) -> Scene:
    """Render scene ``index`` of ``split`` at curriculum level ``difficulty`` (0, 1 or 2)."""
    if isinstance(difficulty, bool) or difficulty not in DIFFICULTY_LEVELS:
        raise ValueError(f"difficulty level {difficulty!r} does not exist: use one of {DIFFICULTY_LEVELS}")
    seed = scene_seed(split, index)
    rng = random.Random(seed * 8 + difficulty)
    while True:
        attrs = _attributes_for_level(rng, difficulty)
        sides = [rng.randint(*SIZES[size]) for _, _, size in attrs]
        positions = _place(rng, sides, image_size)
        if positions is not None:
            break
    image = Image.new("RGB", (image_size, image_size), BACKGROUND_RGB)
    index_map = np.full((image_size, image_size), -1, dtype=np.int64)
    objects: list[SceneObject] = []
    for i, ((colour, shape, size), side, (x, y)) in enumerate(zip(attrs, sides, positions, strict=True)):
        mask = _shape_mask(shape, side)
        image.paste(COLOURS[colour], (x, y), mask)
        local = np.asarray(mask) > 0
        index_map[y : y + side, x : x + side][local] = i
        rows, cols = np.nonzero(index_map == i)
        box = (int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1)
        objects.append(SceneObject(colour=colour, shape=shape, size=size, box=box))
    return Scene(seed=seed, image=image, objects=tuple(objects), object_index_map=index_map)


def _relation_holds(relation: str, obj: SceneObject, anchor: SceneObject) -> bool:
    """Centre-based relations with a gap, so borderline layouts never count."""
    (ox, oy), (ax, ay) = obj.centre, anchor.centre
    gap = MIN_ORDER_GAP_PX
    return {
        "left of": ox + gap <= ax,
        "right of": ox >= ax + gap,
        "above": oy + gap <= ay,
        "below": oy >= ay + gap,
    }[relation]


def _order_key(direction: str, obj: SceneObject) -> float:
    cx, cy = obj.centre
    return {"left": cx, "right": -cx, "top": cy, "bottom": -cy}[direction]


def resolve(spec: ExpressionSpec, objects: Sequence[SceneObject]) -> list[int]:
    """Indices of the objects that ``spec`` denotes (an unambiguous expression gives exactly one)."""
    candidates = [i for i, o in enumerate(objects) if spec.target.matches(o)]
    if spec.kind == "attribute":
        return candidates
    if spec.kind == "relational":
        assert spec.anchor is not None and spec.relation is not None
        anchors = [i for i, o in enumerate(objects) if spec.anchor.matches(o)]
        if len(anchors) != 1:
            return []
        anchor = objects[anchors[0]]
        return [i for i in candidates if i != anchors[0] and _relation_holds(spec.relation, objects[i], anchor)]
    if spec.kind == "ordinal":
        assert spec.direction is not None and spec.ordinal is not None
        keys = sorted((_order_key(spec.direction, objects[i]), i) for i in candidates)
        if any(b[0] - a[0] < MIN_ORDER_GAP_PX for a, b in zip(keys, keys[1:])):
            return []  # order not well defined
        rank = ORDINALS.index(spec.ordinal)
        return [keys[rank][1]] if rank < len(keys) else []
    raise ValueError(f"unknown expression kind {spec.kind!r}")


def _noun_phrases(obj: SceneObject) -> list[NounPhrase]:
    return [
        NounPhrase(obj.shape),
        NounPhrase(obj.shape, colour=obj.colour),
        NounPhrase(obj.shape, size=obj.size),
        NounPhrase(obj.shape, colour=obj.colour, size=obj.size),
    ]


def _candidate_specs(objects: Sequence[SceneObject], target: int, kinds: Sequence[str]) -> list[ExpressionSpec]:
    obj = objects[target]
    specs: list[ExpressionSpec] = []
    ambiguous_phrases = []
    for phrase in _noun_phrases(obj):
        n_match = sum(phrase.matches(o) for o in objects)
        if n_match == 1:
            if "attribute" in kinds:
                specs.append(ExpressionSpec("attribute", phrase))
        else:
            ambiguous_phrases.append(phrase)
    for phrase in ambiguous_phrases:
        if "relational" in kinds:
            for j, anchor_obj in enumerate(objects):
                if j == target:
                    continue
                for anchor in _noun_phrases(anchor_obj)[:2]:
                    for relation in RELATIONS:
                        spec = ExpressionSpec("relational", phrase, relation=relation, anchor=anchor)
                        if resolve(spec, objects) == [target]:
                            specs.append(spec)
        if "ordinal" in kinds:
            for direction in ORDER_DIRECTIONS:
                for ordinal in ORDINALS:
                    spec = ExpressionSpec("ordinal", phrase, ordinal=ordinal, direction=direction)
                    if resolve(spec, objects) == [target]:
                        specs.append(spec)
    return specs


def scene_sample(scene: Scene, sample_id: str, expression: str, box: PixelBox, meta: dict) -> GroundingSample:
    """A ``GroundingSample`` on ``scene``'s image. The image is held, not regenerated: every referent of a scene
    shows the same image object, which is how ``interventions.shared_image_prefix`` finds rows to share."""
    return GroundingSample(sample_id=sample_id, expression=expression, box=Box(*box), image_size=scene.image.size,
                           image_source=LoadedImage(scene.image, f"synthetic scene seed {scene.seed}"), meta=meta)


def kinds_for_level(difficulty: int) -> tuple[str, ...]:
    return EXPRESSION_KINDS if difficulty >= 2 else ("attribute",)


def grounding_samples(
    split: Split, index: int, difficulty: int = 1, kinds: Sequence[str] | None = None
) -> list[GroundingSample]:
    """One sample per object of scene ``index`` that some expression of ``kinds`` picks uniquely.

    Several samples on the same image with different referents are what the swap test needs.
    The expression per object is drawn with a per-scene RNG; kinds are sampled uniformly among
    the kinds available for that object, so relational/ordinal items are not swamped by attributes.
    """
    scene = make_scene(split, index, difficulty)
    kinds = tuple(kinds) if kinds is not None else kinds_for_level(difficulty)
    rng = random.Random(scene.seed * 8 + difficulty + 4)
    samples = []
    for target in range(len(scene.objects)):
        specs = _candidate_specs(scene.objects, target, kinds)
        if not specs:
            continue
        by_kind: dict[str, list[ExpressionSpec]] = {}
        for spec in specs:
            by_kind.setdefault(spec.kind, []).append(spec)
        spec = rng.choice(by_kind[rng.choice(sorted(by_kind))])
        if resolve(spec, scene.objects) != [target]:
            raise AssertionError(f"expression {spec.text()!r} is not unique")
        samples.append(
            scene_sample(
                scene,
                sample_id=f"{split}-{index}-L{difficulty}-o{target}",
                expression=spec.text(),
                box=scene.objects[target].box,
                meta={
                    "split": split,
                    "index": index,
                    "seed": scene.seed,
                    "difficulty": difficulty,
                    "kind": spec.kind,
                    "target_index": target,
                    "query_attributes": {"colour": spec.target.colour, "shape": spec.target.shape,
                                         "size": spec.target.size},
                    "image_size": scene.image.size,
                    "object_boxes": [o.box for o in scene.objects],
                    "object_attributes": [(o.colour, o.shape, o.size) for o in scene.objects],
                },
            )
        )
    return samples


# the VQA items' answer-format lines and generation budget (one word or one number)
WORD_INSTRUCTION = "answer with a word ."
NUMBER_INSTRUCTION = "answer with a number ."
VQA_MAX_NEW_TOKENS = 4


@dataclasses.dataclass(frozen=True)
class SceneImage:
    """The image of synthetic scene ``index`` of ``split`` at ``difficulty`` (regenerated on every open, so a
    set of thousands of VQA items holds no pixels)."""

    split: Split
    index: int
    difficulty: int

    @property
    def where(self) -> str:
        return f"synthetic:{self.split}:{self.index}:L{self.difficulty}"

    def open(self) -> Image.Image:
        return make_scene(self.split, self.index, self.difficulty).image

    def size(self, *, full_decode: bool = False) -> tuple[int, int]:
        return self.open().size


def _vqa_item(sample_id: str, image: SceneImage, question: str, choices: tuple[str, ...], answer: str,
              evidence: Sequence[PixelBox], meta: dict) -> VQASample:
    """One scene question as a benchmark item (``synthetic-<kind>``). The options are written into the question
    (the word-level toy tokenizer has no option letters) and answered with the option's word, which
    ``score_letter`` maps to its letter; spatial yes/no options stay implicit; counts are open (``score_count``)."""
    kind = meta["kind"]
    common = dict(sample_id=sample_id, benchmark=f"synthetic-{kind}", image_source=image,
                  max_new_tokens=VQA_MAX_NEW_TOKENS, meta={**meta, "evidence_boxes": [list(b) for b in evidence]})
    if not choices:
        return VQASample(question=question, answer=answer, scorer="count", instruction=NUMBER_INSTRUCTION, **common)
    letters = tuple(chr(ord("A") + i) for i in range(len(choices)))
    return VQASample(question=question if kind == "spatial" else f"{question} {' / '.join(choices)}",
                     answer=letters[choices.index(answer)], scorer="letter", choices=choices,
                     choices_in_question=True, instruction=WORD_INSTRUCTION, **common)


def vqa_samples(split: Split, index: int, difficulty: int = 1) -> list[VQASample]:
    """Attribute MCQ, counting and spatial yes/no questions on scene ``index`` (same scenes as grounding).

    ``meta["evidence_boxes"]``: the boxes of the objects the question refers to (the region a visual retrieval
    head should attend to; for counting questions, all counted objects). One-object questions (attribute,
    counting) carry ``meta["query_attributes"]``: the colour / shape / size their noun phrase names (None = not
    named), as grounding samples do.
    """
    scene = make_scene(split, index, difficulty)
    objs = scene.objects
    image = SceneImage(split, index, difficulty)
    rng = random.Random(scene.seed * 8 + difficulty + 5)
    out: list[VQASample] = []
    meta = {"split": split, "index": index, "seed": scene.seed, "difficulty": difficulty}

    # attribute MCQ about an object named by a unique shape(+size) phrase
    for i, obj in enumerate(objs):
        phrase = next(
            (p for p in _noun_phrases(obj) if p.colour is None and sum(p.matches(o) for o in objs) == 1), None
        )
        if phrase is None:
            continue
        wrong = rng.sample([c for c in COLOURS if c != obj.colour], 3)
        choices = tuple(rng.sample([obj.colour, *wrong], 4))
        out.append(_vqa_item(f"{split}-{index}-L{difficulty}-colour{i}", image, f"what colour is the {phrase.text()} ?",
                             choices, obj.colour, (obj.box,),
                             {**meta, "kind": "attribute",
                              "query_attributes": {"colour": None, "shape": phrase.shape, "size": phrase.size}}))
        break

    # counting
    shape = rng.choice(sorted({o.shape for o in objs}))
    counted = tuple(o.box for o in objs if o.shape == shape)
    out.append(_vqa_item(f"{split}-{index}-L{difficulty}-count-{shape}", image, f"how many {shape}s are there ?",
                         (), str(len(counted)), counted,
                         {**meta, "kind": "counting",
                          "query_attributes": {"colour": None, "shape": shape, "size": None}}))

    # spatial yes/no between two uniquely named objects
    unique = []
    for i, obj in enumerate(objs):
        phrase = next((p for p in _noun_phrases(obj) if sum(p.matches(o) for o in objs) == 1), None)
        if phrase is not None:
            unique.append((i, phrase))
    if len(unique) >= 2:
        (i, p_i), (j, p_j) = rng.sample(unique, 2)
        relation = rng.choice(RELATIONS)
        holds = _relation_holds(relation, objs[i], objs[j])
        opposite = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}[relation]
        if holds or _relation_holds(opposite, objs[i], objs[j]):
            out.append(_vqa_item(f"{split}-{index}-L{difficulty}-spatial{i}-{j}", image,
                                 f"is the {p_i.text()} {relation} the {p_j.text()} ?", ("yes", "no"),
                                 "yes" if holds else "no", (objs[i].box, objs[j].box), {**meta, "kind": "spatial"}))
    return out


def recolour_object(scene: Scene, index: int, colour: str) -> Scene:
    """The same scene with object ``index`` redrawn in ``colour`` (same pixels, same box)."""
    if colour not in COLOURS:
        raise ValueError(f"unknown colour {colour!r}; expected one of {sorted(COLOURS)}")
    pixels = np.array(scene.image)
    pixels[scene.object_index_map == index] = COLOURS[colour]
    objects = list(scene.objects)
    objects[index] = dataclasses.replace(objects[index], colour=colour)
    return Scene(seed=scene.seed, image=Image.fromarray(pixels), objects=tuple(objects),
                 object_index_map=scene.object_index_map.copy())


def move_object(scene: Scene, index: int, dx: int, dy: int) -> Scene:
    """The same scene with object ``index`` shifted by (dx, dy) pixels, every other pixel unchanged.

    Raises ``ValueError`` when the moved object would leave the image or come closer than
    ``OBJECT_MARGIN_PX`` to another object (the scene invariants: no overlap, fully visible objects).
    """
    height, width = scene.object_index_map.shape
    x1, y1, x2, y2 = scene.objects[index].box
    nx1, ny1, nx2, ny2 = x1 + dx, y1 + dy, x2 + dx, y2 + dy
    if nx1 < 1 or ny1 < 1 or nx2 > width - 1 or ny2 > height - 1:
        raise ValueError(f"moving object {index} by ({dx}, {dy}) leaves the image")
    m = OBJECT_MARGIN_PX
    for other, obj in enumerate(scene.objects):
        ox1, oy1, ox2, oy2 = obj.box
        if other != index and not (nx2 + m <= ox1 or ox2 + m <= nx1 or ny2 + m <= oy1 or oy2 + m <= ny1):
            raise ValueError(f"moving object {index} by ({dx}, {dy}) collides with object {other}")
    mask = scene.object_index_map == index
    pixels = np.array(scene.image)
    pixels[mask] = BACKGROUND_RGB
    pixels[np.roll(mask, (dy, dx), axis=(0, 1))] = COLOURS[scene.objects[index].colour]
    index_map = scene.object_index_map.copy()
    index_map[mask] = -1
    index_map[np.roll(mask, (dy, dx), axis=(0, 1))] = index
    objects = list(scene.objects)
    objects[index] = dataclasses.replace(objects[index], box=(nx1, ny1, nx2, ny2))
    return Scene(seed=scene.seed, image=Image.fromarray(pixels), objects=tuple(objects), object_index_map=index_map)
