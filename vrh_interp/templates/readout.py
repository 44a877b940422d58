"""Attention readout: probabilities from chosen query rows to all keys, without the full S x S map.

Two implementations, equal to 1e-5 in fp32 (tested on every family):

* ``eager_attention_rows``: the reference. Runs the model with eager attention and
  ``output_attentions=True`` and slices rows, paying the [heads, S, S] cost per layer.
* ``AttentionRowsReadout``: the default. The model keeps its fused (sdpa) attention; at each layer the
  template reads the inputs of the attention-function call inside the attention module (nnsight
  ``.source``): post-rotary queries, the keys (after the KV-cache update, so during generation every
  cached position), the mask the model really uses, the scaling and any logit soft-capping. It then
  recomputes softmax(q_rows K^T * scaling [+ mask]) for the requested rows only, GQA keys repeated per
  query group. Because those inputs are exactly what attention consumes, family details (q/k norms,
  mRoPE, Gemma's query_pre_attn_scalar, sliding windows, non-causal image blocks encoded in the mask)
  need no per-family code. Memory is O(rows x S) per layer instead of O(S^2).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import torch

from vrh_interp.templates import module_at


class ReadoutUnavailableError(RuntimeError):
    """The attention module has no recognisable attention-function call to read from."""


def attention_call_label(source_names: Sequence[str]) -> str:
    """The nnsight ``.source`` label of the attention-function CALL in an attention module's forward.

    HF attention modules bind ``attention_interface = ...get_interface(...)`` (label ``_0``) and then call
    it (label ``_1``); the last ``attention_interface_N`` label is the call.
    """
    labels = [n for n in source_names if n.startswith("attention_interface_")]
    if not labels:
        raise ReadoutUnavailableError(
            "this attention module's forward has no `attention_interface(...)` call to read q/k from "
            f"(ops: {', '.join(source_names)}); use eager_attention_rows for this model"
        )
    return max(labels, key=lambda n: int(n.rsplit("_", 1)[1]))


def softmax_rows(
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    rows: torch.Tensor,
    *,
    scaling: float,
    softcap: float | None = None,
    causal_when_unmasked: bool = True,
) -> torch.Tensor:
    """Attention probabilities of the query ``rows`` over all keys, ``[batch, heads, len(rows), keys]``.

    ``query`` [b, H, q, D] and ``key`` [b, KV, k, D] as the attention function receives them; ``rows``
    indexes the q axis, shape [r] (same rows for every batch item) or [b, r]. ``attention_mask`` is
    None (sdpa's implicit causal mask when q > 1), boolean (True = attend) or additive float, with shape
    broadcastable to [b, 1, q, k]. Computed in float32.
    """
    batch, num_heads, q_len, head_dim = query.shape
    num_kv, k_len = key.shape[1], key.shape[2]
    row_index = rows.to(query.device).long()
    row_index = torch.where(row_index < 0, row_index + q_len, row_index)
    if row_index.dim() == 1:
        row_index = row_index.unsqueeze(0).expand(batch, -1)
    q_rows = torch.gather(query, 2, row_index[:, None, :, None].expand(batch, num_heads, row_index.shape[1], head_dim))
    keys = key.repeat_interleave(num_heads // num_kv, dim=1) if num_kv != num_heads else key
    scores = torch.matmul(q_rows.float(), keys.float().transpose(-1, -2)) * scaling
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        mask = attention_mask[..., -k_len:].expand(batch, -1, q_len, k_len)[:, :1]
        mask_rows = torch.gather(mask, 2, row_index[:, None, :, None].expand(batch, 1, row_index.shape[1], k_len))
        if mask_rows.dtype == torch.bool:
            scores = scores.masked_fill(~mask_rows, float("-inf"))
        else:
            scores = scores + mask_rows.float()
    elif causal_when_unmasked and q_len > 1:
        key_pos = torch.arange(k_len, device=query.device)
        query_pos = row_index + (k_len - q_len)
        scores = scores.masked_fill(key_pos[None, None, None, :] > query_pos[:, None, :, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    # a fully masked row (a left-padding query) attends nowhere: 0, not NaN
    return torch.nan_to_num(probs, nan=0.0)


@dataclass(frozen=True)
class AttentionRowsReadout:
    """Memory-efficient readout template: returns ``[batch, heads, rows, keys]`` per layer.

    ``prefill_rows`` index the query axis of a call with more than one query (the prompt forward;
    negative indices count from the end, so ``-1`` is the last prompt token); ``decode_rows`` those of
    a one-token generation step (``-1``: the token just fed in). With ``heads_by_layer`` only those
    heads are kept.
    """

    attention_paths: Mapping[int, str]
    call_label: str
    prefill_rows: torch.Tensor
    decode_rows: torch.Tensor = field(default_factory=lambda: torch.tensor([-1]))
    heads_by_layer: Mapping[int, tuple[int, ...]] | None = None

    @classmethod
    def build(cls, attention_paths: Mapping[int, str], call_label: str,
              prefill_rows: torch.Tensor | Sequence[int], *,
              heads_by_layer: Mapping[int, tuple[int, ...]] | None = None) -> "AttentionRowsReadout":
        rows = torch.as_tensor(prefill_rows, dtype=torch.long)
        return cls(dict(attention_paths), call_label, rows, torch.tensor([-1]), heads_by_layer)

    def layers(self) -> Sequence[int]:
        return tuple(self.attention_paths)

    def at_attention_call(self, model: Any, layer: int) -> torch.Tensor:
        attention = module_at(model, self.attention_paths[layer])
        args, kwargs = getattr(attention.source, self.call_label).inputs
        query, key = args[1], args[2]
        mask = args[4] if len(args) > 4 else kwargs.get("attention_mask")
        scaling = kwargs.get("scaling")
        if scaling is None:
            scaling = query.shape[-1] ** -0.5
        rows = self.prefill_rows if query.shape[2] > 1 else self.decode_rows
        probs = softmax_rows(query, key, mask, rows, scaling=scaling, softcap=kwargs.get("softcap"))
        if self.heads_by_layer is not None:
            probs = probs[:, list(self.heads_by_layer[layer])]
        return probs

    def at_output_projection(self, model: Any, layer: int) -> None:
        return None


@contextmanager
def eager_attention(model: Any) -> Iterator[None]:
    """Temporarily switch a HF model to eager attention (restored afterwards, also on error)."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


def eager_attention_rows(model: Any, encoding: Mapping[str, Any], rows: torch.Tensor | Sequence[int],
                         layers: Sequence[int] | None = None) -> torch.Tensor:
    """Reference readout from eager ``output_attentions``: ``[layers, batch, heads, rows, keys]``."""
    rows_tensor = torch.as_tensor(rows, dtype=torch.long)
    with torch.no_grad(), eager_attention(model):
        attentions = model(**encoding, output_attentions=True).attentions
    if not attentions:
        raise ReadoutUnavailableError("the model returned no attention maps even under eager attention")
    chosen = range(len(attentions)) if layers is None else layers
    out = []
    for layer in chosen:
        att = attentions[layer]
        index = rows_tensor.to(att.device)
        if index.dim() == 1:
            out.append(att[:, :, index].float())
        else:
            b, h, _, k = att.shape
            out.append(torch.gather(att, 2, index[:, None, :, None].expand(b, h, index.shape[1], k)).float())
    return torch.stack(out)


@dataclass(frozen=True)
class RegionAttentionReadout:
    """Readout reduced in the trace to what head scoring needs, per row: ``[batch, heads, rows, 3]``.

    The three numbers per (row, head) are: attention mass on the region's keys, attention mass on all
    visual keys, and 1.0 if the most-attended key (argmax over every key the row can see) lies in the
    region. ``region_mask`` / ``visual_mask`` are ``[batch, prompt_len]`` booleans over prompt positions;
    keys added during generation are text, never visual. With ``visual_rows_of`` set to a prefill row
    index, that row's attention over the visual keys is also returned (for spatial-entropy scores).
    Only these reductions leave the trace: no [rows x S] map is kept, which also keeps remote results small.
    """

    rows_readout: AttentionRowsReadout
    region_mask: torch.Tensor
    visual_mask: torch.Tensor
    last_row_map: bool = False

    def layers(self) -> Sequence[int]:
        return self.rows_readout.layers()

    def at_attention_call(self, model: Any, layer: int) -> Any:
        probs = self.rows_readout.at_attention_call(model, layer)  # [b, H, r, k]
        stats = self.reduce(probs)
        if self.last_row_map and probs.shape[-1] == self.region_mask.shape[1]:
            return stats, probs[:, :, -1].clone()
        return stats

    def reduce(self, probs: torch.Tensor) -> torch.Tensor:
        keys = probs.shape[-1]
        if keys < self.region_mask.shape[1]:
            raise ReadoutUnavailableError(
                f"the attention call saw {keys} keys but the prompt has {self.region_mask.shape[1]}: a sliding-window "
                "KV cache dropped early positions, so key indices no longer match prompt positions. Use a prompt "
                "shorter than the window, or score with output_source='teacher_forced' (one full forward)."
            )
        region = _pad_keys(self.region_mask, keys).to(probs.device)
        visual = _pad_keys(self.visual_mask, keys).to(probs.device)
        region_mass = (probs * region[:, None, None, :]).sum(-1)
        visual_mass = (probs * visual[:, None, None, :]).sum(-1)
        top = probs.argmax(dim=-1)
        hit = torch.gather(region[:, None, None, :].expand(-1, probs.shape[1], probs.shape[2], -1), 3,
                           top[..., None]).squeeze(-1).float()
        return torch.stack([region_mass, visual_mass, hit], dim=-1)

    def at_output_projection(self, model: Any, layer: int) -> None:
        return None


def _pad_keys(mask: torch.Tensor, keys: int) -> torch.Tensor:
    """A [batch, prompt_len] key mask extended (False) or cut to ``keys`` columns."""
    if mask.shape[1] >= keys:
        return mask[:, :keys]
    pad = torch.zeros(mask.shape[0], keys - mask.shape[1], dtype=mask.dtype, device=mask.device)
    return torch.cat([mask, pad], dim=1)
