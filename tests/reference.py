"""Independent plain-PyTorch references: forward hooks on the HF modules and eager attention.

Nothing here uses vrh_interp's adapters, templates or nnsight: the language backbone is found through
transformers' own ``get_decoder()``, heads are sliced by hand, so a wrong module path, head slice or
readout in the library cannot also be wrong here.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import torch


def decoder_layers(model: Any) -> Any:
    return model.get_decoder().layers


def text_geometry(model: Any) -> tuple[int, int]:
    tc = model.config.get_text_config()
    # Qwen2-VL / Qwen2.5-VL / GLM-4V text configs have no head_dim: their attention uses hidden // heads
    return tc.num_attention_heads, getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads


@contextmanager
def zeroed_heads(model: Any, heads_by_layer: dict[int, list[int]]) -> Iterator[None]:
    """Zero heads' slices of o_proj's input with forward pre-hooks."""
    num_heads, head_dim = text_geometry(model)
    handles = []
    for layer, heads in heads_by_layer.items():
        def pre_hook(_module: Any, args: tuple[Any, ...], heads: list[int] = heads) -> tuple[Any, ...]:
            x = args[0].clone()
            b, s, _ = x.shape
            x.view(b, s, num_heads, head_dim)[:, :, heads] = 0
            return (x, *args[1:])

        o_proj = decoder_layers(model)[layer].self_attn.o_proj
        handles.append(o_proj.register_forward_pre_hook(pre_hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def zeroed_attention_outputs(model: Any, layers: Iterable[int]) -> Iterator[None]:
    """Replace the whole attention block output of ``layers`` with zeros."""
    def hook(_module: Any, _inputs: Any, output: Any) -> Any:
        return (torch.zeros_like(output[0]), *output[1:])

    handles = [decoder_layers(model)[layer].self_attn.register_forward_hook(hook) for layer in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def captured_o_proj_inputs(model: Any, encoding: dict[str, Any]) -> dict[int, torch.Tensor]:
    """o_proj inputs of every layer, reshaped ``[batch, seq, heads, head_dim]``."""
    num_heads, head_dim = text_geometry(model)
    captured: dict[int, torch.Tensor] = {}
    handles = []
    for layer, block in enumerate(decoder_layers(model)):
        def pre_hook(_module: Any, args: tuple[Any, ...], layer: int = layer) -> None:
            b, s, _ = args[0].shape
            captured[layer] = args[0].detach().clone().view(b, s, num_heads, head_dim)

        handles.append(block.self_attn.o_proj.register_forward_pre_hook(pre_hook))
    try:
        with torch.no_grad():
            model(**encoding)
    finally:
        for handle in handles:
            handle.remove()
    return captured


def eager_attention_maps(model: Any, encoding: dict[str, Any]) -> list[torch.Tensor]:
    """Full eager attention maps ``[batch, heads, q, k]`` per LM layer (the OOM-prone reference)."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(**encoding, output_attentions=True)
    finally:
        model.set_attn_implementation(previous)
    return [a.float() for a in out.attentions]


@contextmanager
def edited_o_proj_inputs(model: Any, edits: dict[int, Any]) -> Iterator[None]:
    """Edit o_proj's input per layer with forward pre-hooks: ``edits[layer](x)`` gets ``[b, s, heads, head_dim]``
    (a clone) and edits it in place."""
    num_heads, head_dim = text_geometry(model)
    handles = []
    for layer, edit in edits.items():
        def pre_hook(_module: Any, args: tuple[Any, ...], edit: Any = edit) -> tuple[Any, ...]:
            x = args[0].clone()
            b, s, _ = x.shape
            edit(x.view(b, s, num_heads, head_dim))
            return (x, *args[1:])

        handles.append(decoder_layers(model)[layer].self_attn.o_proj.register_forward_pre_hook(pre_hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
