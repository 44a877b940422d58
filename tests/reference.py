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
    # every sub-model's own implementation is restored (PaliGemma 2: sdpa, but eager for its Gemma 2 backbone)
    previous = {key: getattr(model.config, key)._attn_implementation for key in model.config.sub_configs
                if getattr(model.config, key, None) is not None}
    previous[""] = model.config._attn_implementation
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


# Segments of the ablation kinds, by the reference's own rule: visual = the config's image token, answer = every
# position from the prompt length on, pad = attention mask 0, prompt = the rest.
PAD, VISUAL, PROMPT, ANSWER = -1, 0, 1, 2


def reference_segments(model: Any, encoding: dict[str, Any], prompt_length: int) -> torch.Tensor:
    config = model.config
    image_token = getattr(config, "image_token_id", None)
    image_token = image_token if image_token is not None else config.image_token_index
    ids = encoding["input_ids"].cpu()
    segments = torch.full(ids.shape, PROMPT, dtype=torch.long)
    segments[ids == image_token] = VISUAL
    segments[:, prompt_length:] = ANSWER
    segments[encoding["attention_mask"].cpu() == 0] = PAD
    return segments


def segment_sums(model: Any, encoding: dict[str, Any], segments: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, layer and segment (visual, prompt, answer): the sum of o_proj's input over the segment's
    positions ``[batch, layers, 3, heads * head_dim]`` and the token counts ``[batch, 3]``."""
    captured = captured_o_proj_inputs(model, encoding)
    batch = segments.shape[0]
    sums = torch.zeros(batch, len(captured), 3, captured[0].shape[2] * captured[0].shape[3], dtype=torch.float64)
    counts = torch.zeros(batch, 3, dtype=torch.long)
    for row in range(batch):
        for segment in range(3):
            where = segments[row] == segment
            counts[row, segment] = int(where.sum())
            for layer, outputs in captured.items():
                sums[row, layer, segment] = outputs[row][where].double().sum(0).reshape(-1)
    return sums, counts


@contextmanager
def replaced_heads(model: Any, heads_by_layer: dict[int, list[int]], tables: dict[int, torch.Tensor],
                   segments: torch.Tensor) -> Iterator[None]:
    """Replace heads' slices of o_proj's input position by position with ``tables[layer][row or 0, segment]``
    (``[rows, 3, heads * head_dim]``): on a forward as long as ``segments`` each position's segment, on a
    one-token decode step the answer segment; padding untouched."""
    num_heads, head_dim = text_geometry(model)

    def replacer(heads: list[int], table: torch.Tensor) -> Any:
        def edit(view: torch.Tensor) -> None:
            b, s = view.shape[:2]
            if s == segments.shape[1]:
                here = segments
            else:
                assert s == 1, f"unexpected forward of {s} tokens"
                here = torch.full((b, 1), ANSWER)
            for row in range(b):
                values = table[row if table.shape[0] > 1 else 0].view(3, num_heads, head_dim)
                for pos in range(s):
                    segment = int(here[row, pos])
                    if segment != PAD:
                        for head in heads:
                            view[row, pos, head] = values[segment, head]
        return edit

    with edited_o_proj_inputs(model,
                              {layer: replacer(heads, tables[layer]) for layer, heads in heads_by_layer.items()}):
        yield


def forced_log_probs(logits: torch.Tensor, row: int, prompt_length: int, length: int,
                     input_ids: torch.Tensor) -> torch.Tensor:
    """Teacher forcing by hand: log p of the ``length`` answer tokens appended to ``row``'s prompt, read back from
    ``input_ids`` (position ``prompt_length - 1 + t`` predicts the token at ``prompt_length + t``)."""
    log_probs = logits[row].double().log_softmax(-1)
    return torch.stack([log_probs[prompt_length - 1 + t, int(input_ids[row, prompt_length + t])]
                        for t in range(length)])


@contextmanager
def redirected_attention(model: Any, heads_by_layer: dict[int, list[int]], alpha: float,
                         target_keys: torch.Tensor) -> Iterator[None]:
    """Add ``alpha`` to the pre-softmax scores of ``heads_by_layer``'s heads on the keys ``target_keys``
    (``[batch, prompt_len]`` booleans) at the query rows that produce answer tokens (the last row of a forward with
    several queries, the one query of a generation step), in attention written out by hand.

    The steered layers' attention is replaced through transformers' own ``AttentionInterface`` by eager attention
    computed here (scores scaled, soft-capped, masked, the bias added to the chosen heads only, softmax, times the
    values); every other attention call (other layers, the vision tower) runs the implementation it ran before."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import eager_mask

    layers = decoder_layers(model)
    steered = {id(layers[layer].self_attn): heads for layer, heads in heads_by_layer.items()}
    configs = {"": model.config, **{key: getattr(model.config, key) for key in model.config.sub_configs
                                    if getattr(model.config, key, None) is not None}}
    previous = {key: config._attn_implementation for key, config in configs.items()}
    before = {id(m): getattr(getattr(m, "config", None), "_attn_implementation", "sdpa") for m in model.modules()}

    def delegate(module: Any, *args: Any, **kwargs: Any) -> Any:
        if before.get(id(module)) == "eager":
            import sys

            return sys.modules[type(module).__module__].eager_attention_forward(module, *args, **kwargs)
        return sdpa_attention_forward(module, *args, **kwargs)

    def attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: Any = None, scaling: float | None = None, dropout: float = 0.0,
                  **kwargs: Any) -> Any:
        if id(module) not in steered:
            return delegate(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        mask = attention_mask
        b, h, q, d = query.shape
        k = key.shape[2]
        group = h // key.shape[1]
        keys = key.repeat_interleave(group, dim=1).double()
        values = value.repeat_interleave(group, dim=1).double()
        scores = query.double() @ keys.transpose(-1, -2) * (scaling if scaling is not None else d ** -0.5)
        softcap = kwargs.get("softcap")
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        if mask is not None:
            mask = mask[:, :, :, :k]
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.double()
        elif q > 1:
            allowed = torch.arange(k)[None, :] <= torch.arange(q)[:, None] + (k - q)
            scores = scores.masked_fill(~allowed, float("-inf"))
        bias = torch.zeros(b, h, q, k, dtype=torch.float64)
        target = torch.zeros(b, k, dtype=torch.float64)
        width = min(k, target_keys.shape[1])
        target[:, :width] = target_keys[:, :width].double()
        for head in steered[id(module)]:
            bias[:, head, q - 1, :] = alpha * target
        probs = torch.softmax(scores + bias.to(scores.device), dim=-1).nan_to_num(0.0)
        out = (probs @ values).to(query.dtype)
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register("vrh_reference_redirect", attention)
    AttentionMaskInterface.register("vrh_reference_redirect", eager_mask)
    model.set_attn_implementation("vrh_reference_redirect")
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
