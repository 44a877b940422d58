"""The backend seam: what the pipelines ask of a model runtime, and ``get_backend`` to pick one.

The pipelines (``score_heads``, ``experiments.sweep``, the demo, the positive control) need only:

* ``generate_conditions``: greedy generation of one batch under several head-mask conditions at once (each
  condition masks its own copy of the batch; ``interventions.generate_conditions`` says why this is exact);
* ``attention_rows``: the attention of given query rows (the scoring readout), optionally reduced per layer
  by a callback so that only the reduction is kept;
* ``capture_head_outputs`` / ``patch_head_outputs``: every head's output at the o_proj input, and a forward
  with chosen heads' outputs overwritten (activation patching).

``NnsightBackend`` delegates to ``vrh_interp.core.interventions`` (templates in nnsight traces: batched conditions,
the shared image prefix, NDIF with ``remote``): the pipelines behave exactly as before. The TransformerLens
backend (``backends.transformer_lens``) answers the same calls through a ``TransformerBridge`` of a copy of the
model. Where a pipeline has a faster path that only nnsight can take (the scoring readout computed inside the
generation), it takes it when ``backend.name == "nnsight"`` and the generic calls otherwise.

A run folder records a backend other than nnsight in its configuration (``backend_config``), so a folder is
never resumed with another backend: nnsight folders keep the manifests they had before the seam existed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence, runtime_checkable

import torch

from vrh_interp.core import interventions as iv
from vrh_interp.core.heads import HeadSet
from vrh_interp.core.model import VLM
from vrh_interp.core.templates.ablation import ABLATION_KINDS, Ablation

Condition = tuple[HeadSet | None, Ablation]
RowReduction = Callable[[int, torch.Tensor], Any]  # (layer, probabilities [batch, heads, rows, keys]) -> kept value


class BackendError(ValueError):
    """An unknown backend name, or a backend that cannot run this model or this operation."""


@runtime_checkable
class Backend(Protocol):
    """What the pipelines need from a model runtime (module doc)."""

    name: ClassVar[str]
    ablation_kinds: ClassVar[tuple[str, ...]]  # the ``Ablation.kind`` values ``generate_conditions`` can mask with
    vlm: VLM

    def generate_conditions(self, encoding: Mapping[str, Any], conditions: Sequence[Condition], *,
                            max_new_tokens: int, segments: torch.Tensor | None = None,
                            sample_ids: Sequence[str] | None = None,
                            shared_prefix: bool = True) -> list[torch.Tensor]:
        """One ``[batch, prompt + new]`` greedy id tensor per condition ``(heads, ablation)``."""
        ...

    def attention_rows(self, encoding: Mapping[str, Any], rows: Sequence[int] | torch.Tensor,
                       layers: Sequence[int] | None = None,
                       reduce: RowReduction | None = None) -> dict[int, Any]:
        """``{layer: [batch, heads, rows, keys]}`` attention of the query ``rows`` (one list for every batch row,
        or ``[batch, rows]``), or ``{layer: reduce(layer, those probabilities)}``."""
        ...

    def capture_head_outputs(self, encoding: Mapping[str, Any],
                             layers: Sequence[int] | None = None) -> dict[int, torch.Tensor]:
        """``{layer: [batch, seq, heads, head_dim]}``: every head's output (the o_proj input)."""
        ...

    def patch_head_outputs(self, encoding: Mapping[str, Any], heads: HeadSet, source: Mapping[int, torch.Tensor],
                           positions: Sequence[int] | None = None) -> torch.Tensor:
        """Logits with ``heads``' outputs (at ``positions``, default all) overwritten from ``source``."""
        ...


@dataclass
class NnsightBackend:
    """The nnsight backend: ``vrh_interp.core.interventions`` unchanged (``remote``: NDIF, as there)."""

    vlm: VLM
    remote: bool | str = False
    name: ClassVar[str] = "nnsight"
    ablation_kinds: ClassVar[tuple[str, ...]] = ABLATION_KINDS

    def generate_conditions(self, encoding: Mapping[str, Any], conditions: Sequence[Condition], *,
                            max_new_tokens: int, segments: torch.Tensor | None = None,
                            sample_ids: Sequence[str] | None = None,
                            shared_prefix: bool = True) -> list[torch.Tensor]:
        return iv.generate_conditions(self.vlm, encoding, conditions, max_new_tokens=max_new_tokens,
                                      segments=segments, sample_ids=sample_ids, remote=self.remote,
                                      shared_prefix=shared_prefix)

    def attention_rows(self, encoding: Mapping[str, Any], rows: Sequence[int] | torch.Tensor,
                       layers: Sequence[int] | None = None,
                       reduce: RowReduction | None = None) -> dict[int, Any]:
        readout = iv.attention_readout(self.vlm, rows, layers=layers)
        values = iv.run_forward(self.vlm, encoding, [readout], remote=self.remote).values[0]
        return {layer: value if reduce is None else reduce(layer, value) for layer, value in sorted(values.items())}

    def capture_head_outputs(self, encoding: Mapping[str, Any],
                             layers: Sequence[int] | None = None) -> dict[int, torch.Tensor]:
        capture = iv.head_output_capture(self.vlm, layers)
        return dict(iv.run_forward(self.vlm, encoding, [capture], remote=self.remote).values[0])

    def patch_head_outputs(self, encoding: Mapping[str, Any], heads: HeadSet, source: Mapping[int, torch.Tensor],
                           positions: Sequence[int] | None = None) -> torch.Tensor:
        patch = iv.head_output_patch(self.vlm, heads, source=source, positions=positions)
        return iv.run_forward(self.vlm, encoding, [patch], remote=self.remote).logits


def check_ablation_kinds(backend: Backend, kinds: Sequence[str]) -> None:
    """Refuse, before any work, ablation ``kinds`` that ``backend`` cannot mask with."""
    other = sorted(set(kinds) - set(backend.ablation_kinds))
    if other:
        raise BackendError(f"the {backend.name} backend masks heads by {' / '.join(backend.ablation_kinds)} ablation "
                           f"only, not {', '.join(other)}: use the nnsight backend (--backend nnsight) for "
                           f"{', '.join(other)} ablation")


def backend_config(backend: Backend) -> dict[str, str]:
    """What a run folder records about ``backend``: nothing for nnsight (folders made before the seam resume as
    they did), ``{"backend": name}`` otherwise, so no folder mixes backends."""
    return {} if backend.name == "nnsight" else {"backend": backend.name}


