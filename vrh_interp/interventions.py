"""One-call helpers: build trace templates for a ``VLM`` and run them in a forward pass or a generation.

These are thin: the templates (``vrh_interp.templates``) do the work and can be used in a user's own
trace instead. ``run_forward`` runs one ``model.trace``; ``run_generate`` runs ``model.generate`` with
the templates applied at EVERY step (prefill and each decode step) through nnsight's open-ended
``tracer.iter[:]`` loop, and reads the generated ids in a second, empty invoke (code after an
open-ended loop does not run; bounding the loop would need ``min_new_tokens``, which changes greedy
outputs by suppressing EOS).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from vrh_interp.heads import HeadSet
from vrh_interp.model import VLM
from vrh_interp.templates import LayerTemplate, apply_in_order
from vrh_interp.templates.ablation import AblationMode, HeadAblation
from vrh_interp.templates.head_outputs import HeadOutputCapture, HeadOutputPatch
from vrh_interp.templates.readout import AttentionRowsReadout, attention_call_label

_OPEN_LOOP_WARNING = r".*was never reached.*"


def _prepare_remote(remote: bool | str) -> None:
    """Ship vrh_interp's template code with a remote request (the server need not have it installed).

    ``nnsight.register`` makes cloudpickle serialise the package by value; it is idempotent.
    """
    if remote:
        import nnsight

        nnsight.register("vrh_interp")


def head_ablation(vlm: VLM, heads: HeadSet, *, mode: AblationMode = "zero",
                  means: Mapping[int, torch.Tensor] | None = None) -> HeadAblation:
    return HeadAblation.build(heads, vlm.geometry, _projection_path(vlm), mode=mode, means=means)


def attention_readout(vlm: VLM, prefill_rows: Sequence[int] | torch.Tensor, *, layers: Sequence[int] | None = None,
                      heads: HeadSet | None = None) -> AttentionRowsReadout:
    """Readout of ``prefill_rows`` (and the fed-in token at each decode step) for ``layers`` / ``heads``."""
    geometry = vlm.geometry
    if heads is not None:
        heads = geometry.validate(heads)
        by_layer = {layer: tuple(idx) for layer, idx in heads.by_layer().items()}
        layer_list = sorted(by_layer)
    else:
        by_layer = None
        layer_list = sorted(layers) if layers is not None else list(range(geometry.num_layers))
    bad = [layer for layer in layer_list if not 0 <= layer < geometry.num_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range for a model with {geometry.num_layers} layers")
    paths = {layer: vlm.adapter.attention_path(layer) for layer in layer_list}
    label = attention_call_label(vlm.adapter.attention_module(vlm.nn, layer_list[0]).source.names)
    return AttentionRowsReadout.build(paths, label, prefill_rows, heads_by_layer=by_layer)


def head_output_capture(vlm: VLM, layers: Sequence[int] | None = None) -> HeadOutputCapture:
    geometry = vlm.geometry
    return HeadOutputCapture.build(list(layers) if layers is not None else list(range(geometry.num_layers)),
                                   geometry, _projection_path(vlm))


def head_output_patch(vlm: VLM, heads: HeadSet, **kwargs: Any) -> HeadOutputPatch:
    return HeadOutputPatch.build(heads, vlm.geometry, _projection_path(vlm), **kwargs)


@dataclass
class ForwardResult:
    logits: torch.Tensor
    values: list[dict[int, torch.Tensor]]  # per template: {layer: value} (readouts, captures)


@dataclass
class GenerateResult:
    ids: torch.Tensor  # [batch, prompt + new]
    steps: list[list[dict[int, torch.Tensor]]]  # per step, per template: {layer: value}


def run_forward(vlm: VLM, encoding: Mapping[str, Any], templates: Sequence[LayerTemplate] = (),
                *, remote: bool | str = False) -> ForwardResult:
    import nnsight

    model = vlm.nn
    _prepare_remote(remote)
    with torch.no_grad():
        with model.trace(**dict(encoding), remote=remote):
            values = nnsight.save(apply_in_order(model, templates))
            logits = nnsight.save(model.output.logits)
    return ForwardResult(logits=logits, values=values)


def run_generate(vlm: VLM, encoding: Mapping[str, Any], templates: Sequence[LayerTemplate] = (), *,
                 max_new_tokens: int, remote: bool | str = False, **generate_kwargs: Any) -> GenerateResult:
    import nnsight

    model = vlm.nn
    _prepare_remote(remote)
    generate_kwargs.setdefault("do_sample", False)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_OPEN_LOOP_WARNING)
        if not templates:  # an iter loop that touches no module would never advance
            with model.generate(**dict(encoding), max_new_tokens=max_new_tokens, remote=remote,
                                **generate_kwargs) as tracer:
                ids = nnsight.save(tracer.result)
            return GenerateResult(ids=ids, steps=[])
        with model.generate(max_new_tokens=max_new_tokens, remote=remote, **generate_kwargs) as tracer:
            with tracer.invoke(**dict(encoding)):
                steps = nnsight.save([])
                for _ in tracer.iter[:]:
                    steps.append(apply_in_order(model, templates))
            with tracer.invoke():
                ids = nnsight.save(tracer.result)
    return GenerateResult(ids=ids, steps=steps)


def _projection_path(vlm: VLM) -> Any:
    adapter = vlm.adapter
    return lambda layer: f"{adapter.attention_path(layer)}.{adapter.output_projection_attr}"
