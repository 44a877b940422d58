"""Bring a toy's inert heads into use (toy C's rebuild, issue 31): function-preserving head splits, then training.

Toy C was built by embedding toy A in a 128-head backbone with every new head's output projection at zero
(``planted.embed_donor``); training grew those heads only to a tenth of the donor heads' output norms, so 96 of
128 heads were near-inert. ``revive`` restarts them before more training:

* in a layer that holds live heads (toy A's layers 0, 2, 4, 6), each inert head becomes a copy of a live head
  of the SAME key/value group (same keys and values, the same query weights plus a little noise) and the two
  share the original's output projection half and half: the model's function is unchanged (up to the noise),
  and head dropout during training makes the copies diverge (a copy is dropped while its twin is kept);
* in a layer with no live head (the layers inserted between donor layers), every head's output projection
  is scaled up to half the live heads' median norm, keeping the direction it learnt.

``split_heads`` makes named heads (ones with no job on any task, though of ordinary norm) splits of their key/value
group's largest head the same way; ``share_attention`` gives a whole layer another layer's attention.

A head is inert when its output-projection norm is under ``floor`` (a quarter) of the 90th-percentile head's,
the census rule of ``vrh_interp.evaluation.census``.
"""

from __future__ import annotations

import numpy as np
import torch


def head_norms(model) -> np.ndarray:
    """[layers, heads] Frobenius norm of each head's columns of the output projection."""
    config = model.config.get_text_config()
    heads, head_dim = config.num_attention_heads, config.head_dim
    rows = []
    for layer in model.model.language_model.layers:
        weight = layer.self_attn.o_proj.weight.detach().float()
        rows.append([weight[:, h * head_dim:(h + 1) * head_dim].norm().item() for h in range(heads)])
    return np.array(rows)


@torch.no_grad()
def revive(model, floor: float = 0.25, noise: float = 0.01, seed: int = 0) -> dict:
    """Split live heads into inert slots of their KV group and scale up heads of layers with no live head (module
    doc). Returns what was done: ``{"split": [(layer, live, inert)], "scaled": [(layer, head, factor)]}``."""
    config = model.config.get_text_config()
    heads, head_dim = config.num_attention_heads, config.head_dim
    group = heads // config.num_key_value_heads
    norms = head_norms(model)
    threshold = floor * np.percentile(norms, 90)
    live = norms >= threshold
    target = 0.5 * float(np.median(norms[live]))
    generator = torch.Generator().manual_seed(seed)
    split, scaled = [], []
    for layer, block in enumerate(model.model.language_model.layers):
        attention = block.self_attn
        o = attention.o_proj
        if live[layer].any():
            for start in range(0, heads, group):
                donors = [h for h in range(start, start + group) if live[layer, h]]
                inert = [h for h in range(start, start + group) if not live[layer, h]]
                for donor, slot in zip(donors * len(inert), inert):
                    _split(attention, head_dim, donor, [slot], noise, generator)
                    split.append((layer, donor, slot))
        else:
            for h in range(heads):
                factor = target / max(norms[layer, h], 1e-8)
                o.weight[:, h * head_dim:(h + 1) * head_dim] *= factor
                scaled.append((layer, h, round(float(factor), 3)))
    return {"threshold": float(threshold), "target": target, "split": split, "scaled": scaled}


def _split(attention, head_dim: int, donor: int, slots: list[int], noise: float, generator: torch.Generator) -> None:
    """Each head of ``slots`` becomes a copy of ``donor`` (same KV group: same keys and values; the donor's query
    weights plus ``noise`` of their std) and the donor and its copies share its output projection equally.
    (``revive`` splits one slot at a time, so a donor with several slots keeps 1/2, 1/4, ...: the shipped recipe's
    step, kept as it ran.)"""
    q, o = attention.q_proj, attention.o_proj
    d = slice(donor * head_dim, (donor + 1) * head_dim)
    o.weight[:, d] /= len(slots) + 1
    for slot in slots:
        s = slice(slot * head_dim, (slot + 1) * head_dim)
        q.weight[s] = q.weight[d] + noise * q.weight[d].std() * torch.randn(q.weight[d].shape, generator=generator)
        if q.bias is not None:
            q.bias[s] = q.bias[d]
        o.weight[:, s] = o.weight[:, d]


@torch.no_grad()
def split_heads(model, slots: tuple[tuple[int, int], ...], noise: float = 0.01, seed: int = 0) -> list:
    """Give each ``(layer, head)`` of ``slots`` (a head with no job on any task, though its output norm is
    ordinary) a job: it becomes a split of the head of its key/value group with the largest output norm among those
    not in ``slots`` (``_split``: function-preserving up to ``noise`` and to what the slot did, nothing measurable);
    a donor of several slots shares its output projection equally among them and itself (until 2026-12-04 each
    split halved it again, leaving the donor and its second slot a quarter: inert by norm). Head dropout then makes
    them diverge. Returns the ``(layer, donor, slot)`` triples."""
    config = model.config.get_text_config()
    heads, head_dim = config.num_attention_heads, config.head_dim
    group = heads // config.num_key_value_heads
    norms = head_norms(model)
    taken = {tuple(slot) for slot in slots}
    generator = torch.Generator().manual_seed(seed)
    done = []
    for layer, slot in slots:
        if not (0 <= layer < norms.shape[0] and 0 <= slot < heads):
            raise ValueError(f"no head L{layer}H{slot} in a model of {norms.shape[0]} layers x {heads} heads")
        start = slot - slot % group
        donors = [h for h in range(start, start + group) if (layer, h) not in taken]
        if not donors:
            raise ValueError(f"every head of L{layer}H{slot}'s key/value group is to be split: none can donate")
        done.append((layer, max(donors, key=lambda h: norms[layer, h]), slot))
    for layer, donor in dict.fromkeys((layer, donor) for layer, donor, _ in done):
        _split(model.model.language_model.layers[layer].self_attn, head_dim, donor,
               [slot for at, by, slot in done if (at, by) == (layer, donor)], noise, generator)
    return done


@torch.no_grad()
def share_attention(model, pairs: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    """Each ``(layer, source)`` pair: ``layer`` (near-inert heads) takes ``source``'s attention: its input norm and
    q / k / v / o weights copied from ``source``, and both output projections halved, so the two layers share that
    layer's job (function-preserving up to what the MLPs between them do with half the update arriving a layer
    early or late). The inserted layers 1, 3, 5 take the layer above (``source = layer + 1``); the last layer, with
    none above, the layer below. Head dropout then makes the copies diverge, as ``revive``'s within-layer splits do.
    Returns the pairs done."""
    blocks = model.model.language_model.layers
    done = []
    for layer, source in pairs:
        for index in (layer, source):
            if not 0 <= index < len(blocks):
                raise ValueError(f"no layer {index} in a model of {len(blocks)} layers (0..{len(blocks) - 1})")
        if layer == source:
            raise ValueError(f"layer {layer} cannot share its own attention: name another layer as the source")
        target, donor = blocks[layer], blocks[source]
        target.input_layernorm.load_state_dict(donor.input_layernorm.state_dict())
        target.self_attn.load_state_dict(donor.self_attn.state_dict())
        target.self_attn.o_proj.weight *= 0.5
        donor.self_attn.o_proj.weight *= 0.5
        done.append((layer, source))
    return done
