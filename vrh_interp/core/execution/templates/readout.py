"""Attention readout: probabilities from chosen query rows to all keys, without the full S x S map.

Two implementations, equal to 1e-5 in fp32 (tested on every family):

* ``eager_attention_rows``: the reference. Runs the model with eager attention and
  ``output_attentions=True`` and slices rows, paying the [heads, S, S] cost per layer.
* ``AttentionRowsReadout``: the default. The model keeps its fused (sdpa) attention; at each layer the
  template reads the inputs of the attention-function call inside the attention module (nnsight
  ``.source``): post-rotary queries, the keys (after the KV-cache update, so during generation every
  cached position), the mask the model really uses, the scaling and any logit soft-capping (Gemma 2). It then
  recomputes softmax(q_rows K^T * scaling [+ mask]) for the requested rows only, GQA keys repeated per
  query group. Because those inputs are exactly what attention consumes, family details (q/k norms,
  mRoPE, Gemma's query_pre_attn_scalar, sliding windows, non-causal image blocks encoded in the mask)
  need no per-family code. Memory is O(rows x S) per layer instead of O(S^2). A generation step on a
  sliding-window layer whose KV cache has dropped positions is refused (its keys are no longer positions).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import torch

from vrh_interp.core.description.heads import Head
from vrh_interp.core.execution.templates import module_at


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


def attention_call_inputs(model: Any, path: str, call_label: str) -> tuple[Any, Any, Any, Any, float, dict]:
    """``(query, key, value, attention_mask, scaling, kwargs)`` of the attention-function call (``call_label``,
    ``attention_call_label``) inside the attention module at ``path``, in a trace: what every template that
    recomputes some heads' attention reads (scaling defaults to ``head_dim ** -0.5``, as HF's eager attention)."""
    args, kwargs = getattr(module_at(model, path).source, call_label).inputs
    query, key, value = args[1], args[2], args[3]
    mask = args[4] if len(args) > 4 else kwargs.get("attention_mask")
    scaling = kwargs.get("scaling")
    return query, key, value, mask, query.shape[-1] ** -0.5 if scaling is None else scaling, kwargs


def _row_index(rows: torch.Tensor, batch: int, q_len: int, device: Any) -> torch.Tensor:
    """``rows`` ([r] or [b, r], negative counting from the end) as non-negative ``[b, r]`` query indices."""
    row_index = rows.to(device).long()
    row_index = torch.where(row_index < 0, row_index + q_len, row_index)
    if row_index.dim() == 1:
        row_index = row_index.unsqueeze(0).expand(batch, -1)
    return row_index


def _row_scores(q_rows: torch.Tensor, key: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``q_rows @ key^T`` in float32, ``[b, H, r, k]``, GQA keys shared by each query group.

    Bit-identical to repeating the keys per query head (``repeat_interleave``) and one matmul, which it
    replaces: for a single row (a decode step) one matmul per position in the query group reads the
    shared keys in place (no [b, H, k, D] copy of the KV cache); for several rows the repeated keys are
    kept, since multiplying a group's rows in one [g*r, D] block changes the BLAS kernel, hence the bits.
    """
    batch, num_heads, r, _ = q_rows.shape
    num_kv, k_len = key.shape[1], key.shape[2]
    group = num_heads // num_kv
    q = q_rows.float()
    if group > 1 and r > 1:
        return torch.matmul(q, key.repeat_interleave(group, dim=1).float().transpose(-1, -2), out=out)
    keys_t = key.float().transpose(-1, -2)
    if group == 1:
        return torch.matmul(q, keys_t, out=out)
    parts = [torch.matmul(q[:, j::group], keys_t) for j in range(group)]  # each [b, KV, 1, k]
    if out is None:
        return torch.stack(parts, dim=2).view(batch, num_heads, r, k_len)
    torch.stack(parts, dim=2, out=out.view(batch, num_kv, group, r, k_len))
    return out


def _allowed_rows(attention_mask: torch.Tensor | None, row_index: torch.Tensor, q_len: int, k_len: int, *,
                  causal_when_unmasked: bool = True) -> torch.Tensor | None:
    """The mask rows of ``row_index`` ([b, r]) as ``[b, 1, r, k]``: boolean (True = attend) or additive float;
    None when nothing is masked (one query without a mask)."""
    batch = row_index.shape[0]
    if attention_mask is not None:
        mask = attention_mask[..., -k_len:].expand(batch, -1, q_len, k_len)[:, :1]
        return torch.gather(mask, 2, row_index[:, None, :, None].expand(batch, 1, row_index.shape[1], k_len))
    if causal_when_unmasked and q_len > 1:
        key_pos = torch.arange(k_len, device=row_index.device)
        query_pos = row_index + (k_len - q_len)
        return key_pos[None, None, None, :] <= query_pos[:, None, :, None]
    return None


def _masked_scores_(scores: torch.Tensor, allowed: torch.Tensor | None, *, scaling: float,
                    softcap: float | None) -> torch.Tensor:
    """Scale, soft-cap and mask raw ``scores`` in place (the order and values of ``softmax_rows``)."""
    scores.mul_(scaling)
    if softcap:
        scores.div_(softcap).tanh_().mul_(softcap)
    if allowed is not None:
        if allowed.dtype == torch.bool:
            scores.masked_fill_(~allowed, float("-inf"))
        else:
            scores.add_(allowed.float())
    return scores


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
    k_len = key.shape[2]
    row_index = _row_index(rows, batch, q_len, query.device)
    q_rows = torch.gather(query, 2, row_index[:, None, :, None].expand(batch, num_heads, row_index.shape[1], head_dim))
    allowed = _allowed_rows(attention_mask, row_index, q_len, k_len, causal_when_unmasked=causal_when_unmasked)
    scores = _masked_scores_(_row_scores(q_rows, key), allowed, scaling=scaling, softcap=softcap)
    probs = torch.softmax(scores, dim=-1)
    # a fully masked row (a left-padding query) attends nowhere: 0, not NaN
    return torch.nan_to_num_(probs, nan=0.0)


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

    def call_inputs(self, model: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor, Any, float, float | None]:
        """``(query, key, attention_mask, scaling, softcap)`` of ``layer``'s attention-function call."""
        query, key, _, mask, scaling, kwargs = attention_call_inputs(model, self.attention_paths[layer],
                                                                      self.call_label)
        window = kwargs.get("sliding_window")
        if window and query.shape[2] == 1 and key.shape[2] >= window:
            raise ReadoutUnavailableError(
                f"layer {layer} attends through a sliding window of {window} keys and this generation step sees only "
                f"the {key.shape[2]} most recent (the KV cache drops older positions), so key indices are no longer "
                "sequence positions. Read only full-attention layers, keep prompt + answer shorter than the window, or "
                "read a teacher-forced forward (one call over the whole sequence, e.g. output_source='teacher_forced')."
            )
        return query, key, mask, scaling, kwargs.get("softcap")

    def rows_for(self, query: torch.Tensor) -> torch.Tensor:
        """The rows read from a call with these queries: ``prefill_rows`` (several queries) or ``decode_rows``."""
        return self.prefill_rows if query.shape[2] > 1 else self.decode_rows

    def at_attention_call(self, model: Any, layer: int) -> torch.Tensor:
        query, key, mask, scaling, softcap = self.call_inputs(model, layer)
        probs = softmax_rows(query, key, mask, self.rows_for(query), scaling=scaling, softcap=softcap)
        if self.heads_by_layer is not None:
            probs = probs[:, list(self.heads_by_layer[layer])]
        return probs

    def at_output_projection(self, model: Any, layer: int) -> None:
        return None

    def head_value(self, value: torch.Tensor, head: Head) -> torch.Tensor:
        """Head ``head``'s pattern in this template's value at its layer: ``[batch, rows, keys]``."""
        if self.heads_by_layer is None:
            return value[:, head.head]
        chosen = tuple(self.heads_by_layer.get(head.layer, ()))
        if head.head not in chosen:
            raise KeyError(f"{head}: this readout reads heads {list(chosen)} of layer {head.layer}")
        return value[:, chosen.index(head.head)]

    def head_names(self, values: Mapping[int, torch.Tensor]) -> list[Head]:
        """The heads of ``values`` (``{layer: value}``), layer by layer."""
        return [Head(layer, h) for layer, value in sorted(values.items())
                for h in (self.heads_by_layer[layer] if self.heads_by_layer is not None else range(value.shape[1]))]


def attention_implementations(config: Any) -> Any:
    """The attention implementation of ``config`` and of its sub-configs, nested, in ``set_attn_implementation``'s
    dict form. Restoring a composite model from its top-level string alone would ask every sub-model for that
    implementation, which fails where one has none: PaliGemma 2 runs sdpa but its Gemma 2 backbone only eager
    (sdpa cannot soft-cap attention logits)."""
    subs = {key: attention_implementations(sub) for key in config.sub_configs
            if (sub := getattr(config, key, None)) is not None}
    return {"": config._attn_implementation, **subs} if subs else config._attn_implementation


@contextmanager
def eager_attention(model: Any) -> Iterator[None]:
    """Temporarily switch a HF model to eager attention (each sub-model's own restored afterwards, also on error)."""
    previous = attention_implementations(model.config)
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


CPU_STACK_BYTES = 1 << 20
"""On CPU, layers whose attention scores take at most this many bytes together (1 MiB) are reduced in one
layer-stacked pass: a generation step's one-row scores of every layer usually fit, so a step runs one reduction
instead of one per layer, while a prompt forward's many rows fill it in a layer or two. The reductions are
memory-bound, so on CPU cache-sized chunks beat one large stack."""

ACCELERATOR_STACK_BYTES = 1 << 28
"""On an accelerator, where each op costs a kernel launch, layers are stacked up to 256 MiB of scores."""

SLICE_BYTES = 1 << 20
"""On CPU, scores of more than twice this many bytes (a prompt forward's rows) are reduced in slices of samples of
about this size, which stay in cache through the softmax and the reductions (toy A's prompt-forward readout:
24 ms instead of 40 ms on one thread)."""


@dataclass(frozen=True)
class RegionAttentionReadout:
    """Readout reduced in the trace to what head scoring needs, per row: ``[batch, heads, rows, 4]``.

    The four numbers per (row, head) are: attention mass on the region's keys, attention mass on all
    visual keys, 1.0 if the most-attended key (argmax over every key the row can see) lies in the
    region, and 1.0 if the most-attended PROMPT key other than the last (argmax over keys
    ``0 .. prompt_len - 2``: OCR Heads' code excludes the generated tokens and the last prompt token)
    lies in the region. ``region_mask`` / ``visual_mask`` are ``[batch, prompt_len]`` booleans over prompt
    positions (their width IS the prompt length); keys added during generation are text, never visual. With
    ``last_row_map``, at the prompt forward the last row's attention over all keys is also returned (for
    spatial-entropy scores). Only these reductions leave the trace: no [rows x S] map is kept, which also keeps
    remote results small.

    ``stack_layers=True`` (what scoring uses) vectorises over layers: at each layer only that layer's raw
    scores are computed (the requested query rows times the keys, written into one buffer), and scaling,
    masking, the softmax and the four reductions run once per chunk of consecutive layers, over all its
    layers and heads. A chunk holds as many layers as fit ``max_stack_bytes`` (default: ``CPU_STACK_BYTES`` on
    CPU, ``ACCELERATOR_STACK_BYTES`` elsewhere): at a generation step usually every layer, so the step runs one
    reduction (a few kernel launches) instead of one per layer. The value
    appears at the last layer of each chunk, stacked ``[layers_in_chunk, batch, heads, rows, 4]`` (with
    ``last_row_map``: ``(stats, [layers_in_chunk, batch, heads, keys])``); other layers give None. Values are
    bit-identical to the per-layer mode. Between the layers of one forward the template holds that forward's
    scores (``_pending``, emptied after its last layer) and keeps its padded key masks (``_masks``).
    """

    rows_readout: AttentionRowsReadout
    region_mask: torch.Tensor
    visual_mask: torch.Tensor
    last_row_map: bool = False
    stack_layers: bool = False
    max_stack_bytes: int | None = None
    _pending: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _masks: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.stack_layers and self.rows_readout.heads_by_layer is not None:
            raise ValueError("stack_layers reads every head of every layer: use a rows readout without heads")

    def layers(self) -> Sequence[int]:
        return self.rows_readout.layers()

    def at_attention_call(self, model: Any, layer: int) -> Any:
        if self.stack_layers:
            return self._stacked_at(model, layer)
        probs = self.rows_readout.at_attention_call(model, layer)  # [b, H, r, k]
        stats = self.reduce(probs)
        if self.last_row_map and probs.shape[-1] == self.region_mask.shape[1]:
            return stats, probs[:, :, -1].clone()
        return stats

    def _check_keys(self, keys: int) -> None:
        if keys < self.region_mask.shape[1]:
            raise ReadoutUnavailableError(
                f"the attention call saw {keys} keys but the prompt has {self.region_mask.shape[1]}: a sliding-window "
                "KV cache dropped early positions, so key indices no longer match prompt positions. Use a prompt "
                "shorter than the window, or score with output_source='teacher_forced' (one full forward)."
            )

    def reduce(self, probs: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
        """``[..., batch, heads, rows, keys]`` probabilities -> ``[..., batch, heads, rows, 4]`` statistics (of the
        batch rows ``rows`` of the masks, when ``probs`` holds only those)."""
        keys = probs.shape[-1]
        self._check_keys(keys)
        region, visual, outside, region_bool, outside_prompt = (m[rows] for m in self._key_masks(keys, probs.device))
        in_region = probs * region[:, None, None, :]
        masses = [in_region.sum(-1), (probs * visual[:, None, None, :]).sum(-1)]  # region and visual mass
        best_in = in_region.amax(-1)
        best_out = (probs * outside[:, None, None, :]).amax(-1)  # the largest value outside the region
        hit = _argmax_in_region(probs, best_in, best_out, region_bool)
        prompt = self.region_mask.shape[1] - 1  # keys 0 .. prompt_len - 2
        if prompt < 1:
            prompt_hit = torch.zeros_like(hit)
        else:
            if bool(self.region_mask[:, -1].any()):  # a region key at the last prompt position: not a candidate
                best_in = in_region[..., :prompt].amax(-1)
            best_prompt_out = (probs * outside_prompt[:, None, None, :]).amax(-1)
            prompt_hit = _argmax_in_region(probs[..., :prompt], best_in, best_prompt_out, region_bool[:, :prompt])
        return torch.stack([*masses, hit, prompt_hit], dim=-1)

    def _key_masks(self, keys: int, device: Any) -> tuple[torch.Tensor, ...]:
        """Region, visual and not-region key masks ``[batch, keys]`` as 0/1 floats (a product with them equals
        the product with the booleans, and is faster), the region as booleans, and the not-region keys among
        prompt keys ``0 .. prompt_len - 2`` as 0/1 floats, on ``device``: views of masks padded once for many
        generation steps (kept in ``_masks``, by device)."""
        cached = self._masks.get(str(device))
        if cached is None or cached[0].shape[-1] < keys:
            width = max(keys, 2 * self.region_mask.shape[1])
            region = _pad_keys(self.region_mask, width).to(device)
            visual = _pad_keys(self.visual_mask, width).to(device)
            early = torch.arange(width, device=device) < self.region_mask.shape[1] - 1
            cached = (region.float(), visual.float(), (~region).float(), region, (~region & early).float())
            self._masks[str(device)] = cached
        return tuple(m[:, :keys] for m in cached)

    def _stacked_at(self, model: Any, layer: int) -> Any:
        query, key, mask, scaling, softcap = self.rows_readout.call_inputs(model, layer)
        layers = sorted(self.layers())
        pending = self._pending
        if layer == layers[0]:
            pending.clear()  # a new forward (also after an interrupted one)
        self._check_keys(key.shape[2])
        batch, num_heads, q_len, head_dim = query.shape
        k_len = key.shape[2]
        # the rows' indices and mask rows are the same at every layer sharing the mask tensor: computed once
        cache = pending.setdefault("allowed", [])
        for which, (cached_mask, cached_shape, row_index, allowed) in enumerate(cache):
            if cached_mask is mask and cached_shape == (batch, q_len, k_len):
                break
        else:
            which = len(cache)
            row_index = _row_index(self.rows_readout.rows_for(query), batch, q_len, query.device)
            allowed = _allowed_rows(mask, row_index, q_len, k_len)
            cache.append((mask, (batch, q_len, k_len), row_index, allowed))  # holds mask: its id stays unique
        rows = row_index.shape[1]
        if q_len == 1 and rows == 1:  # a generation step: the one query is the row
            q_rows = query
        else:
            q_rows = torch.gather(query, 2, row_index[:, None, :, None].expand(batch, num_heads, rows, head_dim))
        shape = (batch, num_heads, rows, k_len)
        filled = pending.setdefault("layers", [])
        if not filled:  # a new chunk: one buffer for as many layers as the budget allows
            per_layer = 4 * math.prod(shape)
            budget = self.max_stack_bytes
            if budget is None:
                budget = CPU_STACK_BYTES if query.device.type == "cpu" else ACCELERATOR_STACK_BYTES
            size = max(1, min(len(layers) - layers.index(layer), budget // max(1, per_layer)))
            pending["buffer"] = torch.empty((size, *shape), dtype=torch.float32, device=query.device)
        buffer = pending["buffer"]
        fits = not pending.get("extra") and tuple(buffer.shape[1:]) == shape and buffer.device == query.device
        slot = buffer[len(filled)] if fits else None
        pending["extra"] = not fits  # a layer of another shape (a sliding-window cache): stacked at the flush
        # raw scores only: scaling, soft-capping and the mask are applied at the flush, once for all layers
        filled.append((_row_scores(q_rows, key, out=slot), (float(scaling), softcap, which)))
        if layer == layers[-1]:
            value = self._flush()
            pending.clear()  # nothing of this forward stays referenced (its masks can be large)
            return value
        if len(filled) >= buffer.shape[0]:
            return self._flush()
        return None

    def _flush(self) -> Any:
        pending = self._pending
        filled, buffer, extra = pending.pop("layers"), pending.pop("buffer"), pending.pop("extra")
        if not extra:
            groups = [(list(range(len(filled))), buffer[: len(filled)])]
        else:  # layers of different key lengths (sliding-window caches) or devices: one stack for each
            by_keys: dict[tuple[int, Any], list[int]] = {}
            for i, (scores, _) in enumerate(filled):
                by_keys.setdefault((scores.shape[-1], scores.device), []).append(i)
            groups = [(idx, torch.stack([filled[i][0] for i in idx])) for idx in by_keys.values()]
        allowed = [entry[3] for entry in pending["allowed"]]
        stats_parts, maps_parts = [], []
        for idx, scores in groups:
            how = [filled[i][1] for i in idx]  # (scaling, softcap, mask) per layer: usually one for all
            # on CPU the reductions are memory-bound: samples in slices whose scores stay in cache (rows are
            # independent, so the values do not change)
            batch = scores.shape[1]
            step = batch
            if scores.device.type == "cpu" and 4 * scores.numel() > 2 * SLICE_BYTES:
                step = max(1, SLICE_BYTES // (4 * scores[:, 0].numel()))
            pieces = [self._reduce_scores(scores[:, start: start + step], how, allowed, slice(start, start + step))
                      for start in range(0, batch, step)]
            stats_parts.append((idx, _cat([piece[0] for piece in pieces], dim=1)))
            if pieces[0][1] is not None:
                maps_parts.append((idx, _cat([piece[1] for piece in pieces], dim=1)))
        stats = _in_layer_order(stats_parts, len(filled))
        if maps_parts and sum(len(idx) for idx, _ in maps_parts) == len(filled):
            return stats, _in_layer_order(maps_parts, len(filled))
        return stats

    def _reduce_scores(self, scores: torch.Tensor, how: Sequence[tuple[float, float | None, int]],
                       allowed: Sequence[torch.Tensor | None], rows: slice) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Raw scores ``[layers, batch_slice, H, r, k]`` of the samples ``rows`` -> their statistics (and the last
        row's map where wanted), scaling, soft-capping and masking them in place first."""
        def mask(which: int) -> torch.Tensor | None:
            return None if allowed[which] is None else allowed[which][rows]

        if all(h == how[0] for h in how):
            _masked_scores_(scores, mask(how[0][2]), scaling=how[0][0], softcap=how[0][1])
        else:
            for j, (scaling, softcap, which) in enumerate(how):
                _masked_scores_(scores[j], mask(which), scaling=scaling, softcap=softcap)
        probs = torch.softmax(scores, dim=-1)
        torch.nan_to_num_(probs, nan=0.0)  # a fully masked row (a left-padding query) attends nowhere
        maps = None
        if self.last_row_map and probs.shape[-1] == self.region_mask.shape[1]:
            maps = probs[:, :, :, -1].clone()
        return self.reduce(probs, rows), maps

    def at_output_projection(self, model: Any, layer: int) -> None:
        return None


def _cat(parts: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(list(parts), dim=dim)


def _in_layer_order(parts: Sequence[tuple[list[int], torch.Tensor]], count: int) -> torch.Tensor:
    """Stacked per-group values ``[(layer indices, [len(idx), ...])]`` as one ``[count, ...]`` tensor."""
    if len(parts) == 1:
        return parts[0][1]
    first = parts[0][1]
    out = first.new_empty((count, *first.shape[1:]))
    for idx, value in parts:
        out[torch.tensor(idx, device=out.device)] = value.to(out.device)
    return out


def _argmax_in_region(probs: torch.Tensor, best_in: torch.Tensor, best_out: torch.Tensor,
                      region: torch.Tensor) -> torch.Tensor:
    """1.0 where ``probs.argmax(-1)`` (the FIRST most-attended key) lies in ``region``, else 0.0.

    ``probs`` [..., b, H, r, k] (non-negative, no NaN), ``region`` [b, k]; ``best_in`` / ``best_out`` the rows'
    largest values in and outside the region. Equal to gathering ``region`` at the argmax, from two max
    reductions (vectorised, unlike argmax): the row's largest region value beats every other key's, or not;
    only rows where the two tie (e.g. all zero) need the first index, and get it from argmax.
    """
    hit = best_in > best_out
    tie = best_in == best_out
    if bool(tie.any()):
        index = tie.nonzero(as_tuple=True)
        top = probs[index].argmax(-1)
        hit[index] = region[index[-3]].gather(-1, top[:, None]).squeeze(-1)
    return hit.float()


def _pad_keys(mask: torch.Tensor, keys: int) -> torch.Tensor:
    """A [batch, prompt_len] key mask extended (False) or cut to ``keys`` columns."""
    if mask.shape[1] >= keys:
        return mask[:, :keys]
    pad = torch.zeros(mask.shape[0], keys - mask.shape[1], dtype=mask.dtype, device=mask.device)
    return torch.cat([mask, pad], dim=1)
