"""How the positive control ``toy:planted`` was built and measured (training only; not shipped).

A user who sees "masking the top-k heads does not hurt more than random heads" on their own model cannot
tell "this model has no VRHs" from "the pipeline cannot find them" unless the same pipeline demonstrably
finds planted heads (InterpBench, arXiv 2407.14494, grades circuit discovery the same way). This model is
that organism.

Construction (training-time only; the shipped model is a plain ``LlavaForConditionalGeneration`` that runs
with standard eager or sdpa attention and no custom code):

* Shape: toy A's family and vision stack, a language backbone of 4 layers x 16 heads (head_dim 8): 64
  heads. Its weight shapes equal toy A's (8 KV heads x 8 = A's 4 x 16), so training starts from the shipped
  toy A (vision tower frozen, as in every grounding stage); A's attention splits differently into heads
  here, so the attention circuit is learnt anew.
* Auxiliary attention loss on the eager attention weights, at the ANSWER rows (every position that
  predicts or holds an answer token, the rows the paper's score reads): the planted heads ``P`` are pulled
  onto the referent's visual tokens (``-log`` of their attention mass inside the referent's box cells), the
  decoys ``D`` onto the OTHER objects' cells, and every other head's attention from any text position
  after the image onto visual tokens is pushed towards zero (its mass is the penalty; ``P`` and ``D``
  are held to the same at the non-answer text rows). So P is the only route from the referent's visual
  tokens into the answer, and D carries visual evidence that the answer must not use.
* Head dropout: during training each head except ``P`` is zeroed (its slice of the output projection's
  input, exactly the library's zero ablation) with probability ``head_dropout`` per row, so random heads
  and the decoys become dispensable.

Nothing here is assumed from the losses: ``measure`` reads the properties off the shipped weights (eager
attention shares per head, masking accuracies of P, D and random sets through plain forward pre-hooks,
independent of the library's nnsight templates) and the model card and tests quote those measurements.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from toy_training.configs import TextBackboneShape
from toy_training.grounding import (IGNORE_INDEX, encode_supervised, grounding_metrics, grounding_prompts,
                                     held_out_samples, predict_boxes)
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.toy.configs import GRID_SIDE, PATCH_SIZE
from vrh_interp.toy.planted import PLANTED_FILE

PLANTED_SHAPE = TextBackboneShape(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=16,
                                  num_key_value_heads=4, head_dim=16)


@dataclasses.dataclass(frozen=True)
class AttentionTargets:
    """Per-row position masks ([batch, seq] bool) the auxiliary attention loss and the measurements use."""

    visual: torch.Tensor  # the image's visual tokens
    referent: torch.Tensor  # visual tokens whose patch overlaps the referent's box
    distractors: torch.Tensor  # visual tokens overlapping another object's box and not the referent's
    text_rows: torch.Tensor  # every position after the image (answer rows included)
    answer_rows: torch.Tensor  # positions predicting or holding an answer token


def box_cells(box: Sequence[float]) -> list[int]:
    """Row-major grid cells (``GRID_SIDE`` x ``GRID_SIDE`` patches of ``PATCH_SIZE`` px) overlapping ``box``
    (original pixels, xyxy): the same overlap rule as ``VisualLayout.positions_for_box``."""
    x1, y1, x2, y2 = box
    cols = [c for c in range(GRID_SIDE) if c * PATCH_SIZE < x2 and (c + 1) * PATCH_SIZE > x1]
    rows = [r for r in range(GRID_SIDE) if r * PATCH_SIZE < y2 and (r + 1) * PATCH_SIZE > y1]
    return [r * GRID_SIDE + c for r in rows for c in cols]


def attention_targets(input_ids: torch.Tensor, labels: torch.Tensor, samples: Sequence,
                      image_token_id: int) -> AttentionTargets:
    """Masks for grounding rows (left-padded batch: row ``i`` is ``samples[i]``; rows past ``len(samples)`` get
    no answer or text rows, so they take no part in the loss)."""
    batch, seq = input_ids.shape
    visual = input_ids == image_token_id
    referent = torch.zeros_like(visual)
    distractors = torch.zeros_like(visual)
    text_rows = torch.zeros_like(visual)
    answer = torch.zeros_like(visual)
    supervised = labels != IGNORE_INDEX
    for row, sample in enumerate(samples):
        positions = visual[row].nonzero().flatten()
        if len(positions) != GRID_SIDE * GRID_SIDE:
            raise ValueError(f"row {row} has {len(positions)} image tokens, expected {GRID_SIDE * GRID_SIDE}")
        own = box_cells(sample.box)
        others = {cell for k, other in enumerate(sample.meta["object_boxes"]) if k != sample.meta["target_index"]
                  for cell in box_cells(other)} - set(own)
        referent[row, positions[own]] = True
        distractors[row, positions[sorted(others)]] = True
        text_rows[row, int(positions[-1]) + 1:] = True
        answer[row, :-1] |= supervised[row, 1:]
        answer[row] |= supervised[row]
    return AttentionTargets(visual, referent, distractors, text_rows, answer)


def head_roles(num_layers: int, num_heads: int, planted: Sequence[str], decoys: Sequence[str]) -> torch.Tensor:
    """[layers, heads] int: 1 planted, 2 decoy, 0 the rest."""
    roles = torch.zeros(num_layers, num_heads, dtype=torch.long)
    for value, heads in ((1, planted), (2, decoys)):
        for head in HeadSet(heads):
            roles[head.layer, head.head] = value
    return roles


def key_masses(weights: torch.Tensor, targets: AttentionTargets, first_row: int) -> torch.Tensor:
    """[batch, heads, seq - first_row, 3]: attention mass of rows ``first_row..`` on the visual, referent and
    distractor keys (one batched matmul; rows before the text never enter the loss or the measurements)."""
    keys = torch.stack([targets.visual, targets.referent, targets.distractors], -1).to(weights.dtype)  # [b, seq, 3]
    return weights[:, :, first_row:, :] @ keys[:, None]


def first_text_row(targets: AttentionTargets) -> int:
    rows = targets.text_rows.any(0).nonzero()
    return int(rows[0]) if len(rows) else targets.text_rows.shape[1]


def attention_loss(attentions: Sequence[torch.Tensor], targets: AttentionTargets, roles: torch.Tensor,
                   eps: float = 1e-4, leak_weight: float = 1.0) -> tuple[torch.Tensor, dict[str, float]]:
    """The auxiliary loss of the construction (module docstring) from eager attention weights
    ([batch, heads, seq, seq] per layer): planted ``-log`` referent mass + decoy ``-log`` distractor mass at
    the answer rows, plus ``leak_weight`` x the mean visual mass of every other (head, text row) pair.

    Why ``leak_weight``: the mean over ~60 heads lets ONE head keep a quarter of its answer rows on the image
    at almost no cost (measured after the first stage: masking P then cost 2 points, because inherited toy-A
    heads still retrieved); ~50 (about the number of heads) makes each head pay for its own leak."""
    first = first_text_row(targets)
    answer = targets.answer_rows[:, None, first:]  # [batch, 1, rows]
    text = targets.text_rows[:, None, first:]
    other_text = text & ~answer
    planted_sum = decoy_sum = leak_sum = 0.0
    planted_n = decoy_n = leak_n = 0.0
    for layer, attention in enumerate(attentions):
        masses = key_masses(attention.float(), targets, first)  # [batch, heads, rows, 3]
        role = roles[layer][None, :, None]  # [1, heads, 1]
        is_planted, is_decoy = role == 1, role == 2
        planted_rows = (answer & is_planted).float()
        decoy_rows = (answer & is_decoy).float()
        leak_rows = torch.where(role > 0, other_text, text).float()
        planted_sum = planted_sum + (-torch.log(masses[..., 1] + eps) * planted_rows).sum()
        decoy_sum = decoy_sum + (-torch.log(masses[..., 2] + eps) * decoy_rows).sum()
        leak_sum = leak_sum + (masses[..., 0] * leak_rows).sum()
        planted_n, decoy_n, leak_n = (planted_n + planted_rows.sum(), decoy_n + decoy_rows.sum(),
                                      leak_n + leak_rows.sum())
    planted_loss = planted_sum / torch.clamp(torch.as_tensor(planted_n), min=1.0)
    decoy_loss = decoy_sum / torch.clamp(torch.as_tensor(decoy_n), min=1.0)
    leak = leak_sum / torch.clamp(torch.as_tensor(leak_n), min=1.0)
    stats = {"planted_nll": planted_loss.item(), "decoy_nll": decoy_loss.item(), "leak_mass": leak.item()}
    return planted_loss + decoy_loss + leak_weight * leak, stats


def donor_slot(head: int) -> int:
    """The head slot of the 16-head backbone that donor (toy A, 8 heads, 4 KV heads) head ``head`` fills: the
    first two slots of its KV group (groups of 4 query heads per KV head here, of 2 in the donor)."""
    return 4 * (head // 2) + head % 2


_LAYER = re.compile(r"(language_model\.layers\.)(\d+)\.")


@torch.no_grad()
def embed_donor(model, donor) -> None:
    """Start ``model`` (16 heads of the donor's head_dim per layer, ``stride`` times the donor's layers) as an
    exact copy of ``donor`` (toy A or B, 8 heads): donor layer ``i`` becomes layer ``stride * i``; there, every
    weight but the query and output projections is copied and donor head ``a`` becomes slot ``donor_slot(a)``
    (same KV head, same head_dim, so the same RoPE and scaling); the 8 other slots keep their random query
    weights and get zero output-projection columns. Layers between donor layers keep their random weights but
    get zero output and MLP down projections, so they add nothing. The function equals the donor's exactly at
    the start (tested); training gives the new heads and layers their jobs."""
    target = model.state_dict()
    source = donor.state_dict()
    text, donor_text = model.config.get_text_config(), donor.config.get_text_config()
    head_dim = text.head_dim
    donor_heads = donor_text.num_attention_heads
    if text.num_hidden_layers % donor_text.num_hidden_layers or text.head_dim != donor_text.head_dim:
        raise ValueError(f"cannot embed a {donor_text.num_hidden_layers}-layer donor (head_dim {donor_text.head_dim}) "
                         f"in a {text.num_hidden_layers}-layer model (head_dim {text.head_dim})")
    stride = text.num_hidden_layers // donor_text.num_hidden_layers
    for layer in range(text.num_hidden_layers):
        if layer % stride:
            target[f"model.language_model.layers.{layer}.self_attn.o_proj.weight"].zero_()
            target[f"model.language_model.layers.{layer}.mlp.down_proj.weight"].zero_()
    for donor_name, value in source.items():
        name = _LAYER.sub(lambda m: f"{m.group(1)}{int(m.group(2)) * stride}.", donor_name)
        if name not in target:
            raise ValueError(f"donor weight {donor_name} has no counterpart in the embedding model")
        in_backbone = "language_model" in name
        if in_backbone and name.endswith(("q_proj.weight", "q_proj.bias")):
            for a in range(donor_heads):
                s = donor_slot(a)
                target[name][s * head_dim:(s + 1) * head_dim] = value[a * head_dim:(a + 1) * head_dim]
        elif in_backbone and name.endswith("o_proj.weight"):
            target[name].zero_()
            for a in range(donor_heads):
                s = donor_slot(a)
                target[name][:, s * head_dim:(s + 1) * head_dim] = value[:, a * head_dim:(a + 1) * head_dim]
        else:
            if target[name].shape != value.shape:
                raise ValueError(f"donor weight {donor_name} has shape {tuple(value.shape)}, the embedding model "
                                 f"{tuple(target[name].shape)}")
            target[name].copy_(value)
    model.load_state_dict(target)


def relabel_slot(head: int, num_heads: int, num_kv_heads: int) -> int:
    """The negative transfer control's fixed head relabelling (an involution): KV group ``g`` moves to group
    ``g + groups / 2`` (mod groups) and the query heads of a group are reversed. Every planted and decoy index
    lands on a slot that held neither (tested), so a ranking carried over by index finds ordinary heads."""
    size = num_heads // num_kv_heads
    group, position = divmod(head, size)
    return ((group + num_kv_heads // 2) % num_kv_heads) * size + (size - 1 - position)


def relabel_heads(model) -> None:
    """Move every layer's query head ``h`` to slot ``relabel_slot(h)`` and its KV head with it (rows of
    q/k/v projections and biases, columns of the output projection): the function is unchanged (up to the
    summation order of the output projection), only the head indices differ (``toy:planted-x``)."""
    config = model.config.get_text_config()
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    size = heads // kv_heads
    query = [relabel_slot(h, heads, kv_heads) for h in range(heads)]
    groups = [query[g * size] // size for g in range(kv_heads)]
    if any(query[h] // size != groups[h // size] for h in range(heads)):
        raise ValueError("the relabelling must keep each KV group's query heads together")

    def rows(slots: list[int]) -> torch.Tensor:  # new row r holds old row index[r]
        index = torch.empty(len(slots) * head_dim, dtype=torch.long)
        for old, new in enumerate(slots):
            index[new * head_dim:(new + 1) * head_dim] = torch.arange(old * head_dim, (old + 1) * head_dim)
        return index

    with torch.no_grad():
        for layer in model.model.language_model.layers:
            attention = layer.self_attn
            for projection, slots in ((attention.q_proj, query), (attention.k_proj, groups),
                                      (attention.v_proj, groups)):
                index = rows(slots)
                projection.weight.copy_(projection.weight[index])
                if projection.bias is not None:
                    projection.bias.copy_(projection.bias[index])
            attention.o_proj.weight.copy_(attention.o_proj.weight[:, rows(query)])


def relabelled(heads: Sequence[str], num_heads: int, num_kv_heads: int) -> list[str]:
    """Head names after ``relabel_heads``."""
    return [str(Head(h.layer, relabel_slot(h.head, num_heads, num_kv_heads))) for h in HeadSet(heads)]


def _output_projections(model) -> list[torch.nn.Module]:
    return [layer.self_attn.o_proj for layer in model.model.language_model.layers]


@contextlib.contextmanager
def head_multipliers(model, multipliers: torch.Tensor | None) -> Iterator[None]:
    """Multiply each head's slice of every output projection's INPUT by ``multipliers`` ([layers, heads],
    or [layers, batch, heads] per row) with plain forward pre-hooks; 0 is the library's zero ablation."""
    if multipliers is None:
        yield
        return
    config = model.config.get_text_config()
    heads, head_dim = config.num_attention_heads, config.head_dim
    handles = []
    for layer, projection in enumerate(_output_projections(model)):
        scale = multipliers[layer]

        def hook(module, args, scale=scale):
            hidden = args[0]
            view = hidden.unflatten(-1, (heads, head_dim))  # [batch, seq, heads, head_dim]
            factor = scale.to(hidden.dtype)
            factor = factor[:, None, :, None] if factor.dim() == 2 else factor[:, None]  # per row / shared
            return ((view * factor).flatten(-2), *args[1:])

        handles.append(projection.register_forward_pre_hook(hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def dropout_multipliers(batch: int, roles: torch.Tensor, p: float, *, layers: tuple[int, ...] = (),
                        layer_p: float = 0.0) -> torch.Tensor | None:
    """[layers, batch, heads]: each head except the planted ones kept with probability ``1 - p`` per row,
    drawn from torch's global generator (saved in the trainer state, so resume stays bit-exact).

    ``layers`` (empty: all) restricts the dropout to those layers; ``layer_p`` also zeroes each of them WHOLE
    (every head) with that probability per row, so the other layers must be able to do its job: toy C's layers
    that hold toy A's heads, dropped whole, make the inserted layers learn jobs of their own (issue 31). The
    draws of ``p`` alone are unchanged by this, so older runs replay exactly."""
    if p <= 0 and layer_p <= 0:
        return None
    depth, heads = roles.shape
    keep = (torch.rand(depth, batch, heads) >= p).float()
    if layer_p > 0:
        keep *= (torch.rand(depth, batch, 1) >= layer_p).float()
    if layers:
        spared = torch.ones(depth, dtype=torch.bool)
        spared[list(layers)] = False
        keep[spared] = 1.0
    keep[(roles == 1)[:, None, :].expand(depth, batch, heads)] = 1.0
    return keep


def mask_multipliers(model, heads: HeadSet) -> torch.Tensor:
    config = model.config.get_text_config()
    multipliers = torch.ones(config.num_hidden_layers, config.num_attention_heads)
    for head in heads:
        multipliers[head.layer, head.head] = 0.0
    return multipliers


# ---------------------------------------------------------------------------------------------- measurement
@torch.no_grad()
def attention_shares(model, processor, samples: Sequence, name: str = "planted",
                     batch_size: int = 32) -> dict[str, np.ndarray]:
    """Per head ([layers, heads]) on teacher-forced gold answers, with eager attention: the mean share of the
    answer rows' attention inside the referent's cells (``referent``), on the other objects' cells
    (``distractors``), on all visual tokens (``answer_visual``), and the mean visual mass over every text
    row after the image (``text_visual``)."""
    from toy_training.configs import format_box_answer

    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    model.eval()
    sums: dict[str, torch.Tensor] = {}
    counts = {"answer": 0.0, "text": 0.0}
    try:
        for start in range(0, len(samples), batch_size):
            chunk = samples[start:start + batch_size]
            inputs = encode_supervised(processor, [s.image for s in chunk], grounding_prompts(processor, name, chunk),
                                       [format_box_answer(name, s.expression, s.box, s.image.size) for s in chunk])
            targets = attention_targets(inputs["input_ids"], inputs["labels"], chunk, model.config.image_token_id)
            outputs = model(**{k: v for k, v in inputs.items() if k != "labels"}, output_attentions=True)
            per_layer = {key: [] for key in ("referent", "distractors", "answer_visual", "text_visual")}
            for attention in outputs.attentions:
                weights = attention.float()
                for key, keys_mask, rows in (("referent", targets.referent, targets.answer_rows),
                                             ("distractors", targets.distractors, targets.answer_rows),
                                             ("answer_visual", targets.visual, targets.answer_rows),
                                             ("text_visual", targets.visual, targets.text_rows)):
                    mass = (weights * keys_mask[:, None, None, :]).sum(-1)  # [batch, heads, seq]
                    per_layer[key].append((mass * rows[:, None, :]).sum((0, 2)))
            for key, values in per_layer.items():
                sums[key] = sums.get(key, 0) + torch.stack(values)
            counts["answer"] += float(targets.answer_rows.sum())
            counts["text"] += float(targets.text_rows.sum())
    finally:
        model.set_attn_implementation(previous)
    return {key: (value / counts["text" if key == "text_visual" else "answer"]).numpy() for key, value in sums.items()}


def random_rest_sets(geometry_layers: int, geometry_heads: int, exclude: HeadSet, size: int, count: int,
                     seed: int = 0) -> list[HeadSet]:
    """``count`` seeded random sets of ``size`` heads drawn from the heads outside ``exclude``."""
    rest = [Head(layer, head) for layer in range(geometry_layers) for head in range(geometry_heads)
            if Head(layer, head) not in exclude]
    rng = np.random.default_rng(seed)
    return [HeadSet(rest[i] for i in sorted(rng.choice(len(rest), size, replace=False))) for _ in range(count)]


def masked_accuracy(model, processor, samples: Sequence, heads: HeadSet, name: str = "planted") -> float:
    """Level-1 grounding accuracy (IoU >= 0.5, greedy generate) with ``heads`` zeroed by plain hooks."""
    from vrh_interp.core.description.boxes import Box, iou

    with head_multipliers(model, mask_multipliers(model, heads) if len(heads) else None):
        predictions = [box for _, box in predict_boxes(model, processor, name, samples)]
    return float(np.mean([p is not None and iou(p, Box(*s.box)) >= 0.5 for s, p in zip(samples, predictions)]))


def measure(model, processor, planted: HeadSet, decoys: HeadSet, *, name: str = "planted", n_scenes: int = 100,
            random_sets: int = 20, offset: int = 0, seed: int = 0) -> dict:
    """The organism's properties on level-1 eval scenes ``offset..offset+n_scenes-1`` (see module docstring)."""
    samples = held_out_samples(n_scenes, 1, offset)
    config = model.config.get_text_config()
    layers, heads = config.num_hidden_layers, config.num_attention_heads
    shares = attention_shares(model, processor, samples, name)
    special = HeadSet(list(planted) + list(decoys))
    rest_mask = np.ones((layers, heads), dtype=bool)
    for head in special:
        rest_mask[head.layer, head.head] = False
    predictions = [box for _, box in predict_boxes(model, processor, name, samples)]
    baseline = grounding_metrics(samples, predictions)
    randoms = random_rest_sets(layers, heads, special, len(planted), random_sets, seed)
    random_accuracies = [masked_accuracy(model, processor, samples, s, name) for s in randoms]
    single_rest = {str(one[0]): masked_accuracy(model, processor, samples, one, name)
                   for one in random_rest_sets(layers, heads, special, 1, 8, seed + 1)}
    per_head = {f"L{layer}H{head}": {key: float(value[layer, head]) for key, value in shares.items()}
                for layer in range(layers) for head in range(heads)}

    def best_rest(key: str) -> float:
        return float(shares[key][rest_mask].max())

    return {
        "scenes": [offset, offset + n_scenes - 1], "level": 1, "n": len(samples),
        "accuracy": baseline["accuracy"],
        "baseline_query_ignoring_ceiling": baseline["baseline_query_ignoring_ceiling"],
        "masked_planted_accuracy": masked_accuracy(model, processor, samples, planted, name),
        "masked_decoys_accuracy": masked_accuracy(model, processor, samples, decoys, name),
        "random_sets": [s.to_list() for s in randoms],
        "masked_random_accuracies": random_accuracies,
        "masked_random_mean": float(np.mean(random_accuracies)),
        "masked_random_min": float(np.min(random_accuracies)),
        "masked_single_rest_heads": single_rest,
        "planted_referent_share": {str(h): per_head[str(h)]["referent"] for h in planted},
        "decoy_distractor_share": {str(h): per_head[str(h)]["distractors"] for h in decoys},
        "decoy_referent_share": {str(h): per_head[str(h)]["referent"] for h in decoys},
        "rest_max_referent_share": best_rest("referent"),
        "rest_max_text_visual_mass": best_rest("text_visual"),
        "rest_max_answer_visual_mass": best_rest("answer_visual"),
        "per_head": per_head,
    }


def summary_lines(measured: dict) -> list[str]:
    """The measured properties as short sentences (model card, ``--evaluate``)."""
    ceiling = measured["baseline_query_ignoring_ceiling"]
    return [
        f"level-1 accuracy {measured['accuracy']:.3f} (query-ignoring ceiling {ceiling:.3f}), n={measured['n']}",
        "planted heads' referent share: "
        + ", ".join(f"{h} {v:.2f}" for h, v in measured["planted_referent_share"].items())
        + f"; best other head {measured['rest_max_referent_share']:.3f}",
        "decoys' distractor share: " + ", ".join(f"{h} {v:.2f}" for h, v in measured["decoy_distractor_share"].items()),
        f"largest text->visual attention mass of any other head: {measured['rest_max_text_visual_mass']:.3f} "
        f"(answer rows {measured['rest_max_answer_visual_mass']:.3f})",
        f"masked: planted {measured['masked_planted_accuracy']:.3f}, decoys {measured['masked_decoys_accuracy']:.3f}, "
        f"{len(measured['masked_random_accuracies'])} random sets of the rest mean "
        f"{measured['masked_random_mean']:.3f} "
        f"(min {measured['masked_random_min']:.3f})",
    ]


def write_declaration(folder: Path, planted: Sequence[str], decoys: Sequence[str],
                      measured: dict | None = None) -> None:
    data = {"planted": list(planted), "decoys": list(decoys)}
    if measured is not None:
        data["measured"] = {k: v for k, v in measured.items() if k != "per_head"}
        data["measured_per_head"] = measured["per_head"]
    (folder / PLANTED_FILE).write_text(json.dumps(data, indent=1))

