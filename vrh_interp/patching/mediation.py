"""Direct vs total effect of a head set (causal mediation on the clean/corrupted pairs).

* Total effect: patch the set's outputs clean -> corrupted at the answer positions and let everything
  downstream react (``patch_head_set``).
* Direct effect: the same patch, but every DOWNSTREAM component is frozen at its value in the unpatched
  corrupted run: the MLPs of the set's first layer and after, and the attention heads of later layers
  that are not in the set. What is left of the recovery reaches the logits through the residual stream
  alone. ``indirect = total - direct`` is the part mediated by later components.

Why freeze at the corrupted run's values rather than mean-ablate: freezing removes only the change the
patch would cause downstream (path patching's definition of a direct effect); mean-ablation would also
remove the downstream components' ordinary contribution and mix two effects. Freezing acts at the same
positions as the patch (the answer positions): earlier positions cannot see the patch under causal
attention.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import nnsight
import pandas as pd
import torch

from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.description.heads import HeadSet
from vrh_interp.core.description.model import VLM
from vrh_interp.patching.batch import Baseline, PairBatch, baseline, measure, recovery, recovery_ci
from vrh_interp.patching.head_patching import patch_head_set
from vrh_interp.core.execution.templates import ProjectionTemplate, module_at
from vrh_interp.core.execution.templates.head_outputs import RowPairHeadPatch


def mlp_path(vlm: VLM, layer: int) -> str:
    """The decoder layer's MLP module: a sibling ``mlp`` of the attention module (every supported family)."""
    path = vlm.adapter.attention_path(layer).rsplit(".", 1)[0] + ".mlp"
    try:
        module_at(vlm.hf_model, path)
    except (AttributeError, IndexError) as error:
        raise ValueError(f"no MLP module at {path!r}: this family's decoder layer has no `mlp`; direct-effect "
                         "analysis needs the MLP's path") from error
    return path


@dataclass(frozen=True)
class FreezeComponents(ProjectionTemplate):
    """Overwrite chosen heads' outputs and MLP outputs at ``positions`` of ``target_rows`` with given values.

    ``head_values[layer]``: ``[len(target_rows), len(positions), heads, head_dim]``; ``mlp_values[layer]``:
    ``[len(target_rows), len(positions), hidden]``.
    """

    projection_paths: Mapping[int, str]
    mlp_paths: Mapping[int, str]
    heads_by_layer: Mapping[int, tuple[int, ...]]
    num_heads: int
    head_dim: int
    target_rows: tuple[int, ...]
    positions: tuple[int, ...]
    head_values: Mapping[int, torch.Tensor] = field(default_factory=dict)
    mlp_values: Mapping[int, torch.Tensor] = field(default_factory=dict)

    def layers(self) -> Sequence[int]:
        return tuple(sorted(set(self.heads_by_layer) | set(self.mlp_paths)))

    def at_output_projection(self, model: Any, layer: int) -> None:
        if layer not in self.heads_by_layer:
            return None
        per_head = self.per_head(model, layer)
        rows = torch.tensor(self.target_rows, device=per_head.device)
        pos = torch.tensor(self.positions, device=per_head.device)
        heads = torch.tensor(self.heads_by_layer[layer], device=per_head.device)
        values = self.head_values[layer][:, :, list(self.heads_by_layer[layer])].to(device=per_head.device,
                                                                                    dtype=per_head.dtype)
        per_head[rows[:, None, None], pos[None, :, None], heads[None, None, :]] = values
        return None

    def at_mlp_output(self, model: Any, layer: int) -> None:
        if layer not in self.mlp_paths:
            return None
        out = module_at(model, self.mlp_paths[layer]).output
        rows = torch.tensor(self.target_rows, device=out.device)
        pos = torch.tensor(self.positions, device=out.device)
        out[rows[:, None], pos[None, :]] = self.mlp_values[layer].to(device=out.device, dtype=out.dtype)
        return None


def _corrupted_values(vlm: VLM, encoding: dict[str, Any], rows: list[int], positions: tuple[int, ...],
                      layers: Sequence[int]) -> tuple[dict[int, torch.Tensor],
                                                                          dict[int, torch.Tensor]]:
    """Head outputs and MLP outputs of the unpatched run at ``rows`` x ``positions`` (only those leave the trace)."""
    g = vlm.geometry
    model = iv.nnsight_model(vlm)
    row_index, pos_index = torch.tensor(rows), torch.tensor(positions)
    # plain values only inside the trace: a remote request ships what the block references, and `vlm` is
    # the whole local model (weights included)
    shape = (len(rows), len(positions), g.num_heads, g.head_dim)
    head_paths = {layer: iv.projection_path(vlm)(layer) for layer in layers}
    mlp_paths = {layer: mlp_path(vlm, layer) for layer in layers}
    iv.prepare_remote(vlm)
    with torch.no_grad(), iv.remote_errors(vlm):
        with model.trace(**encoding, remote=vlm.remote):
            heads_out = nnsight.save({})
            mlps_out = nnsight.save({})
            for layer in layers:
                x = module_at(model, head_paths[layer]).input
                heads_out[layer] = x[row_index][:, pos_index].reshape(shape).clone()
                mlps_out[layer] = module_at(model, mlp_paths[layer]).output[row_index][:, pos_index].clone()
    return dict(heads_out), dict(mlps_out)


def direct_and_total_effect(vlm: VLM, pairs: PairBatch, heads: HeadSet, *, base: Baseline | None = None) -> dict[str,
                                                                                                                 float]:
    """Recovery of the pairs' metric: total, direct (downstream frozen) and indirect = total - direct."""
    g = vlm.geometry
    heads = g.validate(heads)
    if not len(heads):
        raise ValueError("direct_and_total_effect needs at least one head")
    base = base if base is not None else baseline(vlm, pairs)
    total = patch_head_set(vlm, pairs, heads, base=base)
    first = min(h.layer for h in heads)
    layers = list(range(first, g.num_layers))
    positions = pairs.positions("answer")
    _, encoding = pairs.encode(vlm)
    corrupted_rows = pairs.corrupted_rows()
    head_values, mlp_values = _corrupted_values(vlm, encoding, corrupted_rows, positions, layers)
    frozen_heads = {layer: tuple(h for h in range(g.num_heads) if (layer, h) not in {(x.layer, x.head) for x in heads})
                    for layer in layers if layer > first}
    freeze = FreezeComponents(
        projection_paths={layer: iv.projection_path(vlm)(layer) for layer in frozen_heads},
        mlp_paths={layer: mlp_path(vlm, layer) for layer in layers},
        heads_by_layer=frozen_heads, num_heads=g.num_heads, head_dim=g.head_dim,
        target_rows=tuple(corrupted_rows), positions=positions,
        head_values={layer: head_values[layer] for layer in frozen_heads}, mlp_values=mlp_values)
    patch = RowPairHeadPatch.build([(h, pairs.clean_rows(), corrupted_rows) for h in heads], g,
                                   iv.projection_path(vlm), positions=positions)
    values = measure(vlm, pairs, encoding, [1], templates=[patch, freeze])[0].sum(-1)
    direct = recovery(values, base)
    low, high = recovery_ci(values, base)
    return {"heads": len(heads), "total": total["recovery"], "total_ci_low": total["ci_low"],
            "total_ci_high": total["ci_high"], "direct": direct, "direct_ci_low": low, "direct_ci_high": high,
            "indirect": total["recovery"] - direct, "n_pairs": pairs.n, "metric": pairs.metric}


def mediation_table(vlm: VLM, pairs: PairBatch, head_sets: Mapping[str, HeadSet]) -> pd.DataFrame:
    """``direct_and_total_effect`` for several named head sets (e.g. VRHs and random controls)."""
    base = baseline(vlm, pairs)
    return pd.DataFrame([{"head_set": name, **direct_and_total_effect(vlm, pairs, heads, base=base)}
                         for name, heads in head_sets.items()])
