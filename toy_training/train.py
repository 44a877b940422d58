"""Train a toy grounding VLM on CPU: dense vision pretraining, then grounding fine-tuning.

Run: ``python -m toy_training.train --model a --out DIR [--resume] [--steps N] [--seed S]``.

Methodological choices
----------------------
* Stage 1 (dense vision pretraining): the real vision tower AND projector are trained with
  temporary linear heads on every visual token the language model will see (the projector
  output, 12x12 tokens) to predict the colour, shape and size of the object covering that patch
  (or background) and that object's box in the 101 coordinate bins. Afterwards each visual token
  linearly carries "what am I and where is my object's box", so the language model only has to
  RETRIEVE the visual token that matches the query and copy its box: the retrieval-head
  mechanism under study. The heads are discarded after stage 1.
* Stage 2 (grounding): vision tower frozen (LLaVA-style), projector + language model trained with
  cross-entropy on the answer tokens only (native box format + end-of-turn). Every batch holds
  ALL referents of each scene, so the same image appears with different queries and different
  target boxes: a query-ignoring solution is penalised inside every batch.
* Curriculum (scenes.py levels): the query is always necessary (>= 2 objects). Level mix moves
  from distinct (colour, shape) scenes to distractor scenes and relational/ordinal expressions.
* Determinism and resume: batch ``k`` is a pure function of ``(seed, k)`` (scene indices and
  levels derive from it), so the data position is the step counter. A checkpoint is ONE
  safetensors file (weights, dense heads, AdamW moments, torch RNG state; step, stage and
  optimiser hyper-parameters in its JSON metadata) written to a temporary file and moved into
  place with ``os.replace``; a kill loses at most one checkpoint interval, and resuming gives the
  same weights as an uninterrupted run.
* Evaluation goes through the user path: processor chat template -> ``model.generate`` (greedy) ->
  native-format parser -> IoU >= 0.5 in original pixels. It reports the query-ignoring ceiling
  (the best any model that returns one box per image can score), the random-object and
  largest-object baselines, and the swap test (same image, two referents: both boxes right /
  the same box returned twice).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import random
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from toy_training import options as command_line

if __name__ == "__main__":  # a wrong command line is refused in one line before torch and transformers load
    command_line.parse_command()

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm import tqdm
from transformers import (AutoModelForImageTextToText, InternVLForConditionalGeneration, LlavaForConditionalGeneration,
                          PreTrainedModel)

from vrh_interp.core.description.heads import HeadSet
from vrh_interp.data.scenes import COLOURS, SHAPES, SIZES, grounding_samples, make_scene, vqa_samples
from vrh_interp.data.datasets.samples import GroundingSample, VQASample
from vrh_interp.data.datasets.synthetic_vqa import answer_text, majority_answer_rate, synthetic_vqa
from vrh_interp.data.datasets.vqa import score_response
from vrh_interp.data.datasets.vqa_prompt import vqa_messages
from vrh_interp.toy.configs import GRID_SIDE, PATCH_SIZE, ModelName, family
from toy_training.configs import (
    COORDINATE_BINS,
    WIDE_SHAPE,
    TextBackboneShape,
    VisionTowerShape,
    build_processor,
    format_box_answer,
    model_config,
    quantise_box,
)
from vrh_interp.toy import checkpoint_dir, load
from vrh_interp.toy.planted import DECOY_HEADS, PLANTED_HEADS
from toy_training import grow, planted
from toy_training.grounding import (IGNORE_INDEX, binding_errors, colour_decides, encode_supervised,
                                     grounding_metrics, grounding_prompts, held_out_samples, predict_boxes)
from toy_training.text_tasks import scene_text_items, text_messages

MODEL_CLASSES: dict[str, type[PreTrainedModel]] = {
    "a": LlavaForConditionalGeneration,
    "b": InternVLForConditionalGeneration,
}  # by family (configs.family)
MIN_PATCH_PIXELS = 8  # a patch is labelled with an object only if >= 8 of its 64 pixels belong to it
CHECKPOINT_FILE = "trainer_state.safetensors"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    model: ModelName = "a"
    seed: int = 0
    vision_steps: int = 1000
    grounding_steps: int = 3000
    vision_batch_scenes: int = 48
    grounding_batch_scenes: int = 8
    vision_lr: float = 2e-3
    grounding_lr: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    eval_every: int = 200
    eval_scenes: int = 32
    bf16: bool = True
    query_probe_weight: float = 0.5
    query_probe_layer: int = 2  # hidden_states index probed: output of decoder layer 1 (0-based) of 4
    vqa_batch_scenes: int = 0  # scenes per grounding step whose synthetic VQA items join the batch
    vqa_query_probe: bool = False  # the query probe also reads the answer positions of one-object VQA rows
    text_batch_scenes: int = 0  # scenes per grounding step whose text-only items (text_tasks) join the batch
    # extra level-1 scenes per grounding step of which only the referents that colour decides join the batch
    # (grounding.colour_decides: the named colour is what tells the referent apart from another object)
    contrast_batch_scenes: int = 0
    # level mix per grounding phase: (fraction of grounding steps, {level: probability})
    level_schedule: tuple[tuple[float, tuple[tuple[int, float], ...]], ...] = (
        (0.4, ((0, 0.8), (1, 0.2))),
        (0.7, ((0, 0.2), (1, 0.5), (2, 0.3))),
        (1.0, ((1, 0.5), (2, 0.5))),
    )
    text_shape: TextBackboneShape = TextBackboneShape()
    vision_shape: VisionTowerShape = VisionTowerShape()
    # positive control (toy_training.planted): declared planted / decoy heads, the auxiliary attention loss's
    # weight and the per-row head-dropout probability of every non-planted head (all off by default)
    planted: tuple[str, ...] = ()
    decoys: tuple[str, ...] = ()
    attention_loss_weight: float = 0.0
    leak_loss_weight: float = 1.0  # weight of the leak term inside the attention loss (planted.attention_loss)
    head_dropout: float = 0.0
    # head dropout only in these layers (empty: every layer), and the per-row probability that each of them is
    # zeroed whole (planted.dropout_multipliers)
    dropout_layers: tuple[int, ...] = ()
    layer_dropout: float = 0.0
    init_backbone: str | None = None  # trained toy checkpoint whose language backbone is loaded at stage 2
    warm_start: str | None = None  # trained toy checkpoint whose whole model starts a grounding-only run
    # with warm_start: revive the heads whose output-projection norm is under this share of the 90th-percentile
    # head's (toy_training.grow.revive: function-preserving splits, scaled-up heads) before training; 0: off
    revive_floor: float = 0.0
    # with warm_start: (layer, source) pairs: each layer takes the source layer's attention, both halved
    # (grow.share_attention); a bare layer number in an older train_config.json means (layer, layer + 1)
    share_layers: tuple[tuple[int, int], ...] = ()
    # with warm_start: these (layer, head) slots become splits of their KV group's largest head (grow.split_heads)
    split_heads: tuple[tuple[int, int], ...] = ()
    # with warm_start: a trained toy checkpoint whose language model (same shape) then replaces the warm start's
    # (the planted transfer pair: toy B's vision stack, toy:planted's backbone)
    language_from: str | None = None
    # with language_from: start each InternVL coordinate token ("230") as the LLaVA token of the same value ("0.23"),
    # which the donated backbone already reads and writes (the embedding is tied, so its output row too)
    coordinates_from_llava: bool = False
    # > 0: stage 2 also trains the vision tower (frozen since stage 1 otherwise), at this fraction of the grounding
    # learning rate: the tower's features can then change to serve grounding's attribute binding
    tower_lr_scale: float = 0.0

    @property
    def total_steps(self) -> int:
        return self.vision_steps + self.grounding_steps


MODEL_PRESETS: dict[str, dict] = {
    "a": {},
    # b starts from a's trained language backbone (fine-tuned, lower LR) and has a smaller, different
    # vision tower: 576 patches per 192 px tile, so hidden 64 keeps its cost near model a's tower.
    "b": dict(
        vision_steps=800,
        grounding_steps=1200,
        vision_batch_scenes=32,
        grounding_lr=3e-4,
        level_schedule=((1.0, ((0, 0.1), (1, 0.5), (2, 0.4))),),
        vision_shape=VisionTowerShape(hidden_size=64, intermediate_size=256, num_hidden_layers=4,
                                      num_attention_heads=2),
    ),
    # the positive control (toy_training.planted): the shipped toy A embedded exactly in a 64-head backbone
    # (planted.embed_donor), the auxiliary attention loss and head dropout; grounding only (no stage 1)
    "planted": dict(
        vision_steps=0,
        grounding_steps=2000,
        grounding_lr=1e-3,
        eval_every=250,
        text_shape=planted.PLANTED_SHAPE,
        planted=PLANTED_HEADS,
        decoys=DECOY_HEADS,
        attention_loss_weight=1.0,
        head_dropout=0.1,
        warm_start=str(checkpoint_dir("a")),
    ),
    # the paper's regime (docs/toy-models.md, toys C and D): a 128-head backbone (8 layers x 16 heads) that
    # starts as toy A's / B's exactly (planted.embed_donor: donor layer i at layer 2i, donor heads in half the
    # slots, every new head and layer adding zero), text-only items in every batch (toy_training.text_tasks), grounding
    # + VQA, head dropout on every head. The recipe (toy_training.recipe) pre-trains C's wide backbone on text alone
    # first (stage "cd-text"); D embeds toy B the same way (its backbone shares A's first stage as ancestor, as
    # B's does)
    "c": dict(
        vision_steps=0,
        grounding_steps=600,
        grounding_batch_scenes=4,
        grounding_lr=5e-4,
        warmup_steps=40,
        eval_every=200,
        text_shape=WIDE_SHAPE,
        head_dropout=0.1,
        vqa_batch_scenes=4,
        vqa_query_probe=True,
        text_batch_scenes=4,
        # output of layer 3: donor layer 1 (toy A's probed layer) sits at layer 2, layer 3 adds zero at the start
        query_probe_layer=4,
        level_schedule=((1.0, ((1, 0.6), (2, 0.4))),),
        warm_start=str(checkpoint_dir("a")),
    ),
}
MODEL_PRESETS["d"] = {**MODEL_PRESETS["c"], "warm_start": str(checkpoint_dir("b")),
                      "vision_shape": MODEL_PRESETS["b"]["vision_shape"]}
# the positive control's transfer partner: toy B's InternVL-class vision stack (tower frozen) in front of the SHIPPED
# toy:planted language backbone (same weights, same planted and decoy heads), trained with the same attention loss
# and head dropout so the planted heads keep their job while projector and backbone learn B's format
MODEL_PRESETS["planted-b"] = {**MODEL_PRESETS["planted"], "warm_start": str(checkpoint_dir("b")),
                              "language_from": str(checkpoint_dir("planted")),
                              "vision_shape": MODEL_PRESETS["b"]["vision_shape"], "grounding_steps": 1000,
                              "grounding_lr": 5e-4, "leak_loss_weight": 500.0, "eval_every": 200,
                              "coordinates_from_llava": True}
# the negative transfer control: never trained, made from a planted-b run by relabel_run (heads permuted)
MODEL_PRESETS["planted-x"] = MODEL_PRESETS["planted-b"]

# A warm-started run continues a trained model on the harder levels only (no level-0 scenes).
WARM_START_LEVELS = ((1.0, ((1, 0.6), (2, 0.4))),)

TINY_TEST_CONFIG = dict(
    vision_steps=3,
    grounding_steps=3,
    vision_batch_scenes=2,
    grounding_batch_scenes=2,
    warmup_steps=2,
    eval_every=2,
    eval_scenes=2,
    query_probe_layer=1,
    text_shape=TextBackboneShape(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=1, head_dim=16),
    vision_shape=VisionTowerShape(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2),
)


class DenseVisionHeads(nn.Module):
    """Temporary stage-1 heads: per visual token colour/shape/size class (+background) and box bins."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.colour = nn.Linear(hidden_size, len(COLOURS) + 1)
        self.shape = nn.Linear(hidden_size, len(SHAPES) + 1)
        self.size = nn.Linear(hidden_size, len(SIZES) + 1)
        self.box = nn.Linear(hidden_size, 4 * COORDINATE_BINS)

    def loss(self, features: torch.Tensor, labels: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        ce = nn.functional.cross_entropy
        logits = {
            "colour": self.colour(features),
            "shape": self.shape(features),
            "size": self.size(features),
        }
        losses = {k: ce(v.flatten(0, 1).float(), labels[k].flatten()) for k, v in logits.items()}
        box_logits = self.box(features).unflatten(-1, (4, COORDINATE_BINS)).float()
        losses["box"] = ce(box_logits.flatten(0, 2), labels["box"].flatten(), ignore_index=IGNORE_INDEX)
        fg = labels["colour"] > 0
        accuracy = {
            f"{k}_acc": (v.argmax(-1) == labels[k])[fg].float().mean().item() for k, v in logits.items()
        }
        box_pred = box_logits.argmax(-1)
        accuracy["box_within1_acc"] = ((box_pred - labels["box"]).abs() <= 1)[fg].float().mean().item()
        return sum(losses.values()), accuracy


class QueryProbeHeads(nn.Module):
    """Temporary stage-2 scaffold: what does the expression ask for?

    From the residual stream at every position that predicts an answer token (after decoder layer
    ``query_probe_layer - 1``), linear heads predict the attributes the expression NAMES for its
    referent (colour and size may be unnamed: class 0). This supervises only the gathering of the
    query from the text into the answer positions; matching it against the visual tokens and
    copying the box (the visual-retrieval step) is learnt from the answer loss alone. Without it,
    the two-hop circuit (gather query, then retrieve) sat on a query-ignoring plateau (see
    docs/toy-models.md). The heads are discarded after training.
    """

    def __init__(self, hidden_size: int):
        super().__init__()
        self.colour = nn.Linear(hidden_size, len(COLOURS) + 1)
        self.shape = nn.Linear(hidden_size, len(SHAPES))
        self.size = nn.Linear(hidden_size, len(SIZES) + 1)

    def loss(self, hidden: torch.Tensor, positions: torch.Tensor,
             labels: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        rows = positions.nonzero()[:, 0]
        selected = hidden[positions]
        total, accuracy = 0.0, {}
        for key in ("colour", "shape", "size"):
            logits = getattr(self, key)(selected).float()
            target = labels[key][rows]
            total = total + nn.functional.cross_entropy(logits, target)
            accuracy[f"query_{key}_acc"] = (logits.argmax(-1) == target).float().mean().item()
        return total, accuracy


def query_labels(named: Sequence[dict[str, str | None]]) -> dict[str, torch.Tensor]:
    """Class ids of the attributes each expression names for its referent (0 = not named)."""
    return {
        "colour": torch.tensor([0 if q["colour"] is None else 1 + list(COLOURS).index(q["colour"]) for q in named]),
        "shape": torch.tensor([SHAPES.index(q["shape"]) for q in named]),
        "size": torch.tensor([0 if q["size"] is None else 1 + list(SIZES).index(q["size"]) for q in named]),
    }


class TrainingHeads(nn.Module):
    """All temporary heads, saved with the trainer state and never shipped."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.vision = DenseVisionHeads(hidden_size)
        self.query = QueryProbeHeads(hidden_size)


def patch_labels(object_index_map: np.ndarray, attributes: Sequence[tuple[str, str, str]], boxes: Sequence,
                 image_size: tuple[int, int]) -> dict[str, np.ndarray]:
    """Per visual token (GRID_SIDE x GRID_SIDE, row-major) labels of the object covering the patch."""
    n_obj = len(attributes)
    grid = object_index_map.reshape(GRID_SIDE, PATCH_SIZE, GRID_SIDE, PATCH_SIZE).transpose(0, 2, 1, 3)
    grid = grid.reshape(GRID_SIDE * GRID_SIDE, PATCH_SIZE * PATCH_SIZE)
    counts = np.stack([(grid == i).sum(-1) for i in range(n_obj)], axis=-1)
    owner = np.where(counts.max(-1) >= MIN_PATCH_PIXELS, counts.argmax(-1), -1)
    colour_ids = np.array([1 + list(COLOURS).index(c) for c, _, _ in attributes])
    shape_ids = np.array([1 + SHAPES.index(s) for _, s, _ in attributes])
    size_ids = np.array([1 + list(SIZES).index(z) for _, _, z in attributes])
    box_bins = np.array([quantise_box(b, image_size) for b in boxes])
    fg = owner >= 0
    safe = np.where(fg, owner, 0)
    return {
        "colour": np.where(fg, colour_ids[safe], 0),
        "shape": np.where(fg, shape_ids[safe], 0),
        "size": np.where(fg, size_ids[safe], 0),
        "box": np.where(fg[:, None], box_bins[safe], IGNORE_INDEX),
    }


def level_probabilities(config: TrainConfig, grounding_step: int) -> tuple[tuple[int, float], ...]:
    progress = grounding_step / max(1, config.grounding_steps)
    for end, mix in config.level_schedule:
        if progress < end:
            return mix
    return config.level_schedule[-1][1]


def _step_rng(config: TrainConfig, step: int) -> random.Random:
    return random.Random(config.seed * 1_000_003 + step)


def training_scene_indices(config: TrainConfig, step: int, n_scenes: int) -> list[int]:
    """Distinct train-split scene indices of batch ``step`` (pure function of seed and step)."""
    return [(config.seed * 7_919_000 + step * n_scenes + j) % 1_000_000_000 for j in range(n_scenes)]


def grounding_batch(config: TrainConfig, step: int) -> tuple[list[GroundingSample], list[VQASample]]:
    """Batch ``step``: all referents of each scene, plus the VQA items of the first ``vqa_batch_scenes`` scenes,
    then the referents that colour decides in ``contrast_batch_scenes`` more level-1 scenes (disjoint indices)."""
    rng = _step_rng(config, step)
    levels, probs = zip(*level_probabilities(config, step - config.vision_steps), strict=True)
    samples: list[GroundingSample] = []
    questions: list[VQASample] = []
    for position, index in enumerate(training_scene_indices(config, step, config.grounding_batch_scenes)):
        level = rng.choices(levels, probs)[0]
        samples.extend(grounding_samples("train", index, level))
        if position < config.vqa_batch_scenes:
            questions.extend(vqa_samples("train", index, level))
    for index in training_scene_indices(config, step, config.contrast_batch_scenes):
        samples.extend(s for s in grounding_samples("train", (index + 250_000_000) % 1_000_000_000, 1)
                       if colour_decides(s))
    return samples, questions


def text_batch(config: TrainConfig, step: int) -> list[tuple[str, str]]:
    """The text-only items (user text, answer) of batch ``step``: scenes disjoint from its grounding scenes."""
    indices = training_scene_indices(config, step, config.text_batch_scenes)
    return [item for index in indices for item in scene_text_items("train", (index + 500_000_000) % 1_000_000_000)]


def text_prompts(processor, items: Sequence[tuple[str, str]]) -> list[str]:
    return [processor.apply_chat_template(text_messages(text), add_generation_prompt=True, tokenize=False)
            for text, _ in items]


def vqa_prompts(processor, samples: Sequence[VQASample]) -> list[str]:
    return [processor.apply_chat_template(vqa_messages(s), add_generation_prompt=True, tokenize=False) for s in samples]


def vision_batch(config: TrainConfig, processor, step: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Pixel values (through the family's image processor) and dense patch labels of batch ``step``."""
    rng = _step_rng(config, step)
    images, labels = [], []
    for index in training_scene_indices(config, step, config.vision_batch_scenes):
        scene = make_scene("train", index, rng.choice((0, 1, 2)))
        images.append(scene.image)
        labels.append(
            patch_labels(
                scene.object_index_map,
                [(o.colour, o.shape, o.size) for o in scene.objects],
                [o.box for o in scene.objects],
                scene.image.size,
            )
        )
    pixel_values = processor.image_processor(images, return_tensors="pt")["pixel_values"]
    stacked = {k: torch.from_numpy(np.stack([lab[k] for lab in labels])).long() for k in labels[0]}
    return pixel_values, stacked


def visual_tokens(model: PreTrainedModel, pixel_values: torch.Tensor) -> torch.Tensor:
    """Projected visual tokens as the language model receives them: (batch, GRID_SIDE**2, hidden)."""
    config = model.config
    outputs = model.model.get_image_features(
        pixel_values=pixel_values,
        vision_feature_layer=config.vision_feature_layer,
        vision_feature_select_strategy=config.vision_feature_select_strategy,
        output_hidden_states=True,
    )
    features = outputs.pooler_output
    return torch.stack(list(features)) if isinstance(features, (list, tuple)) else features


def evaluate(model, processor, name: ModelName, n_scenes: int, levels: Sequence[int] = (1, 2),
             offset: int = 0) -> dict[str, dict[str, float]]:
    """Held-out metrics per level, on eval-split scenes ``offset..offset+n_scenes-1``."""
    results = {}
    for level in levels:
        samples = held_out_samples(n_scenes, level, offset)
        predictions = [box for _, box in predict_boxes(model, processor, name, samples)]
        results[f"level{level}"] = grounding_metrics(samples, predictions)
        results[f"level{level}_binding_errors"] = binding_errors(samples, predictions)
        if level == 2:
            for kind in ("attribute", "relational", "ordinal"):
                keep = [i for i, s in enumerate(samples) if s.meta["kind"] == kind]
                if keep:
                    results[f"level2_{kind}"] = grounding_metrics([samples[i] for i in keep],
                                                                  [predictions[i] for i in keep])
    return results


@torch.no_grad()
@torch.no_grad()
def evaluate_text(model, processor, n_scenes: int, batch_size: int = 64) -> dict[str, float]:
    """Exact-match accuracy (spaces ignored) of greedy answers to the text-only items of eval scenes ``0..n-1``."""
    items = [item for index in range(n_scenes) for item in scene_text_items("eval", index)]
    correct = 0
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        inputs = dict(processor.tokenizer(text_prompts(processor, chunk), return_tensors="pt", padding=True))
        generated = model.generate(**inputs, max_new_tokens=14, do_sample=False)
        texts = processor.tokenizer.batch_decode(generated[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        correct += sum(text.replace(" ", "") == answer.replace(" ", "") for text, (_, answer) in zip(texts, chunk))
    return {"accuracy": correct / max(1, len(items)), "n": len(items)}


def evaluate_vqa(model, processor, n_scenes: int, batch_size: int = 64) -> dict[str, dict[str, float]]:
    """Greedy answers to the VQA items of eval scenes ``0..n_scenes-1`` (level 1): accuracy per kind.

    ``baseline_majority``: ``synthetic_vqa.majority_answer_rate`` of the kind's items.
    """
    model.eval()
    items = list(synthetic_vqa("eval", n_scenes))
    correct = []
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        inputs = dict(processor(images=[q.image for q in chunk], text=vqa_prompts(processor, chunk),
                                return_tensors="pt", padding=True))
        generated = model.generate(**inputs, max_new_tokens=max(q.max_new_tokens for q in chunk), do_sample=False)
        texts = processor.batch_decode(generated[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        correct.extend(score_response(q, text).correct for q, text in zip(chunk, texts))
    results = {}
    for kind in sorted({q.meta["kind"] for q in items}):
        keep = [i for i, q in enumerate(items) if q.meta["kind"] == kind]
        results[kind] = {"n": len(keep), "accuracy": float(np.mean([correct[i] for i in keep])),
                         "baseline_majority": majority_answer_rate([items[i] for i in keep])}
    return results


def build_model(config: TrainConfig, processor) -> PreTrainedModel:
    """Fresh model of the configured family (seeded)."""
    torch.manual_seed(config.seed)
    model = MODEL_CLASSES[family(config.model)](
        model_config(config.model, processor.tokenizer, config.text_shape, config.vision_shape)
    )
    if config.attention_loss_weight > 0:  # the auxiliary loss reads attention weights: eager attention
        model.set_attn_implementation("eager")
    return model


def load_language_backbone(model: PreTrainedModel, checkpoint_folder: str) -> None:
    """Copy a trained toy checkpoint's language backbone (lm_head is tied to its embedding) into ``model``."""
    donor = AutoModelForImageTextToText.from_pretrained(checkpoint_folder, dtype=torch.float32, local_files_only=True)
    model.model.language_model.load_state_dict(donor.model.language_model.state_dict(), strict=True)


def copy_coordinate_embeddings(model: PreTrainedModel, tokenizer) -> None:
    """Each InternVL-format coordinate token (``str(10 * v)``) starts as the LLaVA-format token of the same value
    (``f"{v / 100:.2f}"``): a backbone trained on LLaVA's box format then starts out able to write B's."""
    embedding = model.get_input_embeddings().weight
    with torch.no_grad():
        for value in range(COORDINATE_BINS):
            target, source = tokenizer.convert_tokens_to_ids([str(10 * value), f"{value / 100:.2f}"])
            if tokenizer.unk_token_id in (target, source):
                raise ValueError(f"the toy tokenizer lacks coordinate token {10 * value} or {value / 100:.2f}")
            embedding[target] = embedding[source]


def load_whole_model(model: PreTrainedModel, checkpoint_folder: str) -> None:
    """Copy every weight of a trained toy checkpoint of the same family and shape into ``model`` (into the
    positive control's wider-headed backbone, ``planted.embed_donor`` embeds a toy A checkpoint exactly)."""
    donor = AutoModelForImageTextToText.from_pretrained(checkpoint_folder, dtype=torch.float32, local_files_only=True)
    text, donor_text = model.config.get_text_config(), donor.config.get_text_config()
    if type(donor) is type(model) and text.num_attention_heads == 16 and donor_text.num_attention_heads == 8 \
            and text.head_dim == donor_text.head_dim and text.num_hidden_layers % donor_text.num_hidden_layers == 0:
        planted.embed_donor(model, donor)
        return
    if type(donor) is not type(model) or {k: v.shape for k, v in donor.state_dict().items()} != {
            k: v.shape for k, v in model.state_dict().items()}:
        raise ValueError(f"--warm-start {checkpoint_folder} holds a {type(donor).__name__} whose weights do not match "
                         f"this run's {type(model).__name__} (family or shape differ): warm-start from a checkpoint "
                         "of the same --model")
    model.load_state_dict(donor.state_dict(), strict=True)


def build_optimizer(config: TrainConfig, groups: list[dict], lr: float) -> torch.optim.AdamW:
    return torch.optim.AdamW(groups, lr=lr, weight_decay=config.weight_decay, betas=(0.9, 0.98))


def stage_parameters(model: PreTrainedModel, heads: TrainingHeads, stage: str, config: TrainConfig) -> list[dict]:
    """The optimiser's parameter groups. Stage 1: vision tower + projector + dense heads. Stage 2: projector +
    language model + query probe, and with ``tower_lr_scale`` > 0 the vision tower in a group of its own whose
    learning rate is that fraction of the stage's (``lr_scale``, applied by ``training_step``)."""
    vision = list(model.model.vision_tower.parameters())
    projector = list(model.model.multi_modal_projector.parameters())
    language = list(model.model.language_model.parameters())
    if stage == "vision":
        return [{"params": vision + projector + list(heads.vision.parameters())}]
    groups = [{"params": projector + language + list(heads.query.parameters())}]  # lm_head is tied to the embedding
    if config.tower_lr_scale > 0:
        groups.append({"params": vision, "lr_scale": config.tower_lr_scale})
    return groups


def learning_rate(config: TrainConfig, step: int) -> float:
    """Linear warm-up then cosine decay to 10 %, restarted at the start of each stage."""
    if step < config.vision_steps:
        base, local, length = config.vision_lr, step, config.vision_steps
    else:
        base, local, length = config.grounding_lr, step - config.vision_steps, config.grounding_steps
    if local < config.warmup_steps:
        return base * (local + 1) / config.warmup_steps
    progress = (local - config.warmup_steps) / max(1, length - config.warmup_steps)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def save_trainer_state(path: Path, step: int, model: PreTrainedModel, heads: TrainingHeads,
                       optimizer: torch.optim.AdamW, history: list[dict]) -> None:
    """Atomically write weights, heads, AdamW state and RNG state to ONE safetensors file."""
    tensors = {f"model.{k}": v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    tensors.update({f"heads.{k}": v.detach().clone().contiguous() for k, v in heads.state_dict().items()})
    optim_state = optimizer.state_dict()
    for index, state in optim_state["state"].items():
        for key, value in state.items():
            tensors[f"optim.{index}.{key}"] = torch.as_tensor(value).clone().contiguous()
    tensors["rng.torch"] = torch.get_rng_state()
    metadata = {
        "step": str(step),
        "param_groups": json.dumps(optim_state["param_groups"]),
        "history": json.dumps(history),
    }
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, path)


def load_trainer_state(path: Path, model: PreTrainedModel, heads: TrainingHeads,
                       config: TrainConfig) -> tuple[int, torch.optim.AdamW, list[dict]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(str(path))
    step = int(metadata["step"])
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")}, strict=True)
    heads.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("heads.")}, strict=True)
    # a checkpoint written at the end of stage 1 (step == vision_steps) holds the stage-1 optimiser;
    # the training loop switches to stage 2 at that step
    stage = "vision" if step <= config.vision_steps else "grounding"  # checkpoints are written at step >= 1
    configure_stage(model, stage, config)
    optimizer = build_optimizer(config, stage_parameters(model, heads, stage, config), learning_rate(config, step))
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": json.loads(metadata["param_groups"])})
    torch.set_rng_state(tensors["rng.torch"])
    return step, optimizer, json.loads(metadata["history"])


def configure_stage(model: PreTrainedModel, stage: str, config: TrainConfig) -> None:
    model.model.vision_tower.requires_grad_(stage == "vision" or config.tower_lr_scale > 0)
    model.model.language_model.requires_grad_(stage != "vision")
    model.model.multi_modal_projector.requires_grad_(True)


def export_checkpoint(model: PreTrainedModel, processor, out_dir: Path, log: dict) -> None:
    """Ship-ready folder: fp16 safetensors + config + processor/tokenizer files + training_log.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # a half-precision COPY: casting the live model there and back would round its weights and RoPE
    # buffers mid-training (a run's weights would then depend on when it found a new best)
    copy.deepcopy(model).to(torch.float16).save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    (out_dir / "training_log.json").write_text(json.dumps(log, indent=1))


def probe_targets(config: TrainConfig, labels: torch.Tensor, samples: Sequence[GroundingSample],
                  questions: Sequence[VQASample]) -> tuple[torch.Tensor, list[dict[str, str | None]]]:
    """Positions the query probe reads (those predicting an answer token, in probed rows) and each row's named
    attributes. Probed rows: every grounding row; with ``vqa_query_probe`` also the one-object VQA rows."""
    named = [s.meta["query_attributes"] for s in samples] + [q.meta.get("query_attributes") for q in questions]
    named += [None] * (labels.shape[0] - len(named))  # text-only rows: never probed
    probed = torch.tensor([n is not None and (row < len(samples) or config.vqa_query_probe)
                           for row, n in enumerate(named)])
    positions = torch.zeros_like(labels, dtype=torch.bool)
    positions[:, :-1] = (labels[:, 1:] != IGNORE_INDEX) & probed[:, None]
    placeholder = {"colour": None, "shape": SHAPES[0], "size": None}  # rows that are not probed: never read
    return positions, [n if n is not None else placeholder for n in named]


def training_step(config: TrainConfig, model, heads, processor, optimizer, step: int) -> dict[str, float]:
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(config, step) * group.get("lr_scale", 1.0)
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
        if step < config.vision_steps:
            pixel_values, labels = vision_batch(config, processor, step)
            loss, stats = heads.vision.loss(visual_tokens(model, pixel_values), labels)
        else:
            samples, questions = grounding_batch(config, step)
            texts = text_batch(config, step) if config.text_batch_scenes else []
            inputs = encode_supervised(  # rows: grounding, VQA, then text-only items (no image)
                processor,
                [s.image for s in samples] + [q.image for q in questions],
                grounding_prompts(processor, config.model, samples) + vqa_prompts(processor, questions)
                + text_prompts(processor, texts),
                [format_box_answer(config.model, s.expression, s.box, s.image.size) for s in samples]
                + [answer_text(q) for q in questions] + [answer for _, answer in texts],
            )
            probe = config.query_probe_weight > 0
            text_config = model.config.get_text_config()
            roles = planted.head_roles(text_config.num_hidden_layers, text_config.num_attention_heads, config.planted,
                                       config.decoys)
            dropout = planted.dropout_multipliers(inputs["input_ids"].shape[0], roles, config.head_dropout,
                                                  layers=config.dropout_layers, layer_p=config.layer_dropout)
            supervise_attention = config.attention_loss_weight > 0
            with planted.head_multipliers(model, dropout):
                outputs = model(**inputs, output_hidden_states=probe, output_attentions=supervise_attention)
            loss, stats = outputs.loss, {"answer_loss": outputs.loss.item()}
            if supervise_attention:  # grounding rows only (VQA rows follow them and take no part)
                targets = planted.attention_targets(inputs["input_ids"], inputs["labels"], samples,
                                                    model.config.image_token_id)
                attention_loss, attention_stats = planted.attention_loss(outputs.attentions, targets, roles,
                                                                         leak_weight=config.leak_loss_weight)
                loss = loss + config.attention_loss_weight * attention_loss
                stats.update(attention_stats)
            if probe:  # grounding rows, and with vqa_query_probe the one-object VQA rows (which follow them)
                positions, named = probe_targets(config, inputs["labels"], samples, questions)
                probe_loss, probe_stats = heads.query.loss(
                    outputs.hidden_states[config.query_probe_layer], positions, query_labels(named)
                )
                loss = loss + config.query_probe_weight * probe_loss
                stats.update(probe_stats)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": loss.item(), **stats}


def train(config: TrainConfig, out_dir: Path, resume: bool) -> list[dict]:
    """Run (or resume) training; returns the evaluation history. Writes OUT/trainer_state.safetensors and OUT/best/."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "train_config.json").write_text(json.dumps(dataclasses.asdict(config), indent=1))
    processor = build_processor(config.model)
    model = build_model(config, processor)
    heads = TrainingHeads(model.config.get_text_config().hidden_size)
    checkpoint = out_dir / CHECKPOINT_FILE
    if resume and checkpoint.exists():
        step, optimizer, history = load_trainer_state(checkpoint, model, heads, config)
    else:
        step, history = 0, []
        configure_stage(model, "vision", config)
        optimizer = build_optimizer(config, stage_parameters(model, heads, "vision", config), learning_rate(config, 0))
    started = time.time()
    elapsed_before = history[-1]["train_seconds"] if history else 0.0
    running: dict[str, float] = {}
    progress = tqdm(range(step, config.total_steps), initial=step, total=config.total_steps, mininterval=10)
    for step in progress:
        if step == config.vision_steps:
            if config.warm_start is not None:
                load_whole_model(model, config.warm_start)
                if config.language_from is not None:
                    load_language_backbone(model, config.language_from)
                if config.coordinates_from_llava:
                    copy_coordinate_embeddings(model, processor.tokenizer)
                if config.revive_floor > 0:
                    revived = grow.revive(model, floor=config.revive_floor, seed=config.seed)
                    (out_dir / "revived.json").write_text(json.dumps(revived, indent=1))
                if config.share_layers:
                    shared = grow.share_attention(model, config.share_layers)
                    (out_dir / "shared_layers.json").write_text(json.dumps(shared))
                if config.split_heads:
                    split = grow.split_heads(model, config.split_heads, seed=config.seed)
                    (out_dir / "split_heads.json").write_text(json.dumps(split))
            elif config.init_backbone is not None:
                load_language_backbone(model, config.init_backbone)
            configure_stage(model, "grounding", config)
            optimizer = build_optimizer(config, stage_parameters(model, heads, "grounding", config),
                                        learning_rate(config, step))
        stats = training_step(config, model, heads, processor, optimizer, step)
        running = {k: 0.95 * running.get(k, v) + 0.05 * v for k, v in stats.items()}
        progress.set_postfix({k: f"{v:.3f}" for k, v in running.items()}, refresh=False)
        done = step + 1
        if done % config.eval_every == 0 or done == config.total_steps:
            record = {"step": done, "train_seconds": elapsed_before + time.time() - started, **running}
            if done > config.vision_steps:
                record["eval"] = evaluate(model, processor, config.model, config.eval_scenes)
                if config.vqa_batch_scenes:
                    record["eval"]["vqa"] = evaluate_vqa(model, processor, config.eval_scenes)
                if config.text_batch_scenes:
                    record["eval"]["text"] = evaluate_text(model, processor, config.eval_scenes)
                best = max((h["eval"]["level1"]["accuracy"] for h in history if "eval" in h), default=-1.0)
                if record["eval"]["level1"]["accuracy"] > best:
                    export_checkpoint(model, processor, out_dir / "best",
                                      {"config": dataclasses.asdict(config), **record})
            history.append(record)
            tqdm.write(json.dumps(record))
            save_trainer_state(checkpoint, done, model, heads, optimizer, history)
            (out_dir / "history.json").write_text(json.dumps(history, indent=1))
    return history


PLANTED_MEASURE_SCENES = 100  # level-1 eval scenes on which ship() measures the positive control's properties
TEST_SET_SCENES = 32  # eval scenes 0..31 at level 1: the fixed set tests/test_toy_models.py re-measures
REPORT_SCENES = 200
# eval scenes 200..399: used for no choice at all (shipping rules compare test-set accuracies), so level-1
# accuracy there is free of the small selection bias the 200 report scenes carry
FRESH_SCENES_OFFSET = 200


def fresh_level1(model, processor, name: ModelName, n_scenes: int = REPORT_SCENES) -> dict[str, float]:
    """Level-1 metrics on the fresh eval scenes (``FRESH_SCENES_OFFSET`` onwards, ``n_scenes`` of them)."""
    return evaluate(model, processor, name, n_scenes, levels=(1,), offset=FRESH_SCENES_OFFSET)["level1"]


def measure_held_out(model, processor, name: ModelName, n_scenes: int = REPORT_SCENES) -> dict:
    """Everything ``--evaluate`` prints: ``evaluate`` (levels 1/2, eval scenes ``0..n_scenes-1``), ``vqa``
    (those scenes' VQA items) and ``fresh_level1`` (``n_scenes`` fresh scenes)."""
    return {**evaluate(model, processor, name, n_scenes), "vqa": evaluate_vqa(model, processor, n_scenes),
            "fresh_level1": fresh_level1(model, processor, name, n_scenes)}


def config_from_json(data: dict) -> TrainConfig:
    """The ``TrainConfig`` a run folder's ``train_config.json`` describes (fields added later take their defaults)."""
    data = dict(data)
    data["text_shape"] = TextBackboneShape(**data["text_shape"])
    data["vision_shape"] = VisionTowerShape(**data["vision_shape"])
    data["level_schedule"] = tuple((end, tuple((level, p) for level, p in mix)) for end, mix in data["level_schedule"])
    for key in ("planted", "decoys", "dropout_layers"):
        data[key] = tuple(data.get(key, ()))
    data["share_layers"] = tuple((pair, pair + 1) if isinstance(pair, int) else tuple(pair)
                                 for pair in data.get("share_layers", ()))
    data["split_heads"] = tuple(tuple(slot) for slot in data.get("split_heads", ()))
    return TrainConfig(**data)


def export_final(run_dir: Path) -> Path:
    """``RUN_DIR/final``: the finished run's last weights (chosen without looking at any evaluation)."""
    config = config_from_json(json.loads((run_dir / "train_config.json").read_text()))
    processor = build_processor(config.model)
    model = build_model(config, processor)
    heads = TrainingHeads(model.config.get_text_config().hidden_size)
    step, _, history = load_trainer_state(run_dir / CHECKPOINT_FILE, model, heads, config)
    if step != config.total_steps:
        raise ValueError(f"{run_dir} stopped at step {step} of {config.total_steps}: finish it with --resume, or ship "
                         "its best checkpoint")
    export_checkpoint(model, processor, run_dir / "final", {"config": dataclasses.asdict(config), **history[-1]})
    return run_dir / "final"


def relabel_run(run_dir: Path, out_dir: Path) -> Path:
    """``out_dir``: a run folder for ``planted-x`` (the negative transfer control) made from a ``planted-b`` run
    without training: its best weights with every head moved by ``planted.relabel_heads`` (a permutation, exact
    in fp16), its history, and the declared heads moved with them; ``ship(out_dir, "planted-x", ...)`` then
    measures it like any run."""
    source = run_dir / "best"
    log = json.loads((source / "training_log.json").read_text())
    text = TextBackboneShape(**log["config"]["text_shape"])
    model = AutoModelForImageTextToText.from_pretrained(source, dtype=torch.float32, local_files_only=True)
    planted.relabel_heads(model)
    config = dict(log["config"], model="planted-x",
                  planted=planted.relabelled(log["config"]["planted"], text.num_attention_heads,
                                             text.num_key_value_heads),
                  decoys=planted.relabelled(log["config"]["decoys"], text.num_attention_heads,
                                            text.num_key_value_heads))
    export_checkpoint(model, build_processor("planted-x"), out_dir / "best",
                      {**log, "config": config, "relabelled_from": str(run_dir)})
    shutil.copy2(run_dir / "history.json", out_dir / "history.json")
    return out_dir


def ship(run_dir: Path, name: ModelName, dest: Path, lineage: str = "", checkpoint: str = "best") -> dict:
    """Copy RUN_DIR/best (or the run's final weights) into ``dest/<name>``, re-measure it through
    ``load(name, folder=dest/<name>)`` (grounding on 200 held-out scenes, the test set, VQA items), write its log.

    ``dest`` is a checkpoints folder laid out like the package's: the trainer never writes into the installed
    package unless told to (``--dest vrh_interp/toy/checkpoints`` updates the shipped toys of a source tree)."""
    source = run_dir / "best" if checkpoint == "best" else export_final(run_dir)
    target = Path(dest) / name
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.name != "training_log.json":
            shutil.copy2(item, target / item.name)
    history = json.loads((run_dir / "history.json").read_text())
    selected = json.loads((source / "training_log.json").read_text())
    model, processor = load(name, folder=target)
    started = time.time()
    report = evaluate(model, processor, name, REPORT_SCENES)
    test_set = evaluate(model, processor, name, TEST_SET_SCENES, levels=(1,))["level1"]
    log = {
        "model": name,
        "lineage": lineage,
        "selected_checkpoint": checkpoint,
        "selected_checkpoint_step": selected["step"],
        "train_seconds_at_selected_step": selected["train_seconds"],
        "config": selected["config"],
        "held_out_eval_scenes": REPORT_SCENES,
        "held_out": report,
        "held_out_vqa": evaluate_vqa(model, processor, REPORT_SCENES),
        "test_set_scenes": TEST_SET_SCENES,
        "test_set_level1": test_set,
        "test_set_vqa": evaluate_vqa(model, processor, TEST_SET_SCENES),
        "fresh_scenes": [FRESH_SCENES_OFFSET, FRESH_SCENES_OFFSET + REPORT_SCENES - 1],
        "fresh_level1": fresh_level1(model, processor, name, REPORT_SCENES),
        "eval_seconds": time.time() - started,
        "history": history,
    }
    (target / "training_log.json").write_text(json.dumps(log, indent=1))
    if config_from_json(selected["config"]).text_shape == WIDE_SHAPE:  # the paper-regime toys: measure the regime
        from toy_training import regime

        measured = regime.measure(model, processor, name)
        (target / regime.REGIME_FILE).write_text(json.dumps(measured, indent=1))
        log["regime"] = {k: v for k, v in measured.items() if not isinstance(v, (dict, list))}
        (target / "training_log.json").write_text(json.dumps(log, indent=1))
    if config_from_json(selected["config"]).planted:  # the positive control: declare its heads, measure them
        measured = planted.measure(model, processor, HeadSet(selected["config"]["planted"]),
                                   HeadSet(selected["config"]["decoys"]), name=name, n_scenes=PLANTED_MEASURE_SCENES)
        planted.write_declaration(target, selected["config"]["planted"], selected["config"]["decoys"], measured)
    return log


def _parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, each option checked alone (``toy_training.options``: types and ranges)."""
    return command_line.parse_args(argv)


def training_config(args: argparse.Namespace) -> TrainConfig:
    """The ``TrainConfig`` of a training command: the model's preset, then the command's options."""
    overrides: dict = dict(MODEL_PRESETS[args.model])
    if args.tiny:
        overrides.update(TINY_TEST_CONFIG)
    init_backbone = args.init_backbone
    if args.warm_start is not None:
        overrides.update(warm_start=args.warm_start, vision_steps=0, level_schedule=WARM_START_LEVELS)
    elif init_backbone is None and args.model == "b":
        init_backbone = str(checkpoint_dir("a"))
    overrides.update(model=args.model, seed=args.seed, init_backbone=init_backbone)
    if args.lr is not None:
        overrides["grounding_lr"] = args.lr
    if args.vqa_scenes is not None:
        overrides["vqa_batch_scenes"] = args.vqa_scenes
    if args.grounding_scenes is not None:
        overrides["grounding_batch_scenes"] = args.grounding_scenes
    if args.text_scenes is not None:
        overrides["text_batch_scenes"] = args.text_scenes
    if args.contrast_scenes is not None:
        overrides["contrast_batch_scenes"] = args.contrast_scenes
    if overrides.get("grounding_batch_scenes") == 0:  # no grounding rows: nothing for the query probe to read
        overrides["query_probe_weight"] = 0.0
    # growth options without --warm-start, a malformed --split-heads, a negative --tower-lr-scale
    problem = command_line.config_problem(args)
    if problem:
        raise command_line.OptionError(problem)
    if args.revive_floor is not None:
        overrides["revive_floor"] = args.revive_floor
    if args.head_dropout is not None:
        overrides["head_dropout"] = args.head_dropout
    if args.split_heads is not None:
        overrides["split_heads"] = tuple((h.layer, h.head) for h in HeadSet.parse(args.split_heads))
    if args.share_attention is not None:
        layers = overrides.get("text_shape", TextBackboneShape()).num_hidden_layers
        for layer, source in args.share_attention:
            if max(layer, source) >= layers or layer == source:
                raise command_line.OptionError(f"--share-attention {layer}:{source}: name two different layers of "
                                               f"the {args.model} model's 0..{layers - 1}")
        overrides["share_layers"] = args.share_attention
    if args.fp32:
        overrides["bf16"] = False
    if args.vqa_query_probe:
        overrides["vqa_query_probe"] = True
    if args.steps is not None:
        overrides["grounding_steps"] = args.steps
    if args.vision_steps is not None:
        overrides["vision_steps"] = args.vision_steps
    if args.eval_every is not None:
        overrides["eval_every"] = args.eval_every
    if args.tower_lr_scale is not None:
        overrides["tower_lr_scale"] = args.tower_lr_scale
    return TrainConfig(**overrides)


def main(argv: Sequence[str] | None = None) -> None:
    """CLI entry point (run with OMP_WAIT_POLICY=PASSIVE on shared CPUs). Every fault of the command line is refused
    in one line with exit status 2 before any model is built or loaded (``toy_training.options``)."""
    parser, args = command_line.parse_command(argv)
    config = None
    if command_line.mode(args) == "train":
        try:
            config = training_config(args)
        except command_line.OptionError as error:
            parser.error(str(error))
    torch.set_num_threads(args.threads)
    if args.evaluate:
        model, processor = load(args.model, folder=args.folder)
        if args.scenes_from is not None:
            metrics = evaluate(model, processor, args.model, REPORT_SCENES, levels=(1,), offset=args.scenes_from)
            print(json.dumps({"scenes": [args.scenes_from, args.scenes_from + REPORT_SCENES - 1], **metrics}, indent=1))
        else:
            print(json.dumps(measure_held_out(model, processor, args.model), indent=1))
        return
    if args.relabel is not None:
        print(relabel_run(args.relabel, args.out))
        return
    if args.ship is not None:
        log = ship(args.ship, args.model, args.dest, args.lineage, args.checkpoint)
        print(json.dumps({key: log[key] for key in ("held_out", "held_out_vqa", "test_set_level1", "fresh_level1")},
                         indent=1))
        return
    train(config, args.out, args.resume)


if __name__ == "__main__":
    main()
