"""The grounding task as the toy trainer, the planted positive control and the regime measurement all see it:
chat prompts, supervised encoding (only the answer is supervised), greedy box predictions through the user path
(processor -> ``model.generate`` -> native-format parser) and the grounding metrics with their query-ignoring
baselines. Below ``train``, ``planted`` and ``regime``, so the three import it and not each other."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from toy_training.configs import grounding_messages, parse_box
from toy_training.tokenizer import IM_END
from vrh_interp.core.description.boxes import Box, iou
from vrh_interp.data.datasets.samples import GroundingSample
from vrh_interp.data.scenes import grounding_samples
from vrh_interp.evaluation.statistics import bootstrap_statistic_ci
from vrh_interp.toy.configs import ModelName, family

IGNORE_INDEX = -100  # the label of unsupervised tokens (torch's cross-entropy default)


def grounding_prompts(processor, name: ModelName, samples: Sequence[GroundingSample]) -> list[str]:
    return [
        processor.apply_chat_template(grounding_messages(name, s.expression), add_generation_prompt=True,
                                      tokenize=False)
        for s in samples
    ]


def encode_supervised(processor, images: Sequence[Image.Image], prompts: Sequence[str],
                      answers: Sequence[str]) -> dict[str, torch.Tensor]:
    """Prompt + answer + end-of-turn per row; ``labels`` supervise only the answer and end-of-turn tokens."""
    answers = [a + IM_END for a in answers]
    encoded = dict(processor(images=list(images) or None, text=[p + a for p, a in zip(prompts, answers)],
                             return_tensors="pt", padding=True))
    answer_lengths = [len(processor.tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers]
    labels = torch.full_like(encoded["input_ids"], IGNORE_INDEX)
    for row, n in enumerate(answer_lengths):  # left padding: answers are the last n tokens
        labels[row, -n:] = encoded["input_ids"][row, -n:]
    encoded["labels"] = labels
    return encoded


def max_new_tokens(name: ModelName) -> int:
    return 12 if family(name) == "a" else 32


@torch.no_grad()
def predict_boxes(model, processor, name: ModelName, samples: Sequence[GroundingSample],
                  batch_size: int = 64) -> list[tuple[str, Box | None]]:
    """Greedy ``generate`` through the processor, parsed to original-pixel boxes (None if malformed)."""
    model.eval()
    out: list[tuple[str, Box | None]] = []
    for start in range(0, len(samples), batch_size):
        chunk = samples[start : start + batch_size]
        inputs = dict(processor(images=[s.image for s in chunk], text=grounding_prompts(processor, name, chunk),
                                return_tensors="pt", padding=True))
        generated = model.generate(**inputs, max_new_tokens=max_new_tokens(name), do_sample=False)
        texts = processor.batch_decode(generated[:, inputs["input_ids"].shape[1] :], skip_special_tokens=False)
        for sample, text in zip(chunk, texts):
            parsed = parse_box(name, text, sample.image.size)
            box = Box(*parsed) if parsed is not None and parsed[2] > parsed[0] and parsed[3] > parsed[1] else None
            out.append((text, box))
    return out


def held_out_samples(n_scenes: int, difficulty: int, offset: int = 0) -> list[GroundingSample]:
    return [s for i in range(offset, offset + n_scenes) for s in grounding_samples("eval", i, difficulty)]


def _centre_distance(a: Box, b: Box) -> float:
    (ax, ay), (bx, by) = a.center, b.center
    return math.hypot(ax - bx, ay - by)


def nearest_object(sample: GroundingSample, box: Box) -> int:
    """Index of the scene object whose box centre is closest to ``box``'s centre."""
    boxes = sample.meta["object_boxes"]
    return min(range(len(boxes)), key=lambda k: _centre_distance(box, Box(*boxes[k])))


def colour_decides(sample: GroundingSample) -> bool:
    """Whether the expression's colour is what tells the referent apart from some other object: it names a colour,
    and another object has every other attribute it names (the shape, and the size if named) in another colour.
    The toys' level-1 errors lie almost all on these items (docs/toy-models.md)."""
    named = sample.meta["query_attributes"]
    if named["colour"] is None:
        return False
    return any(colour != named["colour"] and shape == named["shape"] and named["size"] in (None, size)
               for index, (colour, shape, size) in enumerate(sample.meta["object_attributes"])
               if index != sample.meta["target_index"])


def grounding_metrics(samples: Sequence[GroundingSample], predictions: Sequence[Box | None]) -> dict[str, float]:
    """Accuracy (IoU >= 0.5) with a 95 % bootstrap interval over scenes, query-ignoring baselines and the
    swap test for one set of samples."""
    hits = [p is not None and iou(p, Box(*s.box)) >= 0.5 for s, p in zip(samples, predictions)]
    nearest_is_target = [p is not None and nearest_object(s, p) == s.meta["target_index"]
                         for s, p in zip(samples, predictions)]
    object_hits = [
        p is not None and any(iou(p, Box(*b)) >= 0.5 for b in s.meta["object_boxes"])
        for s, p in zip(samples, predictions)
    ]
    by_image: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        by_image.setdefault(f"{s.meta['split']}-{s.meta['index']}-{s.meta['difficulty']}", []).append(i)
    # best query-ignoring model: one box per image, at best right for one referent per image
    ceiling = sum(1 for idx in by_image.values()) / len(samples)
    random_object = float(np.mean([1.0 / len(s.meta["object_boxes"]) for s in samples]))
    largest = [
        max(s.meta["object_boxes"], key=lambda b: (b[2] - b[0]) * (b[3] - b[1])) == tuple(s.box) for s in samples
    ]
    pairs = [(i, j) for idx in by_image.values() for a, i in enumerate(idx) for j in idx[a + 1 :]]
    both_right = [hits[i] and hits[j] for i, j in pairs]
    same_box = [
        predictions[i] is not None and predictions[j] is not None and iou(predictions[i], predictions[j]) >= 0.5
        for i, j in pairs
    ]
    # the referents of one scene share an image: resample whole scenes for the accuracy's interval
    scene_hits = np.array([sum(hits[i] for i in idx) for idx in by_image.values()], dtype=float)
    scene_sizes = np.array([len(idx) for idx in by_image.values()], dtype=float)
    accuracy_ci = bootstrap_statistic_ci(lambda pick: scene_hits[pick].sum() / scene_sizes[pick].sum(), len(scene_hits))
    decided = [i for i, s in enumerate(samples) if colour_decides(s)]
    return {
        "n": len(samples),
        "accuracy": float(np.mean(hits)),
        "colour_decides_n": len(decided),
        "colour_decides_accuracy": float(np.mean([hits[i] for i in decided])) if decided else float("nan"),
        "accuracy_ci_low": accuracy_ci[0],
        "accuracy_ci_high": accuracy_ci[1],
        "any_object_hit_rate": float(np.mean(object_hits)),
        "nearest_object_is_target_rate": float(np.mean(nearest_is_target)),
        "parse_failure_rate": float(np.mean([p is None for p in predictions])),
        "baseline_query_ignoring_ceiling": ceiling,
        "baseline_random_object": random_object,
        "baseline_largest_object": float(np.mean(largest)),
        "swap_pairs": len(pairs),
        "swap_both_correct": float(np.mean(both_right)) if pairs else float("nan"),
        "swap_same_box_rate": float(np.mean(same_box)) if pairs else float("nan"),
    }


def binding_errors(samples: Sequence[GroundingSample], predictions: Sequence[Box | None]) -> dict[str, float]:
    """Where wrong-object answers go: the share of ALL samples whose box lands nearest another object,
    split by the attributes in which that object differs from the referent ("colour", "colour+size", ...).

    A model that binds shape and size but not colour puts its errors under "colour" (and "colour+size"
    when the query does not name the size); a query-ignoring model spreads them over every key.
    """
    counts: dict[str, int] = {}
    for sample, box in zip(samples, predictions):
        if box is None:
            continue
        boxed = nearest_object(sample, box)
        if boxed == sample.meta["target_index"]:
            continue
        referent = sample.meta["object_attributes"][sample.meta["target_index"]]
        other = sample.meta["object_attributes"][boxed]
        key = "+".join(name for name, a, b in zip(("colour", "shape", "size"), referent, other) if a != b) or "none"
        counts[key] = counts.get(key, 0) + 1
    return {key: counts[key] / len(samples) for key in sorted(counts)}
