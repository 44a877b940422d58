"""Layer sharing: a condition's layers below its first masked layer are the unmasked baseline's, computed once.

Zeroing heads changes nothing before the first layer it touches: for a condition whose first masked layer is
``L``, the keys, values and hidden states of layers ``< L`` are those of the unmasked run, as long as its tokens
are the unmasked run's. ``generate_layer_shared`` is ``interventions.generate_conditions`` over a shared image
prefix (``interventions.shared_image_prefix``) that uses this, in its own greedy loop over the language model's
decoder layers (the model's own modules, called one layer at a time):

* the image prefix: the unmasked rows run every layer; a condition's rows join at their first masked layer with
  the unmasked hidden state entering it, and take the unmasked keys and values of the layers below;
* the suffix (expression, generation prompt) and every decoding step: a row whose tokens so far equal its
  unmasked row's (``tied``) is computed only from its first masked layer on, from the unmasked row's hidden
  state there; below it its keys and values are copied from the unmasked row. The first token where a row
  differs unties it: from the next step it runs every layer, on its own (complete) cache;
* a row that has emitted EOS no longer needs any layer and gets no logits (``generate`` feeds every row until the
  last row stops); the pad token fills its place, as ``generate`` does, and the loop stops with the last row.

Rows are ordered by first masked layer (the unmasked rows first), so the rows that need a layer are about a
leading range of the batch: each layer runs that range (keys and values are views of one preallocated buffer,
no copies), and a not-needed row inside it is computed anyway, which gives what its unmasked row gives.

Exactness: the skipped computations are the same function of the same inputs as the ones reused; only the
grouping of rows into matrix products differs (other shapes), so values agree to float rounding and greedy
answers are tested equal to the library's other path and to plain HF ``generate`` with hooks
(tests/test_layer_sharing.py). Applies to zero ablation only, local models whose language model is a plain
Qwen2 / Llama decoder (``supported``: LLaVA-style wrappers, e.g. the toys), SDPA attention, greedy decoding
with the model's default generation settings; ``generate_layer_shared`` returns None otherwise (the caller
falls back) and where it would not pay (no condition starts masking above layer 0).

``ENABLED`` (module attribute) switches it off globally, e.g. to time the path without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

ENABLED = True
SUPPORTED_LAYERS = ("Qwen2DecoderLayer", "LlamaDecoderLayer")
SUPPORTED_WRAPPERS = ("LlavaForConditionalGeneration",)
_DEFAULT_GENERATION = {"repetition_penalty": (None, 1.0), "no_repeat_ngram_size": (None, 0),
                       "bad_words_ids": (None,), "suppress_tokens": (None,), "begin_suppress_tokens": (None,),
                       "min_length": (None, 0), "min_new_tokens": (None, 0), "forced_bos_token_id": (None,),
                       "forced_eos_token_id": (None,), "sequence_bias": (None,), "encoder_repetition_penalty":
                       (None, 1.0), "renormalize_logits": (None, False), "num_beams": (None, 1),
                       "do_sample": (None, False), "guidance_scale": (None, 1.0), "stop_strings": (None,),
                       "max_length": None, "exponential_decay_length_penalty": (None,)}


@dataclass
class SharingStats:
    """Row-layer computations of the last ``generate_layer_shared`` call: ``computed`` of ``total`` (a row's one
    layer at one token, prefix rows counted per condition and image); ``stopped``: row-steps after a row's EOS
    (no logits); ``steps``: decoding steps run."""

    computed: int = 0
    total: int = 0
    stopped: int = 0
    steps: int = 0


LAST_STATS = SharingStats()


def _language_model(hf_model: Any) -> Any | None:
    inner = getattr(hf_model, "model", None)
    return getattr(inner, "language_model", None)


def supported(vlm: Any) -> bool:
    """The model is one this path implements: a LLaVA-style wrapper over a plain Qwen2 / Llama decoder (full
    attention at every layer, SDPA), and nothing else in its forward (no sliding window, no M-RoPE)."""
    hf = vlm.hf_model
    if type(hf).__name__ not in SUPPORTED_WRAPPERS:
        return False
    lm = _language_model(hf)
    if lm is None or not all(hasattr(lm, a) for a in ("layers", "embed_tokens", "norm", "rotary_emb")):
        return False
    config = lm.config
    if any(type(layer).__name__ not in SUPPORTED_LAYERS for layer in lm.layers):
        return False
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ["full_attention"]):
        return False
    if getattr(config, "_attn_implementation", None) != "sdpa" or getattr(config, "use_sliding_window", False):
        return False
    if len(lm.layers) != vlm.geometry.num_layers or not hasattr(hf, "lm_head"):
        return False
    generation = hf.generation_config
    for name, allowed in _DEFAULT_GENERATION.items():
        if allowed is not None and getattr(generation, name, None) not in allowed:
            return False
    return True


def applies(vlm: Any, ablation_kinds: Sequence[str]) -> bool:
    """Whether ``generate_layer_shared`` can run for ``vlm`` with conditions of these ablation kinds (it may still
    decline a batch where sharing would not pay): switched on, a local handle, zero ablation only, ``supported``."""
    return (ENABLED and not getattr(vlm, "remote", False) and all(k == "zero" for k in ablation_kinds)
            and supported(vlm))


class _RowCache:
    """Preallocated keys and values of every row, per layer. The decoder layer's attention calls ``update`` with
    the new keys and values of the computed rows ``0:rows`` (the rows are ordered so that the computed ones
    come first: ``_Runner.run``), which are written at the step's positions; it gets back those rows' keys and
    values up to the step's end, a view (no copy)."""

    def __init__(self, layers: int, rows: int, heads: int, length: int, dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        # every position a row reads is written first (computed, or copied from its base row), so no zero fill
        self.k = [torch.empty(rows, heads, length, dim, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.empty(rows, heads, length, dim, dtype=dtype, device=device) for _ in range(layers)]
        self.rows = rows
        self.start = self.end = 0

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        k, v, n = self.k[layer_idx], self.v[layer_idx], self.rows
        k[:n, :, self.start:self.end] = key
        v[:n, :, self.start:self.end] = value
        return k[:n, :, :self.end], v[:n, :, :self.end]

    def copy_rows(self, layer: int, first_row: int, sources: torch.Tensor) -> None:
        """Rows ``first_row:`` (not computed at ``layer``) take their sources' keys and values of this step."""
        for buffer in (self.k[layer], self.v[layer]):
            buffer[first_row:, :, self.start:self.end] = buffer[sources, :, self.start:self.end]


class _Runner:
    """The decoder layers run on a leading range of rows, with per-row head masks on each ``o_proj`` input."""

    def __init__(self, vlm: Any, conditions: Sequence[Any]) -> None:
        hf = vlm.hf_model
        self.lm = _language_model(hf)
        self.lm_head = hf.lm_head
        self.layers = list(self.lm.layers)
        geometry = vlm.geometry
        self.n_layers, self.width = geometry.num_layers, geometry.num_heads * geometry.head_dim
        self.head_dim = geometry.head_dim
        param = next(self.lm.parameters())
        self.dtype, self.device = param.dtype, param.device
        # per condition: first masked layer (n_layers for none); per layer, the [conditions, width] 0/1
        # multipliers of o_proj's input (None where no condition masks the layer)
        self.first: list[int] = []
        tables: dict[int, torch.Tensor] = {}
        for c, heads in enumerate(conditions):
            grouped = heads.by_layer() if heads is not None else {}
            self.first.append(min(grouped) if grouped else self.n_layers)
            for layer, indices in grouped.items():
                table = tables.setdefault(layer, torch.ones(len(conditions), self.width, dtype=self.dtype,
                                                            device=self.device))
                for h in indices:
                    table[c, h * self.head_dim:(h + 1) * self.head_dim] = 0
        self.tables = tables
        self.current: torch.Tensor | None = None  # [rows, 1, width] multiplier of the running layer, or None
        self.stats = SharingStats()

    def hook(self, module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if self.current is None:
            return None
        return (args[0] * self.current,) + tuple(args[1:])

    def run(self, h: torch.Tensor, cache: _RowCache, *, condition_of: torch.Tensor, base_of: torch.Tensor,
            first_of: torch.Tensor, is_base: torch.Tensor, tied: torch.Tensor, live: torch.Tensor,
            positions: torch.Tensor, key_mask: torch.Tensor | None, start: int, end: int,
            copy: bool = True) -> torch.Tensor:
        """One forward over positions ``start:end`` (``h``: ``[rows, end - start, hidden]`` embeddings). At each
        layer the rows ``0:n`` run, ``n`` one past the last row that must: a base row, a row no longer tied to
        its base row, or a tied row at or above its first masked layer (rows come in order of first masked
        layer, base rows first, so ``n`` is about the count of such rows; a tied row inside the range is
        computed although it need not be, which gives what its base row gives). The rows past ``n`` are tied
        rows below their first masked layer: they take their base row's keys and values, and, when they join,
        its hidden state. ``key_mask`` (``[rows, end]``: True where a key may be attended; None: every row
        sees every earlier key) and causality give the attention mask. Returns the final hidden states of
        the rows that ran at the last layer (the rows past them: stale). ``copy=False``: the rows past ``n``
        keep no keys and values (the caller reads the base rows' instead: ``self.ran[layer]`` is ``n``)."""
        import os

        cache.start, cache.end = start, end
        rows, q = h.shape[0], end - start
        cos_all, sin_all = self.lm.rotary_emb(h, positions)
        full_mask = None
        if key_mask is not None:
            causal = torch.arange(end, device=h.device)[None, :] <= torch.arange(start, end, device=h.device)[:, None]
            full_mask = key_mask[:, None, None, :] & causal[None, None]  # [rows, 1, q, end]
        always = live & (is_base | ~tied)
        index = torch.arange(rows, device=h.device)
        done = 0  # rows 0:done hold the hidden state entering the current layer
        self.ran = []
        # a masked multi-token step would repeat keys and values per query head (``repeat_kv``); SDPA's grouped
        # attention gives the same values without the copies
        force = key_mask is not None and q > 1
        previous = os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA")
        if force:
            os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "1"
        try:
            for layer_idx, layer in enumerate(self.layers):
                needed = always | (live & (first_of <= layer_idx))
                n = int(index[needed].max()) + 1 if bool(needed.any()) else 0
                if n > done:  # rows joining here (tied: every row not tied runs from layer 0) take the base
                    if layer_idx:  # row's hidden state entering this layer; at layer 0 each has its embedding
                        h[done:n] = h[base_of[done:n]]
                    done = n
                self.stats.computed += n * q
                self.stats.total += int(live.sum()) * q
                cache.rows = n
                self.ran.append(n)
                table = self.tables.get(layer_idx)
                self.current = None if table is None else table[condition_of[:n]][:, None, :]
                mask = None if full_mask is None else full_mask[:n]
                if n == rows:
                    h = layer(h, attention_mask=mask, position_embeddings=(cos_all, sin_all), position_ids=None,
                              cache=cache, use_cache=True)
                elif n:
                    h[:n] = layer(h[:n], attention_mask=mask, position_embeddings=(cos_all[:n], sin_all[:n]),
                                  position_ids=None, cache=cache, use_cache=True)
                self.current = None
                if n < rows and copy:
                    cache.copy_rows(layer_idx, n, base_of[n:])
        finally:
            if force:
                if previous is None:
                    os.environ.pop("TRANSFORMERS_SDPA_FORCE_GQA", None)
                else:
                    os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = previous
        return h

    def logits(self, h_last: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.lm.norm(h_last)).float()


def row_block(value: torch.Tensor, rows: int, row: int) -> torch.Tensor:
    """Row ``row``'s block of a per-image tensor of ``rows`` equal blocks (one row each, or InternVL's tiles:
    equal prefix lengths mean equal image-token counts, so equal tile counts)."""
    size = value.shape[0] // rows
    return value[row * size:(row + 1) * size]


def _prefix_embeddings(vlm: Any, encoding: Mapping[str, Any], prefix: Any) -> torch.Tensor:
    """``[images, length, hidden]``: the distinct image prefixes' input embeddings with the image features in
    place of the image tokens (``LlavaModel.forward``'s merge)."""
    hf = vlm.hf_model
    rows = int(encoding["input_ids"].shape[0])
    image_inputs = {key: torch.cat([row_block(value, rows, r) for r in prefix.first], dim=0)
                    for key, value in encoding.items() if key not in ("input_ids", "attention_mask")}
    ids = prefix.ids
    embeds = hf.model.get_input_embeddings()(ids)
    features = hf.model.get_image_features(**image_inputs, return_dict=True).pooler_output
    features = torch.cat(list(features), dim=0).to(embeds.device, embeds.dtype)
    where = hf.model.get_placeholder_mask(ids, inputs_embeds=embeds, image_features=features)
    return embeds.masked_scatter(where, features)


def generate_layer_shared(vlm: Any, encoding: Mapping[str, Any], conditions: Sequence[tuple[Any, Any]],
                          prefix: Any, *, max_new_tokens: int,
                          **generate_kwargs: Any) -> list[torch.Tensor] | None:
    """``interventions.generate_conditions`` for a batch with a shared image prefix, every condition zero-ablating
    (or unmasked), with layer sharing (module docstring); None where it does not apply or would not pay (the
    caller then takes its usual path). Returns one ``[batch, prompt + new]`` id tensor per condition: the
    original left-padded prompt ids, then the new tokens (the pad token after a row's EOS, up to the step where
    the last row of the call stopped)."""
    global LAST_STATS
    kinds = [a.kind for h, a in conditions if h is not None and len(h)]
    if not conditions or max_new_tokens < 1 or not applies(vlm, kinds):  # ``applies``: also not a remote handle
        return None
    if any(k != "do_sample" or v for k, v in generate_kwargs.items()):
        return None
    given = [h if h is not None and len(h) else None for h, _ in conditions]
    n_layers = vlm.geometry.num_layers
    first_given = [min(h.by_layer()) if h is not None else n_layers for h in given]
    saved = sum(f for f, h in zip(first_given, given) if h is not None)  # row-layers below first masked layers
    base = next((c for c, h in enumerate(given) if h is None), None)
    if saved == 0 or (base is None and saved <= n_layers):
        return None  # nothing to share, or less than an unmasked run to share from would cost
    # internal order: the unmasked condition first (added if missing, not returned), then by first masked layer
    order = ([base] if base is not None else [-1]) + sorted((c for c, h in enumerate(given) if h is not None),
                                                            key=lambda c: first_given[c])
    heads = [given[c] if c >= 0 else None for c in order]
    hf = vlm.hf_model
    generation = hf.generation_config
    eos = generation.eos_token_id
    eos_ids = torch.tensor([eos] if isinstance(eos, int) else list(eos or []), dtype=torch.long)
    pad = generation.pad_token_id  # as ``generate``: the first EOS where the model names no pad token
    if pad is None:
        pad = int(eos_ids[0]) if len(eos_ids) else 0

    runner = _Runner(vlm, heads)
    ids = encoding["input_ids"]
    device = runner.device
    batch = int(ids.shape[0])
    count, images, length = len(heads), len(prefix.first), prefix.length
    kv_heads = runner.lm.config.num_key_value_heads
    suffixes = [ids[r, prefix.starts[r] + length:] for r in range(batch)]
    longest = max(len(s) for s in suffixes)
    total = length + longest + max_new_tokens
    first_t = torch.tensor(runner.first, device=device)
    hooks = [layer.self_attn.o_proj.register_forward_pre_hook(runner.hook) for layer in runner.layers]
    new: list[torch.Tensor] = []
    try:
        with torch.no_grad():
            # 1. the image prefix: rows condition-major (internal order), images per condition
            embeds = _prefix_embeddings(vlm, encoding, prefix).to(device)
            p_rows = count * images
            p_condition = torch.arange(count, device=device).repeat_interleave(images)
            p_image = torch.arange(images, device=device).repeat(count)
            p_cache = _RowCache(n_layers, p_rows, kv_heads, length, runner.head_dim, runner.dtype, device)
            everyone = torch.ones(p_rows, dtype=torch.bool, device=device)
            runner.run(embeds.repeat(count, 1, 1), p_cache, condition_of=p_condition, base_of=p_image,
                       first_of=first_t[p_condition], is_base=p_condition == 0, tied=everyone, live=everyone,
                       positions=torch.arange(length, device=device)[None].expand(p_rows, -1), key_mask=None,
                       start=0, end=length, copy=False)
            # 2. every row (condition-major, the batch's rows per condition) gets its image's prefix keys, values
            rows = count * batch
            condition_of = torch.arange(count, device=device).repeat_interleave(batch)
            item = torch.arange(batch, device=device).repeat(count)
            image_of = torch.tensor(prefix.image_of, device=device)
            cache = _RowCache(n_layers, rows, kv_heads, total, runner.head_dim, runner.dtype, device)
            gather = condition_of * images + image_of[item]
            for layer in range(n_layers):  # a prefix row that did not run at this layer: its base row's
                source = torch.where(gather < runner.ran[layer], gather, image_of[item])
                cache.k[layer][:, :, :length].copy_(p_cache.k[layer].index_select(0, source))
                cache.v[layer][:, :, :length].copy_(p_cache.v[layer].index_select(0, source))
            del p_cache
            key_mask = torch.zeros(rows, total, dtype=torch.bool, device=device)
            key_mask[:, :length] = True
            suffix_ids = torch.full((batch, longest), int(pad), dtype=ids.dtype, device=device)
            positions = torch.zeros(batch, longest, dtype=torch.long, device=device)
            for r, suffix in enumerate(suffixes):
                suffix_ids[r, longest - len(suffix):] = suffix.to(device)
                positions[r, longest - len(suffix):] = torch.arange(length, length + len(suffix), device=device)
                key_mask[torch.arange(count, device=device) * batch + r,
                         length + longest - len(suffix):length + longest] = True
            # 3. the suffix, then one token per step
            state = {"condition_of": condition_of, "base_of": item, "first_of": first_t[condition_of],
                     "is_base": condition_of == 0}
            tied = torch.ones(rows, dtype=torch.bool, device=device)
            live = torch.ones(rows, dtype=torch.bool, device=device)
            x = runner.lm.embed_tokens(suffix_ids.repeat(count, 1))
            step_positions = positions.repeat(count, 1)
            start, end = length, length + longest
            eos_dev = eos_ids.to(device)
            for step in range(max_new_tokens):
                h = runner.run(x, cache, **state, tied=tied, live=live, positions=step_positions,
                               key_mask=key_mask[:, :end], start=start, end=end)
                live_rows = live.nonzero().squeeze(1)
                tokens = torch.full((rows,), int(pad), dtype=torch.long, device=device)
                tokens[live_rows] = runner.logits(h[live_rows, -1]).argmax(dim=-1)
                new.append(tokens)
                runner.stats.stopped += int((~live).sum())
                tied = tied & (tokens == tokens[item])
                live = live & ~torch.isin(tokens, eos_dev)
                if not bool(live.any()) or step == max_new_tokens - 1:
                    break
                key_mask[:, end] = True
                x = runner.lm.embed_tokens(tokens)[:, None, :]
                step_positions = step_positions[:, -1:] + 1
                start, end = end, end + 1
    finally:
        for hook in hooks:
            hook.remove()
    runner.stats.steps = len(new)
    LAST_STATS = runner.stats
    out = torch.stack(new, dim=1).to(ids.device, ids.dtype)
    parts = out.split(batch, dim=0)
    by_condition = {c: parts[i] for i, c in enumerate(order)}
    return [torch.cat([ids, by_condition[c]], dim=1) for c in range(len(conditions))]
