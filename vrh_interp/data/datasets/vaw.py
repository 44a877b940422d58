"""VAW (adobe-research/vaw_dataset; Visual Genome images; non-commercial licence) as seeded multiple choice.

On disk: ``data/{val,test}.json`` (``train_part1/2.json``), each a list of instances {image_id (Visual
Genome id), instance_id, instance_bbox [x, y, w, h] pixels, instance_polygon, object_name,
positive_attributes, negative_attributes}, and ``data/attribute_types.json`` mapping each attribute type
("color", "material", "hair color", ...) to its attributes. Images are ``<image_dir>/<image_id>.jpg`` (or
under ``VG_100K/`` / ``VG_100K_2/``).

VAW has no question form, and the paper converts it to multiple choice without saying how. Here, per
instance: among its positive attributes that share a type with at least one of its NEGATIVE attributes
(explicitly labelled as not applying), one is drawn, and up to three negatives of that type are the
distractors; the options are shuffled. The draws use ``random.Random(f"{seed}:{instance_id}")``, so each item
depends only on the seed and the instance. The object is outlined in red and named in the question.
Instances without such a pair are left out (counted in ``selection["without_question"]``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Mapping

from vrh_interp.core.description.boxes import Box
from vrh_interp.data.datasets.cvbench import MCQ_INSTRUCTION
from vrh_interp.data.datasets.errors import DatasetError, OnError, RowErrors
from vrh_interp.data.datasets.images import ImageFile, MarkedRegions
from vrh_interp.data.datasets.samples import SampleSet, VQASample, finish

MAX_DISTRACTORS = 3
VG_FOLDERS: tuple[str, ...] = ("", "VG_100K", "VG_100K_2")


def attribute_type_index(path: Path) -> dict[str, str]:
    """attribute -> its type, from ``attribute_types.json`` ({type: [attributes]})."""
    try:
        types = json.loads(path.read_text(encoding="utf-8"))
        return {attribute: kind for kind, attributes in types.items() for attribute in attributes}
    except (OSError, json.JSONDecodeError, AttributeError, TypeError) as error:
        raise DatasetError(str(path), f"cannot read attribute types ({{type: [attributes]}}): {error}") from error


def vg_image(image_dir: Path, image_id: int) -> Path:
    candidates = [image_dir / folder / f"{image_id}.jpg" for folder in VG_FOLDERS]
    return next((c for c in candidates if c.is_file()), candidates[0])


def mcq_for_instance(instance: Mapping[str, Any], types: Mapping[str, str],
                     seed: int) -> tuple[str, str, tuple[str, ...]] | None:
    """(attribute type, correct attribute, shuffled options) for one instance, or None if it has no pair."""
    negatives_by_type: dict[str, list[str]] = {}
    for attribute in instance["negative_attributes"]:
        if attribute in types:
            negatives_by_type.setdefault(types[attribute], []).append(attribute)
    candidates = sorted(a for a in set(instance["positive_attributes"]) if types.get(a) in negatives_by_type)
    if not candidates:
        return None
    rng = random.Random(f"{seed}:{instance['instance_id']}")
    correct = rng.choice(candidates)
    kind = types[correct]
    pool = sorted(set(negatives_by_type[kind]) - set(instance["positive_attributes"]))
    if not pool:
        return None
    distractors = rng.sample(pool, min(MAX_DISTRACTORS, len(pool)))
    options = [correct, *distractors]
    rng.shuffle(options)
    return kind, correct, tuple(options)


def load_vaw(path: str | Path, *, image_dir: str | Path, attribute_types: str | Path | None = None, seed: int = 0,
             on_error: OnError = "raise", verify_images: bool = False) -> SampleSet[VQASample]:
    path, image_dir = Path(path), Path(image_dir)
    types_path = Path(attribute_types) if attribute_types is not None else path.parent / "attribute_types.json"
    types = attribute_type_index(types_path)
    try:
        instances = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise DatasetError(str(path), f"cannot read VAW instances: {error}") from error
    if not isinstance(instances, list):
        raise DatasetError(str(path), "unknown layout: expected a JSON list of instances")
    errors = RowErrors(on_error)
    samples: list[VQASample] = []
    without_question = 0
    for index, instance in enumerate(instances):
        where = f"{path} item {index}"
        with errors.row(where):
            question = mcq_for_instance(instance, types, seed)
            if question is None:
                without_question += 1
                continue
            kind, correct, options = question
            base = ImageFile(vg_image(image_dir, int(instance["image_id"])), where)
            box = Box.from_xywh(*(float(v) for v in instance["instance_bbox"])).check_inside(
                *base.size(full_decode=verify_images))
            samples.append(VQASample(
                sample_id=f"vaw-{instance['instance_id']}", benchmark="vaw",
                question=f"Which {kind} does the {instance['object_name']} outlined in red have?",
                answer=chr(ord("A") + options.index(correct)), scorer="letter",
                image_source=MarkedRegions(base, (box,), ("",)), choices=options, instruction=MCQ_INSTRUCTION,
                meta={"attribute_type": kind, "attribute": correct, "object": instance["object_name"], "row": where}))
    return finish(samples, errors, source=f"vaw:{path}",
                  selection={"seed": seed, "without_question": without_question})
