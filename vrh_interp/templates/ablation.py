"""Head ablation: replace a head's contribution BEFORE the output projection.

A head's output is its ``head_dim``-wide slice of the INPUT of ``o_proj``; zeroing that slice removes
exactly that head's term from the attention block's output (the paper's masking, Wu et al.'s
convention; OCR_Head and pyvene do the same). Zeroing pre-softmax scores or queries instead makes the
head attend uniformly (it still writes the mean of V), and splitting the o_proj OUTPUT into "heads"
isolates nothing: both are mistakes found in peer code. Mean ablation replaces the slice with a mean
activation (per layer, ``[num_heads * head_dim]``) collected by the caller over a reference set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

import torch

from vrh_interp.heads import HeadGeometry, HeadSet
from vrh_interp.templates import per_head_view

AblationMode = Literal["zero", "mean"]


@dataclass(frozen=True)
class HeadAblation:
    """Zero- or mean-ablate ``heads``; use inside a trace via ``apply_in_order`` or ``apply``."""

    projection_paths: Mapping[int, str]  # layer -> path of its output projection (o_proj)
    heads_by_layer: Mapping[int, tuple[int, ...]]
    num_heads: int
    head_dim: int
    mode: AblationMode = "zero"
    means: Mapping[int, torch.Tensor] = field(default_factory=dict)  # layer -> [num_heads * head_dim]

    @classmethod
    def build(cls, heads: HeadSet, geometry: HeadGeometry, projection_path: Any, *,
              mode: AblationMode = "zero", means: Mapping[int, torch.Tensor] | None = None) -> "HeadAblation":
        """``projection_path(layer) -> str`` gives the o_proj path of a layer (``FamilyAdapter``)."""
        heads = geometry.validate(heads)
        if mode not in ("zero", "mean"):
            raise ValueError(f"ablation mode must be 'zero' or 'mean', got {mode!r}")
        by_layer = {layer: tuple(idx) for layer, idx in heads.by_layer().items()}
        means = dict(means or {})
        if mode == "mean":
            width = geometry.num_heads * geometry.head_dim
            missing = [layer for layer in by_layer if layer not in means]
            if missing:
                raise ValueError(f"mean ablation needs a mean o_proj input for layers {missing}")
            for layer, mean in means.items():
                if mean.shape[-1] != width:
                    raise ValueError(f"mean for layer {layer} has width {mean.shape[-1]}, expected {width}")
        return cls(
            projection_paths={layer: projection_path(layer) for layer in by_layer},
            heads_by_layer=by_layer,
            num_heads=geometry.num_heads,
            head_dim=geometry.head_dim,
            mode=mode,
            means={layer: means[layer] for layer in by_layer} if mode == "mean" else {},
        )

    def layers(self) -> Sequence[int]:
        return tuple(self.heads_by_layer)

    def at_attention_call(self, model: Any, layer: int) -> None:
        return None

    def at_output_projection(self, model: Any, layer: int) -> None:
        per_head = per_head_view(model, self.projection_paths[layer], self.num_heads, self.head_dim)
        heads = list(self.heads_by_layer[layer])
        if self.mode == "zero":
            per_head[:, :, heads] = 0
        else:
            mean = self.means[layer].view(self.num_heads, self.head_dim)[heads]
            per_head[:, :, heads] = mean.to(device=per_head.device, dtype=per_head.dtype)

    def apply(self, model: Any) -> None:
        """Apply at every layer, in order (for use inside ``model.trace`` or one generation step)."""
        for layer in sorted(self.heads_by_layer):
            self.at_output_projection(model, layer)
