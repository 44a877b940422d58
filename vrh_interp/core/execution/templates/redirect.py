"""Attention redirection (sufficiency): point chosen heads at a chosen region of the image.

``HeadRedirect`` adds a pre-softmax bias of strength ``alpha`` to the scores of chosen heads on the keys of
chosen positions (the visual tokens inside a target box, ``VisualLayout.positions_for_box``), at the query rows
that produce the answer: the last prompt row of the prompt forward (it predicts the first answer token) and the
fed-in token of every generation step. For head h of layer l at such a row::

    p_h = softmax(q_h K^T * scaling [soft-capped] + mask + alpha * 1[key in target])

and the head's output ``p_h V`` replaces its slice of the output projection's input (the site where ablation and
patching act: a head's output is its ``head_dim`` slice there). Every other head, row and layer is untouched.

Where the bias goes (the design choice). Fused attention (sdpa, flash) exposes no per-head scores to add to. Two
ways remain, and the template takes the second:

* editing the attention call's ``attention_mask`` (nnsight ``.source`` inputs): the mask is shared by all heads
  (``[batch, 1, q, k]``), so a per-head bias needs a ``[batch, heads, q, k]`` float mask at the prompt forward (the
  O(heads x S^2) memory eager attention pays), moves every head and row of sdpa onto another kernel, and a missing
  mask (sdpa's implicit causal one) has to be rebuilt; ``alpha = 0`` then no longer reproduces the model's bits;
* recomputing the steered heads at the steered rows (what ``position_patch.HeadKeyValuePatch`` does to patch one
  head's keys): read the call's post-rotary queries, keys (after the cache update), values, the mask it really
  uses, the scaling and any soft-capping (the inputs ``AttentionRowsReadout`` reads), add the bias to those
  heads' scores for those rows only, and write ``p_h V`` into the heads' output slices. Memory is O(rows x keys)
  per steered head, the model's own kernel runs unchanged for everything else, grouped-query attention is
  isolated per query head (the shared key/value head is not edited), and a (row, head) of strength 0 keeps the
  model's own output bit for bit: ``alpha = 0`` IS the unsteered run.

Strength is per batch ROW and head (``strength[layer]``: ``[rows, heads of that layer]``), so one generation can
hold several conditions (head sets x alphas) in replicated blocks of the batch, as ``RowHeadAblation`` does for
masking. Negative alpha pushes attention away from the target. Tested against a plain-PyTorch reference that adds
the bias to the chosen heads' pre-softmax scores by hand in eager attention (``tests/reference.py``), on every
family.

A generation step on a sliding-window layer whose KV cache dropped early positions is refused (key indices are no
longer prompt positions), as the readout refuses it. Adapters that describe their attention
(``families.described``) have no attention-function call to read values from: refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from vrh_interp.core.description.heads import Head, HeadGeometry, HeadSet
from vrh_interp.core.execution.templates import per_head_view
from vrh_interp.core.execution.templates.readout import (ReadoutUnavailableError, _allowed_rows, _masked_scores_,
                                                         _pad_keys, _row_index, attention_call_inputs)


@dataclass(frozen=True)
class HeadRedirect:
    """Redirect heads to ``target_keys`` (module doc); use inside a trace through ``apply_in_order``.

    ``strength[layer]`` is ``[rows, len(heads_by_layer[layer])]`` (the bias added to each row's steered heads'
    scores on its target keys; 0: that head of that row is not touched), ``target_keys`` ``[rows, prompt_len]``
    booleans over prompt positions (keys added during generation are text, never targets). ``prefill_rows``: the
    query rows steered at a forward with several queries (default the last prompt row; negative counts from the
    end); at a one-token generation step the fed-in token is steered.
    """

    attention_paths: Mapping[int, str]
    projection_paths: Mapping[int, str]
    call_label: str
    heads_by_layer: Mapping[int, tuple[int, ...]]
    strength: Mapping[int, torch.Tensor]
    target_keys: torch.Tensor
    num_heads: int
    num_key_value_heads: int
    head_dim: int
    prefill_rows: torch.Tensor = field(default_factory=lambda: torch.tensor([-1]))
    _pending: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def build(cls, heads: Sequence[HeadSet | None], alphas: Sequence[float], target_keys: torch.Tensor,
              geometry: HeadGeometry, *, attention_path: Any, projection_path: Any, call_label: str,
              prefill_rows: Sequence[int] | torch.Tensor = (-1,)) -> "HeadRedirect":
        """Row r redirects ``heads[r]`` (None or empty: nothing) with bias ``alphas[r]`` onto ``target_keys[r]``.
        ``attention_path(layer)`` / ``projection_path(layer)`` give the attention module's and its output
        projection's dotted paths, ``call_label`` the ``.source`` label of the attention-function call."""
        rows = len(heads)
        if rows == 0:
            raise ValueError("HeadRedirect needs at least one row")
        if len(alphas) != rows:
            raise ValueError(f"{len(alphas)} alphas for {rows} rows of heads")
        target = torch.as_tensor(target_keys).detach().cpu().bool()
        if target.dim() != 2 or target.shape[0] != rows:
            raise ValueError(f"target_keys must be [rows={rows}, prompt length], got {tuple(target.shape)}")
        sets = [geometry.validate(h) if h is not None else HeadSet() for h in heads]
        union: dict[int, set[int]] = {}
        for head_set, alpha in zip(sets, alphas):
            if not torch.isfinite(torch.tensor(float(alpha))):
                raise ValueError(f"alpha must be finite, got {alpha}")
            for layer, idx in head_set.by_layer().items():
                union.setdefault(layer, set()).update(idx)
        by_layer = {layer: tuple(sorted(union[layer])) for layer in sorted(union)}
        strength = {}
        for layer, layer_heads in by_layer.items():
            column = {h: j for j, h in enumerate(layer_heads)}
            table = torch.zeros(rows, len(layer_heads), dtype=torch.float32)
            for r, (head_set, alpha) in enumerate(zip(sets, alphas)):
                for h in head_set.by_layer().get(layer, ()):
                    table[r, column[h]] = float(alpha)
            strength[layer] = table
        return cls({layer: attention_path(layer) for layer in by_layer},
                   {layer: projection_path(layer) for layer in by_layer}, call_label, by_layer, strength, target,
                   geometry.num_heads, geometry.num_kv_heads, geometry.head_dim,
                   torch.as_tensor(prefill_rows, dtype=torch.long).reshape(-1))

    # ------------------------------------------------------------------------------------------ template sites
    def layers(self) -> Sequence[int]:
        return tuple(self.heads_by_layer)

    def rows_for(self, q_len: int) -> torch.Tensor:
        """The query rows steered in a call with ``q_len`` queries."""
        return self.prefill_rows if q_len > 1 else torch.tensor([-1])

    def at_attention_call(self, model: Any, layer: int) -> None:
        """Recompute the steered heads at the steered rows with the bias (kept until the output projection)."""
        query, key, value, mask, scaling, kwargs = attention_call_inputs(model, self.attention_paths[layer],
                                                                          self.call_label)
        self._pending[layer] = redirected_rows(
            query, key, value, mask, self.rows_for(query.shape[2]), self.heads_by_layer[layer],
            self.strength[layer], self.target_keys, num_key_value_heads=self.num_key_value_heads,
            scaling=float(scaling), softcap=kwargs.get("softcap"), window=kwargs.get("sliding_window"), layer=layer)
        return None

    def at_output_projection(self, model: Any, layer: int) -> None:
        """Write the recomputed outputs into the steered heads' slices (rows of strength 0 keep their own)."""
        recomputed, row_index = self._pending.pop(layer)  # [b, n, r, D], [b, r]
        per_head = per_head_view(model, self.projection_paths[layer], self.num_heads, self.head_dim)
        batch = per_head.shape[0]
        heads = torch.tensor(self.heads_by_layer[layer], device=per_head.device)
        steer = (self.strength[layer] != 0).to(per_head.device)  # [b, n]
        if steer.shape[0] != batch:
            raise ValueError(f"the redirection was built for {steer.shape[0]} rows, the batch has {batch}")
        rows = row_index.to(per_head.device)  # [b, r]
        batch_index = torch.arange(batch, device=per_head.device)[:, None, None]
        current = per_head[batch_index, rows[:, :, None], heads[None, None, :]]  # [b, r, n, D]
        new = recomputed.to(device=per_head.device, dtype=per_head.dtype).permute(0, 2, 1, 3)  # [b, r, n, D]
        per_head[batch_index, rows[:, :, None], heads[None, None, :]] = torch.where(
            steer[:, None, :, None], new, current)

    def head_names(self, values: Mapping[int, Any]) -> list[Head]:
        return [Head(layer, h) for layer in sorted(self.heads_by_layer) for h in self.heads_by_layer[layer]]


def redirected_rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, rows: torch.Tensor,
                    heads: Sequence[int], strength: torch.Tensor, target_keys: torch.Tensor, *,
                    num_key_value_heads: int, scaling: float, softcap: float | None = None,
                    window: int | None = None, layer: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """``heads``' outputs at the query ``rows`` with ``strength`` ([batch, len(heads)]) added to their scores on
    ``target_keys`` ([batch, prompt_len]): ``([batch, len(heads), rows, head_dim], row indices [batch, rows])``.
    ``query`` [b, H, q, D], ``key`` / ``value`` [b, KV, k, D] and ``mask`` as the attention function receives them;
    scores in float32 in the order of ``readout.softmax_rows`` (scale, soft-cap, mask), then the bias."""
    batch, num_heads, q_len, head_dim = query.shape
    k_len = key.shape[2]
    prompt = target_keys.shape[1]
    if k_len < prompt or (window and q_len == 1 and k_len >= window):
        raise ReadoutUnavailableError(
            f"layer {layer}: the attention call sees {k_len} keys (sliding window {window}) for a prompt of {prompt}: "
            "a KV cache that drops early positions no longer indexes prompt positions, so the target keys cannot be "
            "found. Redirect full-attention layers, or keep prompt + answer shorter than the window.")
    if strength.shape[0] != batch:
        raise ValueError(f"the redirection was built for {strength.shape[0]} rows, the batch has {batch}")
    device = query.device
    row_index = _row_index(rows, batch, q_len, device)  # [b, r]
    r = row_index.shape[1]
    head_index = torch.tensor(list(heads), device=device)
    group = num_heads // num_key_value_heads
    q = query[:, head_index]  # [b, n, q, D]
    q_rows = torch.gather(q, 2, row_index[:, None, :, None].expand(batch, len(heads), r, head_dim))
    keys = key[:, head_index // group].float()  # [b, n, k, D]: each query head's own key/value head
    values = value[:, head_index // group]
    scores = torch.matmul(q_rows.float(), keys.transpose(-1, -2))  # [b, n, r, k]
    allowed = _allowed_rows(mask, row_index, q_len, k_len)
    _masked_scores_(scores, allowed, scaling=scaling, softcap=softcap)
    target = _pad_keys(target_keys.to(device), k_len).float()  # [b, k]
    scores.add_(strength.to(device=device, dtype=scores.dtype)[:, :, None, None] * target[:, None, None, :])
    probs = torch.nan_to_num_(torch.softmax(scores, dim=-1), nan=0.0)  # a fully masked (padding) row: 0
    return torch.matmul(probs, values.float()).to(value.dtype), row_index
