"""Key/value-position patching for ONE query head: from which positions does its contribution come?

Not a layer template (it acts at two sites with a value flowing between them): call ``apply(model)``
inside a trace, after any request on earlier layers. The template reads the inputs of the attention-function call (post-rotary queries, the keys and values
after the cache update, the real mask and scaling; the same call ``AttentionRowsReadout`` reads), replaces
the keys and/or values at ``key_positions`` by those of a source row of the same batch, recomputes that
one head's output at the query ``rows`` and writes it into the head's slice of the output projection's
input. Everything else in the forward is untouched.

Why recompute instead of editing the keys/values in place: with grouped-query attention several query
heads share one key/value head (the toy models: 2 per group), so editing the cached values would patch
the whole group. Recomputing softmax(q_h K'^T * scaling + mask) V' for head h alone isolates the head.
Value patching is linear (the attention weights stay the corrupted run's); key patching changes which
positions the head attends to.

What is patched is a kind, one class each, registered in ``PATCHED_STATES`` (what ``states=`` names, what
``patching.positions`` and its tables write): ``KeyPatch`` ("keys"), ``ValuePatch`` ("values"),
``KeyValuePatch`` ("both"). A kind says which of the source row's keys and values replace the target row's at the
patched positions (``keys``, ``values``); adding one is a subclass of ``StatePatch`` setting ``name`` and the two
flags, added to ``PATCHED_STATES``.
"""  # noqa: E501

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import torch

from vrh_interp.core.description.heads import Head, HeadGeometry
from vrh_interp.core.execution.templates import per_head_view
from vrh_interp.core.execution.templates.readout import attention_call_inputs, attention_call_label, softmax_rows


class StatePatch:
    """One kind of key/value patch (module doc): which of the source row's states replace the target row's."""

    name: ClassVar[str]
    keys: ClassVar[bool] = False  # the keys (changes which positions the head attends to)
    values: ClassVar[bool] = False  # the values (linear: the attention weights stay the target run's)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class KeyPatch(StatePatch):
    """The keys only."""

    name = "keys"
    keys = True


class ValuePatch(StatePatch):
    """The values only."""

    name = "values"
    values = True


class KeyValuePatch(StatePatch):
    """Keys and values (the default)."""

    name = "both"
    keys = True
    values = True


PATCHED_STATES: dict[str, StatePatch] = {kind.name: kind for kind in (KeyPatch(), ValuePatch(), KeyValuePatch())}
PatchedStates = str  # a name in PATCHED_STATES


def patched_states(name: str) -> StatePatch:
    """The registered kind ``name``; ``ValueError`` naming the choices otherwise."""
    try:
        return PATCHED_STATES[name]
    except (KeyError, TypeError):
        choices = ", ".join(repr(n) for n in PATCHED_STATES)
        raise ValueError(f"states must be one of {choices}, not {name!r}") from None


@dataclass(frozen=True)
class HeadKeyValuePatch:
    """Patch head ``head``'s keys/values at ``key_positions`` from ``source_rows`` into ``target_rows``.

    ``key_positions`` is ``[len(target_rows), P]`` (a per-row position list, e.g. a region's visual
    tokens; pad with -1, which is ignored); ``source_key_positions`` the matching positions in the source
    rows (default: the same; they differ when the two prompts are padded differently, e.g. expressions of
    different lengths shift the image). ``rows`` are the query positions whose head output is recomputed
    (the answer positions).
    """

    attention_path: str
    projection_path: str
    call_label: str
    head: Head
    num_heads: int
    num_key_value_heads: int
    head_dim: int
    source_rows: tuple[int, ...]
    target_rows: tuple[int, ...]
    key_positions: torch.Tensor
    rows: tuple[int, ...]
    states: PatchedStates = "both"
    source_key_positions: torch.Tensor | None = None

    @classmethod
    def build(cls, head: Head, geometry: HeadGeometry, *, attention_path: str, projection_path: str, call_label: str,
              num_key_value_heads: int, source_rows: Sequence[int], target_rows: Sequence[int],
              key_positions: Sequence[Sequence[int]] | torch.Tensor, rows: Sequence[int],
              states: PatchedStates = "both",
              source_key_positions: Sequence[Sequence[int]] | torch.Tensor | None = None) -> "HeadKeyValuePatch":
        geometry.validate([head])
        if len(source_rows) != len(target_rows):
            raise ValueError(f"{len(source_rows)} source rows but {len(target_rows)} target rows")
        patched_states(states)
        positions = _position_matrix(key_positions)
        if positions.shape[0] != len(target_rows):
            raise ValueError(f"key_positions has {positions.shape[0]} rows but there are {len(target_rows)} "
                             "target rows")
        source_positions = None
        if source_key_positions is not None:
            source_positions = _position_matrix(source_key_positions)
            if source_positions.shape != positions.shape or not torch.equal(source_positions >= 0, positions >= 0):
                raise ValueError("source_key_positions must list as many positions per row as key_positions")
        return cls(attention_path, projection_path, call_label, head, geometry.num_heads, num_key_value_heads,
                   geometry.head_dim, tuple(source_rows), tuple(target_rows), positions, tuple(rows), states,
                   source_positions)

    @classmethod
    def for_model(cls, vlm: Any, head: Any, *, source_rows: Sequence[int], target_rows: Sequence[int],
                  key_positions: Sequence[Sequence[int]] | torch.Tensor, rows: Sequence[int],
                  source_key_positions: Sequence[Sequence[int]] | torch.Tensor | None = None,
                  states: PatchedStates = "both") -> "HeadKeyValuePatch":
        """``build`` with what you know: the ``vlm`` handle gives the module paths, the attention call's label and
        the head grid (key/value heads included); ``head`` in any form (``"L2H6"``, ``Head(2, 6)``, ``(2, 6)``).
        The source run's ``source_rows`` give their keys/values at ``source_key_positions`` (default: the same
        positions) to ``target_rows`` at ``key_positions``; the head's output is recomputed at the query ``rows``.
        For a ``PairBatch`` and a named region, ``patching.positions.key_value_patch`` fills these in too."""
        head = Head.coerce(head, "HeadKeyValuePatch.for_model(head)")
        geometry, adapter = vlm.geometry, vlm.adapter
        geometry.validate([head], "HeadKeyValuePatch.for_model(head)")
        label = attention_call_label(adapter.attention_module(vlm.nn, head.layer).source.names)
        return cls.build(head, geometry, attention_path=adapter.attention_path(head.layer),
                         projection_path=f"{adapter.attention_path(head.layer)}.{adapter.output_projection_attr}",
                         call_label=label, num_key_value_heads=geometry.num_kv_heads, source_rows=source_rows,
                         target_rows=target_rows, key_positions=key_positions, rows=rows, states=states,
                         source_key_positions=source_key_positions)

    def apply(self, model: Any) -> None:
        """Apply inside a trace: recompute at the attention call, then write at the output projection."""
        self.write(model, self.recompute(model))

    def recompute(self, model: Any) -> torch.Tensor:
        """The head's output at ``rows`` of the target rows with patched keys/values: ``[t, r, D]``."""
        query, key, value, mask, scaling, kwargs = attention_call_inputs(model, self.attention_path, self.call_label)
        group = self.head.head // (self.num_heads // self.num_key_value_heads)
        device = query.device
        src = torch.tensor(self.source_rows, device=device)
        tgt = torch.tensor(self.target_rows, device=device)
        positions = self.key_positions.to(device)
        valid = positions >= 0
        safe = positions.clamp(min=0)
        source_safe = (self.source_key_positions.to(device) if self.source_key_positions is not None
                       else positions).clamp(min=0)
        keys = key[tgt, group : group + 1].clone()  # [t, 1, k, D]
        values = value[tgt, group : group + 1].clone()
        source_keys = torch.gather(key[src, group], 1, source_safe[:, :, None].expand(-1, -1, key.shape[-1]))
        source_values = torch.gather(value[src, group], 1, source_safe[:, :, None].expand(-1, -1, value.shape[-1]))
        current_keys = torch.gather(keys[:, 0], 1, safe[:, :, None].expand(-1, -1, key.shape[-1]))
        current_values = torch.gather(values[:, 0], 1, safe[:, :, None].expand(-1, -1, value.shape[-1]))
        keep = valid[:, :, None]
        kind = patched_states(self.states)
        if kind.keys:
            keys[:, 0].scatter_(1, safe[:, :, None].expand(-1, -1, key.shape[-1]),
                                torch.where(keep, source_keys, current_keys))
        if kind.values:
            values[:, 0].scatter_(1, safe[:, :, None].expand(-1, -1, value.shape[-1]),
                                  torch.where(keep, source_values, current_values))
        rows = torch.tensor(self.rows, device=device)
        mask_rows = mask[tgt] if mask is not None and mask.shape[0] > 1 else mask
        probs = softmax_rows(query[tgt, self.head.head : self.head.head + 1], keys, mask_rows, rows,
                             scaling=scaling, softcap=kwargs.get("softcap"))  # [t, 1, r, k]
        return torch.matmul(probs, values.float()).to(value.dtype)[:, 0]  # [t, r, D]

    def write(self, model: Any, recomputed: torch.Tensor) -> None:
        """Overwrite the head's output at ``rows`` of the target rows with the recomputed values."""
        per_head = per_head_view(model, self.projection_path, self.num_heads, self.head_dim)
        tgt = torch.tensor(self.target_rows, device=per_head.device)
        rows = torch.tensor(self.rows, device=per_head.device)
        per_head[tgt[:, None], rows[None, :], self.head.head] = recomputed.to(per_head.dtype)


def _position_matrix(positions: Sequence[Sequence[int]] | torch.Tensor) -> torch.Tensor:
    """Per-row position lists as a ``[rows, P]`` long tensor padded with -1."""
    if isinstance(positions, torch.Tensor):
        return positions.long()
    width = max((len(p) for p in positions), default=0)
    matrix = torch.full((len(positions), max(width, 1)), -1, dtype=torch.long)
    for i, p in enumerate(positions):
        matrix[i, : len(p)] = torch.as_tensor(list(p), dtype=torch.long)
    return matrix
