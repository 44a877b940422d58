"""Per-head output capture and patching at the output projection's input.

Head h's output at layer l is the ``head_dim`` slice h of ``o_proj``'s input (what ablation zeroes).
Capturing it returns ``[batch, seq, heads, head_dim]``; patching overwrites chosen heads (optionally at
chosen positions) with values from another run (``source``) or from another row of the same batch
(``source_row``, for a pre-batched [clean, corrupted] encoding: nnsight refuses two invokes that both
carry images). These are the primitives of activation patching.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from vrh_interp.core.description.heads import Head, HeadGeometry, HeadSet
from vrh_interp.core.execution.templates import ProjectionTemplate


@dataclass(frozen=True)
class HeadOutputCapture(ProjectionTemplate):
    """Capture every head's output at ``layers``: ``[batch, seq, heads, head_dim]`` per layer."""

    projection_paths: Mapping[int, str]
    num_heads: int
    head_dim: int

    @classmethod
    def build(cls, layers: Sequence[int], geometry: HeadGeometry, projection_path: Any) -> "HeadOutputCapture":
        bad = [layer for layer in layers if not 0 <= layer < geometry.num_layers]
        if bad:
            raise ValueError(f"layers {bad} out of range for a model with {geometry.num_layers} layers")
        return cls({layer: projection_path(layer) for layer in sorted(layers)}, geometry.num_heads, geometry.head_dim)

    def at_output_projection(self, model: Any, layer: int) -> torch.Tensor:
        return self.per_head(model, layer).clone()

    def head_value(self, value: torch.Tensor, head: Head) -> torch.Tensor:
        """Head ``head``'s output in this template's value at its layer: ``[batch, seq, head_dim]``."""
        return value[:, :, head.head]

    def head_names(self, values: Mapping[int, torch.Tensor]) -> list[Head]:
        """The heads of ``values`` (``{layer: value}``), layer by layer."""
        return [Head(layer, h) for layer in sorted(values) for h in range(self.num_heads)]


@dataclass(frozen=True)
class HeadOutputPatch(ProjectionTemplate):
    """Overwrite chosen heads' outputs, at all positions or at ``positions``.

    Exactly one source: ``source`` (layer -> ``[batch or 1, seq, heads, head_dim]`` from another run) or
    ``source_row`` (copy from that batch row into ``target_rows``).
    """

    projection_paths: Mapping[int, str]
    heads_by_layer: Mapping[int, tuple[int, ...]]
    num_heads: int
    head_dim: int
    source: Mapping[int, torch.Tensor] = field(default_factory=dict)
    source_row: int | None = None
    target_rows: tuple[int, ...] | None = None
    positions: tuple[int, ...] | None = None

    @classmethod
    def build(cls, heads: HeadSet, geometry: HeadGeometry, projection_path: Any, *,
              source: Mapping[int, torch.Tensor] | None = None, source_row: int | None = None,
              target_rows: Sequence[int] | None = None, positions: Sequence[int] | None = None) -> "HeadOutputPatch":
        heads = geometry.validate(heads)
        if (source is None) == (source_row is None):
            raise ValueError("give exactly one of source= (values from another run) or source_row= (a batch row)")
        by_layer = {layer: tuple(idx) for layer, idx in heads.by_layer().items()}
        if source is not None:
            missing = [layer for layer in by_layer if layer not in source]
            if missing:
                raise ValueError(f"source has no captured outputs for layers {missing}")
        return cls(
            projection_paths={layer: projection_path(layer) for layer in by_layer},
            heads_by_layer=by_layer,
            num_heads=geometry.num_heads,
            head_dim=geometry.head_dim,
            source={layer: source[layer] for layer in by_layer} if source is not None else {},
            source_row=source_row,
            target_rows=tuple(target_rows) if target_rows is not None else None,
            positions=tuple(positions) if positions is not None else None,
        )

    def at_output_projection(self, model: Any, layer: int) -> None:
        per_head = self.per_head(model, layer)
        batch, seq = per_head.shape[:2]
        heads = list(self.heads_by_layer[layer])
        positions = list(self.positions) if self.positions is not None else list(range(seq))
        pos = torch.tensor(positions, device=per_head.device)
        if self.source_row is not None:
            targets = list(self.target_rows) if self.target_rows is not None else [
                r for r in range(batch) if r != self.source_row]
            values = per_head[self.source_row][pos][:, heads].clone()
            for row in targets:
                per_head[row, pos[:, None], torch.tensor(heads)[None, :]] = values
        else:
            values = self.source[layer].to(device=per_head.device, dtype=per_head.dtype)[:, pos][:, :, heads]
            rows = list(self.target_rows) if self.target_rows is not None else list(range(batch))
            per_head[torch.tensor(rows)[:, None, None], pos[None, :, None], torch.tensor(heads)[None, None, :]] = (
                values.expand(len(rows), -1, -1, -1) if values.shape[0] == 1 else values[rows]
            )


@dataclass(frozen=True)
class RowPairHeadPatch(ProjectionTemplate):
    """Many head patches in ONE forward: for each entry, copy one head's output from source rows to target rows.

    ``patches`` holds ``(layer, head, source_rows, target_rows)``. With a batch laid out as
    ``[clean_1..clean_n, corrupted block 1, corrupted block 2, ...]`` and one head per corrupted block,
    one forward measures n pairs x k heads: the exact, batched form of patching every head one at a time.
    Source rows are read before any write of the same layer, and clean rows are never targets, so each
    block sees only its own head patched. ``positions`` (None = every position) are shared by all rows:
    prompts are left-padded, so a position index means the same prompt-end-relative slot in every row.
    """

    projection_paths: Mapping[int, str]
    num_heads: int
    head_dim: int
    patches: tuple[tuple[int, int, tuple[int, ...], tuple[int, ...]], ...]
    positions: tuple[int, ...] | None = None

    @classmethod
    def build(cls, patches: Sequence[tuple[Head, Sequence[int], Sequence[int]]], geometry: HeadGeometry,
              projection_path: Any, *, positions: Sequence[int] | None = None) -> "RowPairHeadPatch":
        if not patches:
            raise ValueError("RowPairHeadPatch needs at least one (head, source_rows, target_rows) patch")
        geometry.validate(HeadSet(sorted({h for h, _, _ in patches})))
        entries = []
        all_targets = {r for _, _, t in patches for r in t}
        for head, source_rows, target_rows in patches:
            if len(source_rows) != len(target_rows):
                raise ValueError(f"{head}: {len(source_rows)} source rows but {len(target_rows)} target rows")
            if set(source_rows) & all_targets:
                raise ValueError(f"{head}: a source row is also a patch target; keep source rows unpatched")
            entries.append((head.layer, head.head, tuple(source_rows), tuple(target_rows)))
        layers = sorted({layer for layer, _, _, _ in entries})
        return cls({layer: projection_path(layer) for layer in layers}, geometry.num_heads, geometry.head_dim,
                   tuple(entries), tuple(positions) if positions is not None else None)

    @classmethod
    def for_model(cls, vlm: Any, patches: Sequence[tuple[Any, Sequence[int], Sequence[int]]], *,
                  positions: Sequence[int] | None = None) -> "RowPairHeadPatch":
        """``build`` with the head grid and the output projections' paths from the ``vlm`` handle: ``patches`` are
        ``(head, source_rows, target_rows)``, a head in any form (``"L2H6"``, ``Head(2, 6)``, ``(2, 6)``)."""
        adapter = vlm.adapter
        entries = [(Head.coerce(head, f"RowPairHeadPatch.for_model(patches[{i}])"), source, target)
                   for i, (head, source, target) in enumerate(patches)]
        return cls.build(entries, vlm.geometry,
                         lambda layer: f"{adapter.attention_path(layer)}.{adapter.output_projection_attr}",
                         positions=positions)

    def at_output_projection(self, model: Any, layer: int) -> None:
        per_head = self.per_head(model, layer)
        batch, seq = per_head.shape[:2]
        positions = list(self.positions) if self.positions is not None else list(range(seq))
        pos = torch.tensor(positions, device=per_head.device)
        here = [entry for entry in self.patches if entry[0] == layer]
        values = [per_head[torch.tensor(src, device=per_head.device)[:, None], pos[None, :], head].clone()
                  for _, head, src, _ in here]
        for (_, head, _, tgt), value in zip(here, values):
            per_head[torch.tensor(tgt, device=per_head.device)[:, None], pos[None, :], head] = value
