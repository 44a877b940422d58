"""DPO preference pairs from head masking (the paper's appendix B), exported in TRL's DPOTrainer layout.

For each grounding sample the unmasked model's greedy answer is ``chosen`` and the answer of the same model
with the VRHs zero-ablated (``HeadAblation``, at every generation step) is ``rejected``: the pair isolates
what the VRHs contribute to the answer, so preference training on it pushes the model towards answers that
use them. The same export with as many RANDOM heads masked (``evaluation.controls.random_control``, the sweep's
controls, one file per seed) is the control: a model trained on those pairs learns whatever masking ANY
heads does, so an effect of the VRH pairs is only attributable to the VRHs if it exceeds the control's.

Choices
-------
* Generation is ``evaluation.grounding.ground_batch`` (greedy, left-padded batches, the library's ablation),
  so ``chosen`` is the answer the sweep's baseline scores and ``rejected`` the one its masked condition scores.
* Pairs with ``chosen == rejected`` (masking did not change the answer) carry no preference and are skipped;
  the summary counts them (``n_identical``). Nothing else is filtered: each record keeps both answers' IoU
  with the gold box in its provenance, so a user can keep e.g. only pairs where ``chosen`` is correct.
* Layout: TRL's conversational vision format (``docs/source/dataset_formats.md``, "Vision datasets", and
  ``dpo_trainer.md``, "Training Vision Language Models"): ``prompt`` is a user turn whose ``content`` is
  ``[{"type": "image"}, {"type": "text", "text": instruction}]`` (the family's grounding instruction, the
  text the model was prompted with), ``chosen`` / ``rejected`` are assistant turns with one text part, and
  ``images`` lists the turn's images. TRL expects image data there; a JSONL of image bytes is unwieldy, so
  ``images`` holds REFERENCES (``scene:SPLIT:INDEX:LEVEL`` for the seeded synthetic scenes, the file path for
  benchmark images) and ``open_image_reference`` turns them back into PIL images
  (``dataset.map(lambda r: {"images": [open_image_reference(x) for x in r["images"]]})`` before training).
* Provenance per record: model id / revision / family, the condition (``vrh`` or ``random:seed=S``), the
  masked heads, the ablation mode (``zero``), the random seed, ``max_new_tokens``, the sample id and gold box.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd
from PIL import Image

from vrh_interp.evaluation.grounding import GroundingOutcome, ground_batch
from vrh_interp.evaluation.controls import random_control
from vrh_interp.core.description.heads import HeadSet
from vrh_interp.core.description.model import VLM
from vrh_interp.data.checks import GroundingSampleLike, as_box, check_samples

ABLATION_MODE = "zero"  # what ground_batch applies
SCENE_PREFIX = "scene:"


def image_reference(sample: GroundingSampleLike) -> str:
    """A string that reopens ``sample``'s image: a synthetic scene spec or the image file's path."""
    meta = getattr(sample, "meta", None) or {}
    if all(key in meta for key in ("split", "index", "difficulty", "seed")):
        return f"{SCENE_PREFIX}{meta['split']}:{meta['index']}:{meta['difficulty']}"
    path = getattr(getattr(sample, "image_source", None), "path", None)
    if path is not None:
        return str(path)
    raise ValueError(f"sample {sample.sample_id!r} has no image reference (not a synthetic scene, no image file): "
                     "pass image_reference=a function from sample to a path you have saved the image to")


def open_image_reference(reference: str) -> Image.Image:
    """The image behind a reference written by ``image_reference``."""
    if reference.startswith(SCENE_PREFIX):
        from vrh_interp.data import make_scene

        parts = reference[len(SCENE_PREFIX):].split(":")
        if len(parts) != 3:
            raise ValueError(f"bad scene reference {reference!r}: expected scene:SPLIT:INDEX:LEVEL")
        split, index, level = parts
        return make_scene(split, int(index), int(level)).image  # type: ignore[arg-type]
    return Image.open(reference).convert("RGB")


@dataclass(frozen=True)
class PreferenceCondition:
    name: str  # "vrh" or "random:seed=S"
    heads: HeadSet
    seed: int | None
    path: Path


def control_path(path: Path, seed: int) -> Path:
    """Where the random-head control of ``seed`` goes: ``pairs.jsonl`` -> ``pairs.random-seed0.jsonl``."""
    return path.with_name(f"{path.stem}.random-seed{seed}{path.suffix or '.jsonl'}")


def export_preference_pairs(vlm: VLM, samples: Sequence[GroundingSampleLike], heads: HeadSet, path: str | Path, *,
                            control_seeds: Sequence[int] = (0,), batch_size: int = 8, max_new_tokens: int = 24,
                            iou_threshold: float = 0.5, exclude_first_layer: bool = False,
                            image_reference: Callable[[GroundingSampleLike], str] = image_reference) -> pd.DataFrame:
    """Write VRH-masked pairs to ``path`` and one random-head control per seed next to it; return a summary.

    Summary: one row per condition with the masked heads, the pairs written, the identical pairs skipped,
    and the chosen / rejected grounding accuracy (IoU >= ``iou_threshold``) over all samples.
    """
    check_samples(samples, what="preference samples")
    heads = vlm.geometry.validate(heads)
    if not len(heads):
        raise ValueError("heads is empty: nothing to mask")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if len(set(control_seeds)) != len(control_seeds):
        raise ValueError(f"duplicate control seeds in {list(control_seeds)}")
    path = Path(path)
    references = [image_reference(s) for s in samples]  # fail before any model time is spent
    conditions = [PreferenceCondition("vrh", heads, None, path)]
    for seed in control_seeds:
        conditions.append(PreferenceCondition(f"random:seed={seed}", random_control(
            vlm.geometry, heads, len(heads), seed, exclude_first_layer=exclude_first_layer), seed,
            control_path(path, seed)))
    chosen = _ground_all(vlm, samples, None, batch_size, max_new_tokens)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for condition in conditions:
        rejected = _ground_all(vlm, samples, condition.heads, batch_size, max_new_tokens)
        written = identical = 0
        with condition.path.open("w", encoding="utf-8") as handle:
            for sample, reference, good, bad in zip(samples, references, chosen, rejected):
                if good.answer == bad.answer:
                    identical += 1
                    continue
                record = preference_record(vlm, sample, reference, good, bad, condition, max_new_tokens)
                handle.write(json.dumps(record) + "\n")
                written += 1
        rows.append({"condition": condition.name, "heads": str(condition.heads), "seed": condition.seed,
                     "mode": ABLATION_MODE, "n_samples": len(samples), "n_pairs": written, "n_identical": identical,
                     "chosen_accuracy": sum(o.iou >= iou_threshold for o in chosen) / len(samples),
                     "rejected_accuracy": sum(o.iou >= iou_threshold for o in rejected) / len(samples),
                     "path": str(condition.path)})
    frame = pd.DataFrame(rows)
    frame["seed"] = frame["seed"].astype("Int64")  # None for the VRH condition
    return frame


def preference_record(vlm: VLM, sample: GroundingSampleLike, reference: str, chosen: GroundingOutcome,
                      rejected: GroundingOutcome, condition: PreferenceCondition,
                      max_new_tokens: int) -> dict[str, Any]:
    """One JSONL record in TRL's conversational vision preference layout, with provenance."""
    instruction = vlm.adapter.grounding_instruction(sample.expression)
    return {
        "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": instruction}]}],
        "chosen": [{"role": "assistant", "content": [{"type": "text", "text": chosen.answer}]}],
        "rejected": [{"role": "assistant", "content": [{"type": "text", "text": rejected.answer}]}],
        "images": [reference],
        "provenance": {
            "model_id": vlm.model_id,
            "revision": vlm.revision,
            "family": vlm.adapter.name,
            "condition": condition.name,
            "heads": condition.heads.to_list(),
            "mode": ABLATION_MODE,
            "seed": condition.seed,
            "max_new_tokens": max_new_tokens,
            "sample_id": sample.sample_id,
            "expression": sample.expression,
            "box": list(as_box(sample.box).as_tuple()),
            "chosen_iou": chosen.iou,
            "rejected_iou": rejected.iou,
        },
    }


def _ground_all(vlm: VLM, samples: Sequence[GroundingSampleLike], heads: HeadSet | None, batch_size: int,
                max_new_tokens: int) -> list[GroundingOutcome]:
    outcomes: list[GroundingOutcome] = []
    for start in range(0, len(samples), batch_size):
        outcomes.extend(ground_batch(vlm, samples[start:start + batch_size], heads=heads,
                                     max_new_tokens=max_new_tokens))
    return outcomes
