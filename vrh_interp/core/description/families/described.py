"""A declarative description of a language backbone's attention, for models whose code is not transformers'.

Models that need their authors' code (``trust_remote_code``) have attention modules the built-in adapters do
not know: InternLM2's fused ``wqkv`` / ``wo``, other layer paths, attention written without transformers'
``attention_interface`` call (which the default readout reads through nnsight ``.source``). An
``AttentionDescription`` states the facts that head-level work needs, as plain data:

* where the attention modules are (``attention``: a dotted path with ``{layer}``) and the name of the output
  projection inside them: per-head ablation, capture and patching act on the ``head_dim`` slices of that
  projection's INPUT, exactly as for built-in families (the same templates, given other paths);
* the head grid (layers, query heads, KV heads, head_dim), stated, not guessed from hidden sizes;
* how queries and keys are made: separate ``q``/``k`` projections (optionally per-head q/k norms), one fused
  projection with its packing layout (``FusedQKV``) or multi-head latent attention (``LatentQKV``), then rotary
  position embedding (``Rotary``, or the ``(cos, sin)`` the model passes to the module), the softmax scaling and
  any logit soft-capping.

The memory-efficient readout (``DescribedRowsReadout``) then needs nothing from inside the attention forward:
it reads the projections' outputs and the module's inputs (positions, mask), recomputes post-rotary queries
and keys, keeps each layer's keys across generation steps itself, and computes softmax(q K^T) for the
requested rows only. What it cannot recompute honestly it refuses (see ``Rotary``): rope scalings that change
frequencies (YaRN included, hence MLA checkpoints that use it), ALiBi and relative biases have no description.

The visual side (image tokens, layouts, prompts, box formats) is not described here: a ``DescribedAdapter``
takes it from a ``FamilyAdapter`` (a built-in one, or the user's subclass for a processor the library does
not ship). ``vrh_interp.wrap(model, processor, attention=description)`` builds one and checks the
description against the model's modules before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Mapping, Sequence

import torch

from vrh_interp.core.description.families.base import BoxFrame, FamilyAdapter, VisualLayout
from vrh_interp.core.description.heads import HeadGeometry
from vrh_interp.core.execution.templates import module_at
from vrh_interp.core.execution.templates.readout import AttentionRowsReadout, ReadoutUnavailableError

MODULE_ROTARY = "position_embeddings"
"""``rotary=MODULE_ROTARY``: the module receives ``(cos, sin)`` as its ``position_embeddings`` argument
(transformers-style modules, mRoPE included: the model has already merged the sections) and applies them
rotate-half style to the first ``cos.shape[-1]`` dimensions of every head."""


class AttentionDescriptionError(ValueError):
    """An attention description does not match the model it is applied to, or describes what is unsupported."""


@dataclass(frozen=True)
class SeparateQKV:
    """Separate query / key / value projections (``nn.Linear`` outputs ``[b, s, heads * head_dim]``).

    ``q_norm`` / ``k_norm``: per-head norm modules applied to the projected queries / keys before rotary
    (Qwen3, Gemma 3); when set, queries / keys are read from these modules' outputs.
    """

    q: str = "q_proj"
    k: str = "k_proj"
    v: str = "v_proj"
    q_norm: str | None = None
    k_norm: str | None = None


QKVLayout = Literal["grouped", "concatenated"]


@dataclass(frozen=True)
class FusedQKV:
    """One projection computing queries, keys and values; ``layout`` says how its output is packed.

    * ``grouped``: per KV head g, ``num_heads / num_kv_heads`` query heads, then its key, then its value, each
      ``head_dim`` wide (InternLM2's ``wqkv``: ``(kv_heads, group + 2, head_dim)``; query head ``g * group + j``);
    * ``concatenated``: all queries, then all keys, then all values (Phi-3's ``qkv_proj``).
    """

    name: str = "wqkv"
    layout: QKVLayout = "grouped"

    def __post_init__(self) -> None:
        if self.layout not in ("grouped", "concatenated"):
            raise AttentionDescriptionError(
                f"fused qkv layout must be 'grouped' or 'concatenated', not {self.layout!r}")


@dataclass(frozen=True)
class LatentQKV:
    """Multi-head latent attention (DeepSeek-V2 / V3; DeepSeek-VL2-Small's language model).

    Queries: ``q`` (``q_proj``, or ``q_b_proj`` with a query LoRA rank), per head ``qk_nope_head_dim`` then
    ``qk_rope_head_dim``. Keys and values come from ONE latent shared by all heads: ``kv_a`` outputs the latent
    (``kv_lora_rank``) and a single rotary key part (``qk_rope_head_dim``, shared by every head); ``kv_norm`` is
    the latent's norm and ``kv_b`` expands it per head into the key's non-rotary part and the value
    (``qk_nope_head_dim + head_dim`` per head). A head is still one of the ``num_heads`` query heads and its
    output the ``head_dim`` (``v_head_dim``) slice of the output projection's input; the latent is not per head.
    Keys are recomputed from ``kv_norm``'s output (this forward's tokens) and ``kv_b``'s weight, so it does not
    matter whether the model caches the latent or the expanded keys. The rotary part is the last
    ``qk_rope_head_dim`` of each query / key head; describe it with ``Rotary(theta, rotary_dim=qk_rope_head_dim,
    interleaved=True)`` (DeepSeek rotates pairs (2i, 2i + 1)).
    """

    qk_nope_head_dim: int
    qk_rope_head_dim: int
    kv_lora_rank: int
    q: str = "q_proj"
    kv_a: str = "kv_a_proj_with_mqa"
    kv_norm: str = "kv_a_layernorm"
    kv_b: str = "kv_b_proj"

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class Rotary:
    """Rotary position embedding computed from the ``position_ids`` the attention module receives.

    ``inv_freq[i] = theta ** (-2i / rotary_dim)``; ``rotary_dim`` (default: all of ``head_dim``) are the
    leading dimensions of a head that rotate (partial rotary), the rest pass through. ``interleaved=False``
    rotates dimension i with i + rotary_dim / 2 (Llama, InternLM2: ``rotate_half``); ``True`` rotates pairs
    (2i, 2i + 1) (GPT-J style). ``max_positions``: for dynamic-NTK scaling (InternLM2.5's ``"dynamic"``), which
    equals plain RoPE while the sequence fits the trained context; positions beyond it are refused, since the
    scaled frequencies depend on the implementation. Other rope types (linear, YaRN, Llama 3 scaling) change
    the frequencies everywhere and are not described: use ``MODULE_ROTARY`` when the model passes ``(cos, sin)``.
    """

    theta: float
    rotary_dim: int | None = None
    interleaved: bool = False
    max_positions: int | None = None

    def cos_sin(self, position_ids: torch.Tensor, head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """``(cos, sin)`` ``[batch, seq, rotary_dim]`` for ``position_ids`` ``[batch or 1, seq]`` (float32, then
        ``dtype``, as transformers' rotary embeddings compute them)."""
        dim = self.rotary_dim or head_dim
        if position_ids.dim() != 2:
            raise ReadoutUnavailableError(
                f"position_ids of shape {tuple(position_ids.shape)}: a Rotary description needs one position per "
                "token ([batch, seq]); multimodal RoPE (several position axes) is described by MODULE_ROTARY")
        if self.max_positions is not None and int(position_ids.max()) >= self.max_positions:
            raise ReadoutUnavailableError(
                f"position {int(position_ids.max())} is beyond max_positions={self.max_positions}, where this "
                "model's rotary scaling departs from plain RoPE; use shorter prompts")
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        freqs = position_ids[..., None].float() * inv_freq.to(position_ids.device)
        emb = freqs.repeat_interleave(2, dim=-1) if self.interleaved else torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool = False) -> torch.Tensor:
    """Rotate ``x`` ``[b, heads, s, head_dim]`` by ``cos`` / ``sin`` ``[b, s, rotary_dim]``; dimensions past
    ``rotary_dim`` pass through (partial rotary)."""
    dim = cos.shape[-1]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rot, rest = (x, None) if dim == x.shape[-1] else (x[..., :dim], x[..., dim:])
    if interleaved:
        pairs = rot.unflatten(-1, (-1, 2))
        turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    else:
        turned = torch.cat((-rot[..., dim // 2:], rot[..., : dim // 2]), dim=-1)
    out = rot * cos + turned * sin
    return out if rest is None else torch.cat((out, rest), dim=-1)


@dataclass(frozen=True)
class AttentionDescription:
    """Where a language backbone's attention lives and how it computes its scores (plain data).

    ``attention``: dotted path of layer ``{layer}``'s attention module on the model passed to ``wrap``
    (e.g. ``"language_model.model.layers.{layer}.attention"``); ``output_projection``: its output projection's
    name inside that module; ``head_dim`` is a head's width there (MLA: ``v_head_dim``). ``rotary``: a ``Rotary``,
    ``MODULE_ROTARY``, or None (no position encoding in the attention). ``scaling``: the softmax scale (default
    ``head_dim ** -0.5``; MLA: ``(qk_nope_head_dim + qk_rope_head_dim) ** -0.5``); ``softcap``: tanh logit
    soft-capping. ``mask``: the argument carrying the attention mask (``[b, 1, q, k]`` boolean or additive,
    or None for plain causal attention), ``position_ids``: the argument carrying positions, as the module's
    forward names them. ``source``: where these facts were read (shown in provenance and docs).
    """

    attention: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    qkv: SeparateQKV | FusedQKV | LatentQKV = field(default_factory=SeparateQKV)
    output_projection: str = "o_proj"
    rotary: Rotary | str | None = MODULE_ROTARY
    scaling: float | None = None
    softcap: float | None = None
    mask: str = "attention_mask"
    position_ids: str = "position_ids"
    source: str = ""

    def __post_init__(self) -> None:
        if "{layer}" not in self.attention:
            raise AttentionDescriptionError(f"attention path {self.attention!r} has no '{{layer}}' placeholder, e.g. "
                                            "'language_model.model.layers.{layer}.attention'")
        try:
            self.geometry()
        except ValueError as err:
            raise AttentionDescriptionError(f"attention description: {err}") from err
        if isinstance(self.rotary, str) and self.rotary != MODULE_ROTARY:
            raise AttentionDescriptionError(f"rotary must be a Rotary, {MODULE_ROTARY!r} or None, not {self.rotary!r}")
        if isinstance(self.qkv, LatentQKV):
            self._check_latent(self.qkv)
        elif isinstance(self.rotary, Rotary) and (self.rotary.rotary_dim or self.head_dim) > self.head_dim:
            raise AttentionDescriptionError(f"rotary_dim {self.rotary.rotary_dim} exceeds head_dim {self.head_dim}")

    def _check_latent(self, latent: LatentQKV) -> None:
        if self.num_kv_heads != self.num_heads:
            raise AttentionDescriptionError(
                f"multi-head latent attention expands its shared latent into one key per query head: num_kv_heads "
                f"must equal num_heads ({self.num_heads}), not {self.num_kv_heads}")
        if not isinstance(self.rotary, Rotary) or self.rotary.rotary_dim != latent.qk_rope_head_dim:
            raise AttentionDescriptionError(
                f"multi-head latent attention needs rotary=Rotary(theta, rotary_dim={latent.qk_rope_head_dim}, "
                f"interleaved=True) (its qk_rope_head_dim), not {self.rotary!r}")

    def geometry(self) -> HeadGeometry:
        return HeadGeometry(self.num_layers, self.num_heads, self.num_kv_heads, self.head_dim)

    def attention_path(self, layer: int) -> str:
        return self.attention.format(layer=layer)

    def softmax_scaling(self) -> float:
        if self.scaling is not None:
            return self.scaling
        return (self.qkv.qk_head_dim if isinstance(self.qkv, LatentQKV) else self.head_dim) ** -0.5

    def check(self, model: Any) -> None:
        """Resolve every layer's modules on ``model`` and check their shapes against the stated head grid;
        AttentionDescriptionError naming the first mismatch and the fix."""
        width_q, width_kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        paths = [self.attention_path(layer) for layer in range(self.num_layers)]
        try:  # the layer list is the path before "{layer}"
            found = len(module_at(model, self.attention.split("{layer}")[0].rstrip(".")))
        except (AttributeError, IndexError, TypeError):
            found = None
        if found is not None and found != self.num_layers:
            raise AttentionDescriptionError(f"the description says {self.num_layers} layers, the model's layer list "
                                            f"has {found}: fix num_layers")
        if isinstance(self.qkv, FusedQKV):
            expected = {self.qkv.name: (None, width_q + 2 * width_kv)}
        elif isinstance(self.qkv, LatentQKV):
            latent = self.qkv
            expected = {latent.q: (None, self.num_heads * latent.qk_head_dim),
                        latent.kv_a: (None, latent.kv_lora_rank + latent.qk_rope_head_dim),
                        latent.kv_b: (latent.kv_lora_rank, self.num_heads * (latent.qk_nope_head_dim + self.head_dim))}
        else:
            expected = {self.qkv.q: (None, width_q), self.qkv.k: (None, width_kv), self.qkv.v: (None, width_kv)}
        expected[self.output_projection] = (width_q, None)
        for path in paths:
            try:
                attention = module_at(model, path)
            except (AttributeError, IndexError, TypeError) as err:
                raise AttentionDescriptionError(f"no attention module at {path!r} ({err}): fix the attention path "
                                                f"(the model's top-level children: {_children(model)})") from None
            for name, (inputs, outputs) in expected.items():
                linear = getattr(attention, name, None)
                if not isinstance(linear, torch.nn.Linear):
                    raise AttentionDescriptionError(
                        f"{path}.{name} is {type(linear).__name__}, not an nn.Linear: the module has "
                        f"{_children(attention)}; fix the projection names in the description")
                if inputs is not None and linear.in_features != inputs:
                    raise AttentionDescriptionError(
                        f"{path}.{name} takes {linear.in_features} inputs but {self.num_heads} heads x head_dim "
                        f"{self.head_dim} = {inputs}: fix num_heads / head_dim")
                if outputs is not None and linear.out_features != outputs:
                    raise AttentionDescriptionError(
                        f"{path}.{name} has {linear.out_features} outputs but the description implies {outputs} "
                        f"({self.num_heads} heads, {self.num_kv_heads} KV heads, head_dim {self.head_dim}): fix them")
            if isinstance(self.qkv, LatentQKV) and not isinstance(getattr(attention, self.qkv.kv_norm, None),
                                                                  torch.nn.Module):
                raise AttentionDescriptionError(f"{path} has no module {self.qkv.kv_norm!r} (the latent's norm): the "
                                                f"module has {_children(attention)}; fix LatentQKV.kv_norm")

    def queries_and_keys(self, attention: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-rotary queries ``[b, heads, s, head_dim]`` and keys ``[b, kv_heads, s, head_dim]`` from the outputs
        of ``attention``'s projections (a module envoy inside a trace; read in the order the forward runs them).
        MLA: ``[b, heads, s, qk_head_dim]`` both, the rotary part FIRST (a permutation that leaves q . k as is)."""
        if isinstance(self.qkv, LatentQKV):
            return self._latent_queries_and_keys(attention, self.qkv)
        if isinstance(self.qkv, FusedQKV):
            packed = module_at(attention, self.qkv.name).output
            b, s, _ = packed.shape
            group = self.num_heads // self.num_kv_heads
            if self.qkv.layout == "grouped":
                grid = packed.view(b, s, self.num_kv_heads, group + 2, self.head_dim)
                query = grid[:, :, :, :group].reshape(b, s, self.num_heads, self.head_dim)
                key = grid[:, :, :, -2]
            else:
                width_q, width_kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
                query = packed[..., :width_q].view(b, s, self.num_heads, self.head_dim)
                key = packed[..., width_q: width_q + width_kv].view(b, s, self.num_kv_heads, self.head_dim)
            return query.transpose(1, 2), key.transpose(1, 2)
        spec = self.qkv
        query = module_at(attention, spec.q_norm or spec.q).output
        key = module_at(attention, spec.k_norm or spec.k).output
        b, s = query.shape[:2]
        return (query.view(b, s, -1, self.head_dim).transpose(1, 2),
                key.view(b, s, -1, self.head_dim).transpose(1, 2))

    def _latent_queries_and_keys(self, attention: Any, latent: LatentQKV) -> tuple[torch.Tensor, torch.Tensor]:
        nope, rope, heads = latent.qk_nope_head_dim, latent.qk_rope_head_dim, self.num_heads
        query = module_at(attention, latent.q).output
        b, s = query.shape[:2]
        q_nope, q_rope = query.view(b, s, heads, latent.qk_head_dim).split([nope, rope], dim=-1)
        k_rope = module_at(attention, latent.kv_a).output[..., latent.kv_lora_rank:]
        normed = module_at(attention, latent.kv_norm).output
        expand = module_at(attention, latent.kv_b)
        rows = expand.weight.view(heads, nope + self.head_dim, latent.kv_lora_rank)[:, :nope]
        bias = None if expand.bias is None else expand.bias.view(heads, -1)[:, :nope].reshape(-1)
        k_nope = torch.nn.functional.linear(normed, rows.reshape(heads * nope, -1), bias).view(b, s, heads, nope)
        query = torch.cat([q_rope, q_nope], dim=-1)
        key = torch.cat([k_rope[:, :, None].expand(b, s, heads, rope), k_nope], dim=-1)
        return query.transpose(1, 2), key.transpose(1, 2)

    def rotate(self, query: torch.Tensor, key: torch.Tensor, kwargs: Mapping[str, Any]) -> tuple[torch.Tensor, ...]:
        """Apply the described position encoding, from the attention module's keyword inputs ``kwargs``."""
        if self.rotary is None:
            return query, key
        if self.rotary == MODULE_ROTARY:
            embeddings = kwargs.get(MODULE_ROTARY)
            if embeddings is None:
                raise ReadoutUnavailableError(f"the attention module received no {MODULE_ROTARY!r} argument: describe "
                                              "its rotary with Rotary(theta=...) instead")
            cos, sin = embeddings
            interleaved = False
        else:
            positions = kwargs.get(self.position_ids)
            if positions is None:
                raise ReadoutUnavailableError(f"the attention module received no {self.position_ids!r} argument: set "
                                              "AttentionDescription.position_ids to the name its forward uses")
            cos, sin = self.rotary.cos_sin(positions, self.head_dim, query.dtype)
            interleaved = self.rotary.interleaved
        return (apply_rotary(query, cos, sin, interleaved=interleaved),
                apply_rotary(key, cos, sin, interleaved=interleaved))


def _children(module: Any) -> str:
    names = [name for name, _ in module.named_children()] if hasattr(module, "named_children") else []
    return ", ".join(names) or "no child modules"


@dataclass(frozen=True)
class DescribedRowsReadout(AttentionRowsReadout):
    """``AttentionRowsReadout`` for a described attention: queries and keys recomputed from the projections.

    ``call_inputs`` returns what the attention function would receive (post-rotary queries of this forward,
    every key so far, the module's mask, scaling, soft-cap), so ``RegionAttentionReadout`` and ``softmax_rows``
    work unchanged. Keys of earlier positions are not in this forward during generation: the template keeps
    each layer's keys (``_keys``) and appends a decode step's new key; a forward with several queries (a prompt
    forward or a full teacher-forced forward) or another batch size starts afresh. This duplicates the KV cache's
    keys (not its values) for the layers read, and does not support sliding-window caches that drop keys.
    """

    description: AttentionDescription | None = None
    _keys: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def for_description(cls, description: AttentionDescription, layers: Sequence[int],
                        prefill_rows: torch.Tensor | Sequence[int], *,
                        heads_by_layer: Mapping[int, tuple[int, ...]] | None = None) -> "DescribedRowsReadout":
        paths = {layer: description.attention_path(layer) for layer in layers}
        return cls(paths, "", torch.as_tensor(prefill_rows, dtype=torch.long), torch.tensor([-1]), heads_by_layer,
                   description)

    def call_inputs(self, model: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor, Any, float, float | None]:
        description = self.description
        assert description is not None
        attention = module_at(model, self.attention_paths[layer])
        kwargs = attention.inputs[1]
        if description.mask not in kwargs:
            raise ReadoutUnavailableError(
                f"layer {layer}: the attention module received no keyword argument {description.mask!r}; set "
                f"AttentionDescription.mask to the name its forward uses (received: {', '.join(kwargs)})")
        mask = kwargs[description.mask]
        query, key = description.rotate(*description.queries_and_keys(attention), kwargs)
        if query.shape[2] > 1 or layer not in self._keys or self._keys[layer].shape[0] != key.shape[0]:
            self._keys[layer] = key
        else:
            self._keys[layer] = torch.cat([self._keys[layer], key], dim=2)
        keys = self._keys[layer]
        if mask is not None and (mask.dim() != 4 or mask.shape[-1] < keys.shape[2]):
            raise ReadoutUnavailableError(
                f"layer {layer}: the attention mask has shape {tuple(mask.shape)} for {keys.shape[2]} keys; the "
                "described readout needs a [batch, 1, queries, keys] mask (load the model with "
                "attn_implementation='eager' or 'sdpa', not flash attention)")
        return query, keys, mask, description.softmax_scaling(), description.softcap


@dataclass
class DescribedAdapter(FamilyAdapter):
    """A family adapter whose attention facts come from an ``AttentionDescription`` and whose visual side
    (image tokens, layouts, prompts, box formats) is ``visual``'s, a built-in or user adapter."""

    description: AttentionDescription = field(default=None)  # type: ignore[assignment]
    visual: FamilyAdapter = field(default=None)  # type: ignore[assignment]
    name: ClassVar[str] = "described"
    display_name: ClassVar[str] = "described attention"
    model_types: ClassVar[tuple[str, ...]] = ()
    box_format: ClassVar[str] = "the visual adapter's"

    def __post_init__(self) -> None:
        if not isinstance(self.description, AttentionDescription):
            raise AttentionDescriptionError("DescribedAdapter needs description=AttentionDescription(...)")
        if not isinstance(self.visual, FamilyAdapter):
            raise AttentionDescriptionError("DescribedAdapter needs visual=<a FamilyAdapter> for image tokens, "
                                            "layouts, prompts and box formats")
        self.output_projection_attr = self.description.output_projection  # type: ignore[misc]
        self.non_causal_image_attention = self.visual.non_causal_image_attention  # type: ignore[misc]
        self.answer_token_type_id = self.visual.answer_token_type_id  # type: ignore[misc]
        self.box_format = self.visual.box_format  # type: ignore[misc]

    # ------------------------------------------------------------------ attention: from the description
    def geometry(self) -> HeadGeometry:
        return self.description.geometry()

    def attention_path(self, layer: int) -> str:
        return self.description.attention_path(layer)

    def rows_readout(self, layers: Sequence[int], prefill_rows: torch.Tensor | Sequence[int], *,
                     heads_by_layer: Mapping[int, tuple[int, ...]] | None = None) -> DescribedRowsReadout:
        """The readout template for this model (``interventions.attention_readout`` calls it)."""
        return DescribedRowsReadout.for_description(self.description, layers, prefill_rows,
                                                    heads_by_layer=heads_by_layer)

    # ------------------------------------------------------------------ visual side: the visual adapter's
    def text_config(self) -> Any:
        return self.visual.text_config()

    def image_token(self, processor: Any) -> str:
        return self.visual.image_token(processor)

    def image_token_id(self, processor: Any) -> int:
        return self.visual.image_token_id(processor)

    def grounding_instruction(self, expression: str) -> str:
        return self.visual.grounding_instruction(expression)

    def grounding_prompt(self, processor: Any, expression: str) -> str:
        return self.visual.grounding_prompt(processor, expression)

    def encode(self, processor: Any, images: Sequence[Any], prompts: Sequence[str]) -> Any:
        return self.visual.encode(processor, images, prompts)

    def visual_layout(self, encoding: Mapping[str, Any], image_size: tuple[int, int], processor: Any,
                      batch_index: int = 0) -> VisualLayout:
        return self.visual.visual_layout(encoding, image_size, processor, batch_index)

    def box_frame(self, encoding: Mapping[str, Any] | None, image_size: tuple[int, int],
                  batch_index: int = 0, processor: Any = None) -> BoxFrame:
        return self.visual.box_frame(encoding, image_size, batch_index, processor=processor)

    def format_box(self, box: Any, frame: BoxFrame) -> str:
        return self.visual.format_box(box, frame)

    def parse_box(self, text: str, frame: BoxFrame) -> Any:
        return self.visual.parse_box(text, frame)


def described_adapter(model: Any, description: AttentionDescription,
                      visual: FamilyAdapter | None = None) -> DescribedAdapter:
    """A ``DescribedAdapter`` for ``model``, its description checked against the model's modules. ``visual``
    (default: the built-in adapter of ``model.config``) supplies everything about images and boxes."""
    if visual is None:
        from vrh_interp.core.description.families import adapter_for_config

        visual = adapter_for_config(model.config)
    description.check(model)
    return DescribedAdapter(model.config, description=description, visual=visual)
