"""Text-only tasks for the toy backbones: the jobs the language model's heads do without an image.

Why: toys A and B were trained on grounding (and VQA) only, so every attention head of their backbone is
spent on the image task, unlike a real VLM's LLM, which was pre-trained on text and keeps doing text work.
Toys C and D (the paper's regime, docs/toy-models.md) pre-train their backbone on these items and keep
them in every training batch, so heads have other jobs than visual retrieval.

The tasks are text versions of the scene tasks (the vocabulary is the toy tokenizer's, unchanged):

* text retrieval: the scene's objects listed in words with their boxes (``red small circle [0.10, ...]``,
  in a per-scene shuffled order) and a referring expression; the answer copies the referent's box. This
  is the retrieval-head job of the text-only literature (copy a span found by content), done by heads
  that then compete with the visual route;
* text counting: the same list and ``how many <shape>s are there ?``, answered with the count.

Each item is a pure function of ``(split, index, level)``, so training batches stay a function of
``(seed, step)`` and resume stays bit-exact.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from vrh_interp.data.scenes import SHAPES, grounding_samples

# attribute expressions (the relational/ordinal ones need the geometry a text list only encodes in numbers)
TEXT_LEVEL = 1


def _box_text(box: Sequence[float], image_size: tuple[int, int]) -> str:
    from toy_training.configs import quantise_box  # configs imports the tokenizer; keep this module import-light

    return "[" + ", ".join(f"{b / 100:.2f}" for b in quantise_box(tuple(box), image_size)) + "]"


def scene_text_items(split: str, index: int, level: int = TEXT_LEVEL) -> list[tuple[str, str]]:
    """``(user text, answer)`` pairs of one scene: one retrieval item per referent, one counting item."""
    samples = grounding_samples(split, index, level)
    if not samples:
        return []
    meta = samples[0].meta
    size = meta["image_size"]
    order = list(range(len(meta["object_boxes"])))
    random.Random(meta["seed"] * 31 + level).shuffle(order)
    listing = " ; ".join(f"{colour} {obj_size} {shape} {_box_text(meta['object_boxes'][k], size)}"
                         for k in order for colour, shape, obj_size in [meta["object_attributes"][k]])
    items = [(f"objects : {listing} . please provide the bounding box coordinate of the region this sentence "
              f"describes : {s.expression}", _box_text(s.box, size)) for s in samples]
    shapes = [shape for _, shape, _ in meta["object_attributes"]]
    shape = SHAPES[meta["seed"] % len(SHAPES)]
    count = shapes.count(shape)
    if count:
        items.append((f"objects : {listing} . how many {shape}s are there ? answer with a number", str(count)))
    return items


def text_messages(user_text: str) -> list[dict]:
    """One user turn without an image (the chat template's string-content branch)."""
    return [{"role": "user", "content": user_text}]
