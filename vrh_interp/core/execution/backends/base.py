"""The backend seam: what the pipelines ask of a model runtime; ``select.backend_for(vlm)`` builds the one the
handle's placement names (``vlm.on(backend=..., remote=...)``, ``core.description.model``).

The pipelines (``score_heads``, ``experiments.sweep``, the demo, the positive control) need only:

* ``generate_conditions``: greedy generation of one batch under several head-mask conditions at once (each
  condition masks its own copy of the batch; ``interventions.generate_conditions`` says why this is exact);
* ``attention_rows``: the attention of given query rows (the scoring readout), optionally reduced per layer
  by a callback so that only the reduction is kept;
* ``capture_head_outputs`` / ``patch_head_outputs``: every head's output at the o_proj input, and a forward
  with chosen heads' outputs overwritten (activation patching);
* ``generate_region_stats`` / ``region_stats``: what head scoring reads (``RegionStats``): the greedy answer with
  the region / visual attention statistics of the prompt rows and of the rows that predicted each answer token,
  or those statistics of given rows in one forward (teacher-forced scoring).

``NnsightBackend`` delegates to ``vrh_interp.core.execution.interventions`` (templates in nnsight traces: batched
conditions, the shared image prefix, NDIF when the handle is remote): the pipelines behave exactly as before. The
TransformerLens backend (``backends.transformer_lens``) answers the same calls through a ``TransformerBridge`` of a
copy of the model. Where nnsight has a faster path (the scoring readout computed inside the generation, reduced in the
trace so a remote run returns only the statistics), ``NnsightBackend`` takes it; other backends answer the scoring calls
from the generic ones (``generate_then_read``, ``read_region_stats``): the pipelines never ask which backend runs.
``operations`` says what else a backend runs and ``runs_remotely`` whether it runs NDIF requests
(``check_supported`` and ``backend_for`` refuse the rest before any work).

A run folder records a backend other than nnsight in its configuration (``backend_config``), so a folder is
never resumed with another backend: nnsight folders keep the manifests they had before the seam existed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence, runtime_checkable

import torch

from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.execution import layer_sharing
from vrh_interp.core.description.heads import HeadSet
from vrh_interp.core.description.model import VLM
from vrh_interp.core.execution.templates.ablation import ABLATION_KINDS, ZERO_ABLATION, Ablation
from vrh_interp.core.execution.templates.readout import RegionAttentionReadout

Condition = tuple[HeadSet | None, Ablation]
RowReduction = Callable[[int, torch.Tensor], Any]  # (layer, probabilities [batch, heads, rows, keys]) -> kept value

# What a backend may run beyond the seam's calls (``Backend.operations``), with the words a refusal uses.
OPERATIONS: dict[str, str] = {
    "patching": "activation patching studies (row-pair patches, mediation, attribution gradients, probes; vrh patch)",
    "steering": "attention redirection (a pre-softmax bias on chosen heads, recomputed in the attention call; "
                "vrh steer)",
}


@dataclass(frozen=True)
class RegionStats:
    """What head scoring reads from one run of the model, ``[layers, batch, heads, rows, 4]`` statistics (region mass,
    visual mass, argmax in the region, argmax over the prompt keys but the last in the region:
    ``RegionAttentionReadout``): ``input_rows`` of the given prompt rows,
    ``output_rows`` of the rows that predicted answer tokens 1, 2, ... (the last prompt row, then each decode step's;
    rows past a sample's answer are padding), ``last_row`` the last prompt row's attention ``[layers, batch, heads,
    prompt]`` (spatial entropies), ``ids`` the greedy ids ``[batch, prompt + new]``."""

    ids: torch.Tensor
    input_rows: torch.Tensor
    output_rows: torch.Tensor
    last_row: torch.Tensor


class BackendError(ValueError):
    """An unknown backend name, or a backend that cannot run this model or this operation."""


@runtime_checkable
class Backend(Protocol):
    """What the pipelines need from a model runtime (module doc)."""

    name: ClassVar[str]
    ablation_kinds: ClassVar[tuple[str, ...]]  # the ``Ablation.kind`` values ``generate_conditions`` can mask with
    operations: ClassVar[frozenset[str]]  # the ``OPERATIONS`` it runs
    runs_remotely: ClassVar[bool]  # whether it runs a handle placed on NDIF (``vlm.remote``)
    vlm: VLM

    def generate_conditions(self, encoding: Mapping[str, Any], conditions: Sequence[Condition], *,
                            max_new_tokens: int, segments: torch.Tensor | None = None,
                            sample_ids: Sequence[str] | None = None,
                            shared_prefix: bool = True) -> list[torch.Tensor]:
        """One ``[batch, prompt + new]`` greedy id tensor per condition ``(heads, ablation)``."""
        ...

    def shares_layers(self, ablation_kinds: Sequence[str]) -> bool:
        """Whether ``generate_conditions`` computes a condition's layers below its first masked layer once, from
        the unmasked rows of its pass (``core.execution.layer_sharing``): then a pass should hold many conditions."""
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

    def generate_region_stats(self, encoding: Mapping[str, Any], input_rows: torch.Tensor, region: torch.Tensor,
                              visual: torch.Tensor, *, max_new_tokens: int,
                              templates: Sequence[Any] = ()) -> RegionStats:
        """The unmasked greedy answer and its scoring statistics (``RegionStats``); ``input_rows`` ``[batch, r]``,
        ``region`` / ``visual`` ``[batch, prompt]`` key masks. ``templates``: nnsight templates to run alongside
        (e.g. a ``HeadAblation``); a backend that cannot run them refuses."""
        ...

    def region_stats(self, encoding: Mapping[str, Any], rows: torch.Tensor, region: torch.Tensor,
                     visual: torch.Tensor) -> torch.Tensor:
        """``[layers, batch, heads, rows, 4]`` statistics of the query ``rows`` ``[batch, r]`` in one forward."""
        ...


@dataclass
class NnsightBackend:
    """The nnsight backend: ``vrh_interp.core.execution.interventions`` unchanged (NDIF when ``vlm.remote``, as
    there)."""

    vlm: VLM
    name: ClassVar[str] = "nnsight"
    ablation_kinds: ClassVar[tuple[str, ...]] = ABLATION_KINDS
    operations: ClassVar[frozenset[str]] = frozenset(OPERATIONS)
    runs_remotely: ClassVar[bool] = True

    def generate_conditions(self, encoding: Mapping[str, Any], conditions: Sequence[Condition], *,
                            max_new_tokens: int, segments: torch.Tensor | None = None,
                            sample_ids: Sequence[str] | None = None,
                            shared_prefix: bool = True) -> list[torch.Tensor]:
        return iv.generate_conditions(self.vlm, encoding, conditions, max_new_tokens=max_new_tokens,
                                      segments=segments, sample_ids=sample_ids, shared_prefix=shared_prefix)

    def shares_layers(self, ablation_kinds: Sequence[str]) -> bool:
        return layer_sharing.applies(self.vlm, ablation_kinds)

    def attention_rows(self, encoding: Mapping[str, Any], rows: Sequence[int] | torch.Tensor,
                       layers: Sequence[int] | None = None,
                       reduce: RowReduction | None = None) -> dict[int, Any]:
        readout = iv.attention_readout(self.vlm, rows, layers=layers)
        values = iv.run_forward(self.vlm, encoding, [readout]).values[0]
        return {layer: value if reduce is None else reduce(layer, value) for layer, value in sorted(values.items())}

    def capture_head_outputs(self, encoding: Mapping[str, Any],
                             layers: Sequence[int] | None = None) -> dict[int, torch.Tensor]:
        capture = iv.head_output_capture(self.vlm, layers)
        return dict(iv.run_forward(self.vlm, encoding, [capture]).values[0])

    def patch_head_outputs(self, encoding: Mapping[str, Any], heads: HeadSet, source: Mapping[int, torch.Tensor],
                           positions: Sequence[int] | None = None) -> torch.Tensor:
        patch = iv.head_output_patch(self.vlm, heads, source=source, positions=positions)
        return iv.run_forward(self.vlm, encoding, [patch]).logits

    def generate_region_stats(self, encoding: Mapping[str, Any], input_rows: torch.Tensor, region: torch.Tensor,
                              visual: torch.Tensor, *, max_new_tokens: int,
                              templates: Sequence[Any] = ()) -> RegionStats:
        """The readout runs inside the generation (layer-stacked, reduced in the trace): the prompt forward reads the
        input rows, the last prompt row (with its whole map) and each decode step its one new row."""
        b, s = encoding["input_ids"].shape
        prefill_rows = torch.cat([input_rows, torch.full((b, 1), s - 1)], dim=1)
        readout = RegionAttentionReadout(iv.attention_readout(self.vlm, prefill_rows), region, visual,
                                         last_row_map=True, stack_layers=True)
        result = iv.run_generate(self.vlm, encoding, [readout, *templates], max_new_tokens=max_new_tokens)
        first = _layer_stacked(result.steps[0][0])
        prefill = torch.cat([chunk[0] for chunk in first])  # [L, b, H, r + 1, 4]
        decode = [torch.cat(_layer_stacked(step[0])) for step in result.steps[1:]]  # each [L, b, H, 1, 4]
        return RegionStats(result.ids, prefill[:, :, :, :-1], torch.cat([prefill[:, :, :, -1:], *decode], dim=3),
                           torch.cat([chunk[1] for chunk in first]))

    def region_stats(self, encoding: Mapping[str, Any], rows: torch.Tensor, region: torch.Tensor,
                     visual: torch.Tensor) -> torch.Tensor:
        readout = RegionAttentionReadout(iv.attention_readout(self.vlm, rows), region, visual)
        values = iv.run_forward(self.vlm, encoding, [readout]).values[0]
        return torch.stack([values[layer] for layer in sorted(values)])


def _layer_stacked(values: dict[int, Any]) -> list[Any]:
    """A layer-stacked readout's chunks (each at the last layer it covers), in layer order, on the host:
    with a device_map the chunks may live on different devices."""
    def host(value: Any) -> Any:
        return tuple(v.cpu() for v in value) if isinstance(value, (tuple, list)) else value.cpu()
    return [host(values[layer]) for layer in sorted(values)]


def generate_then_read(backend: Backend, encoding: Mapping[str, Any], input_rows: torch.Tensor, region: torch.Tensor,
                       visual: torch.Tensor, *, max_new_tokens: int) -> RegionStats:
    """``generate_region_stats`` from the generic calls, for a backend whose readout cannot run inside the
    generation: the unmasked greedy answer (``generate_conditions``), then ONE forward over prompt + answer reading
    the input rows and the rows from the last prompt token on (``attention_rows``, reduced per layer by the same
    ``RegionAttentionReadout.reduce``). Causal attention makes row p of that forward the row the decode step at p
    computed; only floating-point order differs."""
    b, s = encoding["input_ids"].shape
    ids = backend.generate_conditions(encoding, [(None, ZERO_ABLATION)], max_new_tokens=max_new_tokens)[0]
    r_in = input_rows.shape[1]
    rows = torch.cat([input_rows, (s - 1 + torch.arange(max(ids.shape[1] - s, 1)))[None].expand(b, -1)], dim=1)
    reducer = RegionAttentionReadout(None, region, visual)  # type: ignore[arg-type]  # only its reduce is used

    def reduce(layer: int, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return reducer.reduce(probs).cpu(), probs[:, :, r_in, :s].cpu()

    answered = dict(encoding)
    mask = answered["attention_mask"]
    answered["input_ids"] = ids.to(mask.device)
    answered["attention_mask"] = torch.cat([mask, mask.new_ones(b, ids.shape[1] - s)], dim=1)
    values = backend.attention_rows(answered, rows, reduce=reduce)
    stats = torch.stack([values[layer][0] for layer in sorted(values)])  # [L, b, H, r, 4]
    return RegionStats(ids, stats[:, :, :, :r_in], stats[:, :, :, r_in:],
                       torch.stack([values[layer][1] for layer in sorted(values)]))


def read_region_stats(backend: Backend, encoding: Mapping[str, Any], rows: torch.Tensor, region: torch.Tensor,
                      visual: torch.Tensor) -> torch.Tensor:
    """``region_stats`` from ``attention_rows``, reduced per layer by ``RegionAttentionReadout.reduce``."""
    reducer = RegionAttentionReadout(None, region, visual)  # type: ignore[arg-type]  # only its reduce is used
    values = backend.attention_rows(encoding, rows, reduce=lambda layer, probs: reducer.reduce(probs).cpu())
    return torch.stack([values[layer] for layer in sorted(values)])


def check_supported(backend: Backend | type[Backend], *, ablation_kinds: Sequence[str] = (),
                    operations: Sequence[str] = ()) -> None:
    """Refuse, before any work and in one line, ablation ``kinds`` or ``OPERATIONS`` that ``backend`` (an instance,
    or its class when the model is not built yet: ``select.backend_class``) cannot run, naming the alternative."""
    kinds = sorted(set(ablation_kinds) - set(backend.ablation_kinds))
    if kinds:
        raise BackendError(f"the {backend.name} backend masks heads by {' / '.join(backend.ablation_kinds)} ablation "
                           f"only, not {', '.join(kinds)}: use the nnsight backend (--backend nnsight) for "
                           f"{', '.join(kinds)} ablation")
    missing = [op for op in operations if op not in backend.operations]
    if missing:
        raise BackendError(f"the {backend.name} backend does not run {'; '.join(OPERATIONS[op] for op in missing)}: "
                           "use the nnsight backend (--backend nnsight)")


def check_ablation_kinds(backend: Backend | type[Backend], kinds: Sequence[str]) -> None:
    """Refuse, before any work, ablation ``kinds`` that ``backend`` cannot mask with (``check_supported``)."""
    check_supported(backend, ablation_kinds=kinds)


def backend_config(backend: Backend) -> dict[str, str]:
    """What a run folder records about ``backend``: nothing for nnsight (folders made before the seam resume as
    they did), ``{"backend": name}`` otherwise, so no folder mixes backends."""
    return {} if backend.name == "nnsight" else {"backend": backend.name}


