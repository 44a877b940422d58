"""Scene generator: determinism, exact boxes, unique expressions, disjoint splits, VQA answers."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import vrh_interp
from vrh_interp.core.description.boxes import Box
from vrh_interp.data import scenes
from vrh_interp.data.datasets.samples import GroundingSample, VQASample
from vrh_interp.data.datasets.synthetic_vqa import answer_text
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.data.scenes import (
    COLOURS,
    SPLIT_SEED_RANGES,
    ExpressionSpec,
    NounPhrase,
    grounding_samples,
    make_scene,
    resolve,
    scene_seed,
    vqa_samples,
)


def _parse_expression(text: str) -> ExpressionSpec:
    """Independent re-parse of an expression string into a spec (checks text <-> spec round trip)."""
    words = text.split()
    assert words[0] == "the"

    def phrase(tokens: list[str]) -> NounPhrase:
        size = next((t for t in tokens if t in scenes.SIZES), None)
        colour = next((t for t in tokens if t in COLOURS), None)
        return NounPhrase(shape=tokens[-1], colour=colour, size=size)

    if words[1] in scenes.ORDINALS:
        return ExpressionSpec("ordinal", phrase(words[2:-3]), ordinal=words[1], direction=words[-1])
    for relation in scenes.RELATIONS:
        marker = f" {relation} the "
        if marker in text:
            head, anchor = text[len("the ") :].split(marker)
            return ExpressionSpec("relational", phrase(head.split()), relation=relation, anchor=phrase(anchor.split()))
    return ExpressionSpec("attribute", phrase(words[1:]))


@pytest.mark.parametrize("difficulty", [0, 1, 2])
def test_scene_is_deterministic_per_seed(difficulty: int) -> None:
    a = make_scene("train", 17, difficulty)
    b = make_scene("train", 17, difficulty)
    c = make_scene("train", 18, difficulty)
    assert np.array_equal(np.asarray(a.image), np.asarray(b.image))
    assert a.objects == b.objects
    assert [s.expression for s in grounding_samples("train", 17, difficulty)] == [
        s.expression for s in grounding_samples("train", 17, difficulty)
    ]
    assert not np.array_equal(np.asarray(a.image), np.asarray(c.image))


@pytest.mark.parametrize("index", range(40))
def test_boxes_are_exact_tight_boxes_of_drawn_pixels(index: int) -> None:
    scene = make_scene("eval", index, difficulty=index % 3)
    pixels = np.asarray(scene.image)
    for i, obj in enumerate(scene.objects):
        colour = np.array(COLOURS[obj.colour])
        mask = scene.object_index_map == i
        assert (pixels[mask] == colour).all()
        rows, cols = np.nonzero(mask)
        x1, y1, x2, y2 = obj.box
        assert (x1, y1, x2, y2) == (cols.min(), rows.min(), cols.max() + 1, rows.max() + 1)
        # the drawn pixels touch all four (exclusive) box edges and nothing of this object lies outside
        inside = np.zeros_like(mask)
        inside[y1:y2, x1:x2] = True
        assert not (mask & ~inside).any()
        assert mask[y1, x1:x2].any() and mask[y2 - 1, x1:x2].any()
        assert mask[y1:y2, x1].any() and mask[y1:y2, x2 - 1].any()
    # everything else is background
    background = scene.object_index_map == -1
    assert (pixels[background] == np.array(scenes.BACKGROUND_RGB)).all()


@pytest.mark.parametrize("difficulty", [0, 1, 2])
def test_expressions_resolve_to_exactly_their_referent(difficulty: int) -> None:
    kinds_seen = set()
    for index in range(60):
        scene = make_scene("detect", index, difficulty)
        assert len(scene.objects) >= 2  # the query is always necessary
        for sample in grounding_samples("detect", index, difficulty):
            spec = _parse_expression(sample.expression)
            assert spec.text() == sample.expression
            assert resolve(spec, scene.objects) == [sample.meta["target_index"]]
            assert tuple(sample.box) == scene.objects[sample.meta["target_index"]].box
            kinds_seen.add(sample.meta["kind"])
    assert kinds_seen == ({"attribute", "relational", "ordinal"} if difficulty == 2 else {"attribute"})


def test_level0_objects_have_distinct_colour_shape_and_level1_has_distractors() -> None:
    shared = 0
    for index in range(50):
        objs0 = make_scene("train", index, 0).objects
        assert len({(o.colour, o.shape) for o in objs0}) == len(objs0)
        objs1 = make_scene("train", index, 1).objects
        shared += len({o.colour for o in objs1}) < len(objs1) or len({o.shape for o in objs1}) < len(objs1)
    assert shared == 50


def test_splits_are_disjoint_and_bounded() -> None:
    ranges = sorted(SPLIT_SEED_RANGES.values())
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(ranges, ranges[1:]))
    assert scene_seed("eval", 0) != scene_seed("train", 0)
    assert scene_seed("detect", 5) == SPLIT_SEED_RANGES["detect"][0] + 5
    with pytest.raises(IndexError):
        scene_seed("detect", SPLIT_SEED_RANGES["detect"][1] - SPLIT_SEED_RANGES["detect"][0])
    train_images = {np.asarray(make_scene("train", i).image).tobytes() for i in range(30)}
    eval_images = {np.asarray(make_scene("eval", i).image).tobytes() for i in range(30)}
    assert not train_images & eval_images


def test_vqa_answers_match_the_scene() -> None:
    kinds = set()
    for index in range(40):
        scene = make_scene("eval", index, 1)
        for item in vqa_samples("eval", index, 1):
            kinds.add(item.meta["kind"])
            evidence = [tuple(b) for b in item.meta["evidence_boxes"]]
            assert isinstance(item, VQASample) and item.benchmark == f"synthetic-{item.meta['kind']}"
            if item.meta["kind"] == "counting":
                shape = item.question.split()[2][:-1]
                assert item.scorer == "count" and int(item.answer) == sum(o.shape == shape for o in scene.objects)
                assert len(evidence) == int(item.answer)
            elif item.meta["kind"] == "attribute":
                colour = answer_text(item)
                assert item.scorer == "letter" and item.answer in item.letters and len(set(item.choices)) == 4
                (box,) = evidence
                assert COLOURS[colour] == next(COLOURS[o.colour] for o in scene.objects if o.box == box)
            else:
                assert answer_text(item) in ("yes", "no") and len(evidence) == 2
    assert kinds == {"attribute", "counting", "spatial"}


def test_one_data_model_each_sample_class_is_defined_once_in_the_package() -> None:
    package = Path(vrh_interp.__file__).parent
    defined: dict[str, list[str]] = {}
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name in ("GroundingSample", "VQASample"):
                defined.setdefault(node.name, []).append(str(path.relative_to(package)))
    assert defined == {"GroundingSample": ["data/datasets/samples.py"], "VQASample": ["data/datasets/samples.py"]}


def test_scene_samples_are_the_loaders_samples_with_the_scene_in_meta() -> None:
    scene = make_scene("eval", 2, 1)
    samples = grounding_samples("eval", 2, 1)
    assert len(samples) >= 2 and all(isinstance(s, GroundingSample) for s in samples)
    for sample in samples:
        target = sample.meta["target_index"]
        assert sample.box == Box(*scene.objects[target].box) and sample.image_size == scene.image.size
        assert sample.meta["object_boxes"] == [o.box for o in scene.objects]
        assert np.array_equal(np.asarray(sample.image), np.asarray(scene.image))
    # one image object per scene: what interventions.shared_image_prefix groups a scene's referents by
    assert all(s.image is samples[0].image for s in samples)
    assert [s.sample_id for s in samples] == [f"eval-2-L1-o{s.meta['target_index']}" for s in samples]
    loaded = synthetic_samples("eval", 3)  # the loader behind --data synthetic:eval:3
    assert all(isinstance(s, GroundingSample) for s in loaded) and loaded[2] == samples[2 % 4]
