"""Head ablation, readout, capture and patching through a TransformerLens ``TransformerBridge``.

``TransformerLensBackend`` implements ``backends.base.Backend``: a handle placed on it
(``vlm.on(backend="transformer-lens")``) runs every pipeline through it; masking is zero ablation only,
and the patching study
(``OPERATIONS["patching"]``) is refused up front (``check_supported``).

``TransformerLensBackend.from_vlm(vlm)`` wraps a DEEP COPY of ``vlm.hf_model`` with
``transformer_lens.model_bridge.sources.build_bridge_from_module``: the bridge replaces the model's
submodules in place and switches the whole model (vision tower included) to eager attention, so wrapping
the original would silently change ``vlm``. Weight processing / compatibility mode stay OFF: with them on,
TL writes into the HF parameters and hook_z ablation no longer equals the real ablation.

Every operation acts at ``blocks.{l}.attn.hook_z`` (``[batch, seq, heads, head_dim]``), which is the
input of ``o_proj`` split per head, i.e. exactly the site the nnsight templates use
(``vrh_interp.core.execution.templates``); the readout reads ``blocks.{l}.attn.hook_pattern`` (the bridge always runs
eager attention, so the pattern exists for every supported family, including the Qwen/GLM adapters
that run HF's attention and expose it read-only).

Workarounds for TransformerLens 4.3 + transformers 5.24, all inside this module:

* ``bridge.generate()`` does not work for VLMs: on the tiny fixtures it returns wrong ids for the
  LLaVA family, Gemma3 and Idefics3 and raises a shape error for Qwen2.5-VL, Qwen3-VL and GLM-4V (only
  Mistral3 is right). Greedy generation therefore goes through ``bridge.hf_generate`` (HF's own
  ``generate`` on the bridged model) with the hooks attached by ``bridge.hooks(...)``.
* ``hf_generate`` WITH the KV cache is wrong as well for LLaVA, LLaVA-NeXT, LLaVA-OneVision, Gemma3 and
  Idefics3 (the first new token is right, later ones are not; Qwen2.5-VL, Qwen3-VL, GLM-4V and Mistral3
  are right). It runs with ``use_cache=False`` for every family: each step recomputes the whole
  sequence, which is exact but costs a full forward per new token (fine for short answers).
  ``tests/test_transformer_lens_backend.py`` asserts that ``bridge.generate`` and cached
  ``hf_generate`` still differ from HF on the LLaVA fixture, so it fails once a workaround is no longer
  needed, and that uncached ``hf_generate`` equals HF.
* ``hf_generate`` pads finished rows with the tokenizer's EOS id, where plain HF (and the nnsight
  backend) pad with the generation config's ``pad_token_id``: the padding after each row's first EOS is
  rewritten to the generation config's pad id.
* The bridge's tokenizer setup re-loads the tokenizer from the hub (``AutoTokenizer.from_pretrained``)
  unless it already adds BOS. The bridge is therefore built WITHOUT a tokenizer (we pass token ids,
  never text) and a copy of the processor's tokenizer is then set on OUR bridge's ``tokenizer``
  attribute, which ``hf_generate`` reads for its EOS/pad ids. Nothing in transformers or TL is patched.
* The Qwen2.5-VL, Qwen3-VL and GLM-4V adapters refuse to build without torchvision (their
  ``required_libraries``), which they never use: only HF's image processors do, and encodings come from
  the ``VLM``'s processor. When a required library is missing, the bridge is assembled from TL's public
  pieces (``build_bridge_config_from_hf``, the adapter class from ``SUPPORTED_ARCHITECTURES``, the
  ``TransformersDriver``) exactly as ``build_bridge_from_module`` does, with a local SUBCLASS of the
  adapter whose ``required_libraries`` is empty; nothing is registered in TL's factory.
"""

from __future__ import annotations

import copy
import importlib.util
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Sequence

import torch

from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.execution.backends.base import (BackendError, Condition, RegionStats, RowReduction,
                                                     check_ablation_kinds, generate_then_read, read_region_stats)
from vrh_interp.core.description.families.registry import FAMILIES
from vrh_interp.core.description.heads import HeadSet
from vrh_interp.core.description.model import VLM
from vrh_interp.core.execution.ablation_kinds import ABLATION_METHODS
from vrh_interp.core.execution.templates.ablation import ZERO_ABLATION

# Registry keys (``FamilyAdapter.name``) of the families whose HF class has a TransformerLens 4.3 adapter.
SUPPORTED_FAMILIES: tuple[str, ...] = tuple(row.name for row in FAMILIES if row.transformer_lens)

HookFunction = Callable[[torch.Tensor, Any], torch.Tensor | None]


class UnsupportedFamilyError(BackendError):
    """The model's family has no TransformerLens bridge adapter we support."""


def _z_hook(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_z"


def _pattern_hook(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_pattern"


def _build_bridge(hf_model: Any) -> Any:
    """A bridge around ``hf_model`` (modified in place), without a tokenizer; see the module docstring."""
    from transformer_lens.factories.architecture_adapter_factory import SUPPORTED_ARCHITECTURES
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.model_bridge.sources import build_bridge_config_from_hf, build_bridge_from_module
    from transformer_lens.model_bridge.sources.transformers_driver import TransformersDriver

    architecture = type(hf_model).__name__
    adapter_class = SUPPORTED_ARCHITECTURES[architecture]
    missing = [lib for lib in adapter_class.required_libraries if importlib.util.find_spec(lib) is None]
    if not missing:
        return build_bridge_from_module(hf_model, architecture, hf_config=hf_model.config)
    parameter = next(hf_model.parameters())
    config = build_bridge_config_from_hf(hf_model.config, architecture, "external", parameter.dtype)
    adapter_without_unused_libraries = type(adapter_class.__name__, (adapter_class,), {"required_libraries": []})
    adapter = adapter_without_unused_libraries(config)
    adapter.cfg.device = str(parameter.device)
    adapter.prepare_model(hf_model)
    return TransformerBridge(hf_model, adapter, None, driver=TransformersDriver(hf_model, adapter, None))


MISSING_TRANSFORMER_LENS = ("the transformer-lens backend needs TransformerLens, an optional extra: pip install "
                            "'vrh-interp[tl]' (or use --backend nnsight, which runs every family)")


@dataclass
class TransformerLensBackend:
    """The nnsight backend's head operations on a TransformerLens bridge of a copy of ``vlm.hf_model``."""

    vlm: VLM
    bridge: Any  # transformer_lens.model_bridge.TransformerBridge
    name: ClassVar[str] = "transformer-lens"
    # the bridge's hooks zero heads; the kinds that replace them by reference outputs (mean, resample) need the
    # per-segment templates of the nnsight backend, so they are refused before any work (``check_ablation_kinds``)
    ablation_kinds: ClassVar[tuple[str, ...]] = tuple(name for name, kind in ABLATION_METHODS.items()
                                                      if not kind.needs_reference_values)
    operations: ClassVar[frozenset[str]] = frozenset()  # no patching study: its templates are nnsight's
    runs_remotely: ClassVar[bool] = False  # NDIF runs nnsight requests

    @classmethod
    def from_vlm(cls, vlm: VLM) -> "TransformerLensBackend":
        family = vlm.adapter.name
        if family not in SUPPORTED_FAMILIES:
            raise UnsupportedFamilyError(
                f"the transformer-lens backend cannot run family {family!r} (TransformerLens 4.3 has no bridge "
                f"adapter for it); supported: {', '.join(SUPPORTED_FAMILIES)}. Use --backend nnsight "
                "(vlm.on(backend='nnsight')), which runs every family"
            )
        if importlib.util.find_spec("transformer_lens") is None:
            raise BackendError(MISSING_TRANSFORMER_LENS)
        bridge = _build_bridge(copy.deepcopy(vlm.hf_model))
        bridge.tokenizer = copy.deepcopy(vlm.tokenizer)  # see the module docstring
        return cls(vlm=vlm, bridge=bridge)

    # -- forward-pass operations ------------------------------------------------------------------

    def ablated_logits(self, encoding: Mapping[str, Any], heads: HeadSet) -> torch.Tensor:
        """Logits with ``heads`` zero-ablated at the o_proj input (``hook_z``)."""
        return self._logits(encoding, self._ablation_hooks(heads))

    def ablated_generate(self, encoding: Mapping[str, Any], heads: HeadSet, max_new_tokens: int) -> torch.Tensor:
        """Greedy ids ``[batch, prompt + new]`` with ``heads`` ablated at every step (prefill and decode)."""
        return self.generate_conditions(encoding, [(heads, ZERO_ABLATION)], max_new_tokens=max_new_tokens)[0]

    def shares_layers(self, ablation_kinds: Sequence[str]) -> bool:
        return False  # every row runs every layer on the bridge

    def generate_conditions(self, encoding: Mapping[str, Any], conditions: Sequence[Condition], *,
                            max_new_tokens: int, segments: torch.Tensor | None = None,
                            sample_ids: Sequence[str] | None = None,
                            shared_prefix: bool = True) -> list[torch.Tensor]:
        """``interventions.generate_conditions`` on the bridge: the batch replicated per condition
        (``replicate_encoding``), each block's heads zeroed at ``hook_z`` at every step, one uncached
        ``hf_generate`` for all. Zero ablation only (mean / resample: the nnsight backend); ``segments``,
        ``sample_ids`` and ``shared_prefix`` (an nnsight KV-cache optimisation) are accepted and unused."""
        if not conditions:
            raise ValueError("generate_conditions needs at least one condition")
        check_ablation_kinds(self, [a.kind for h, a in conditions if h is not None and len(h)])
        rows = int(encoding["input_ids"].shape[0])
        heads_per_row = [heads for heads, _ in conditions for _ in range(rows)]
        ids = self._generate(iv.replicate_encoding(encoding, len(conditions)), self._row_ablation_hooks(heads_per_row),
                             max_new_tokens)
        return list(ids.split(rows, dim=0))

    def attention_rows(self, encoding: Mapping[str, Any], rows: Sequence[int] | torch.Tensor,
                       layers: Sequence[int] | None = None,
                       reduce: RowReduction | None = None) -> dict[int, Any]:
        """Attention of the query ``rows`` to all keys, ``{layer: [b, H, r, k]}`` (or ``reduce(layer, it)``).

        ``rows``: one list for every batch row (negative: from the end) or ``[batch, r]`` per batch row. Read
        from ``hook_pattern`` (eager softmax), float32; with ``reduce`` only its value is kept per layer. Rows
        that are left padding hold whatever eager attention computes for a fully masked query (the nnsight
        readout returns 0 there): ignore them.
        """
        chosen = self._layers(layers)
        index = torch.as_tensor(rows, dtype=torch.long)
        readout: dict[int, Any] = {}

        def keep_rows(pattern: torch.Tensor, hook: Any) -> None:
            layer = int(hook.name.split(".")[1])
            at = index.to(pattern.device)
            if at.dim() == 2:  # per batch row: [b, r, H, k] -> [b, H, r, k]
                probs = pattern[torch.arange(pattern.shape[0], device=at.device)[:, None], :, at].transpose(1, 2)
            else:
                probs = pattern[:, :, at]
            probs = probs.float()
            readout[layer] = probs.clone() if reduce is None else reduce(layer, probs)

        self._logits(encoding, [(_pattern_hook(layer), keep_rows) for layer in chosen])
        return readout

    def capture_head_outputs(self, encoding: Mapping[str, Any],
                             layers: Sequence[int] | None = None) -> dict[int, torch.Tensor]:
        """Every head's output at ``layers``: ``{layer: [batch, seq, heads, head_dim]}``."""
        captured: dict[int, torch.Tensor] = {}

        def keep(z: torch.Tensor, hook: Any) -> None:
            captured[int(hook.name.split(".")[1])] = z.detach().clone()

        self._logits(encoding, [(_z_hook(layer), keep) for layer in self._layers(layers)])
        return captured

    def patch_head_outputs(self, encoding: Mapping[str, Any], heads: HeadSet, source: Mapping[int, torch.Tensor],
                           positions: Sequence[int] | None = None) -> torch.Tensor:
        """Logits with ``heads``' outputs (at ``positions``, default all) overwritten from ``source``.

        ``source`` maps layer -> ``[batch or 1, seq, heads, head_dim]`` (``capture_head_outputs`` of another run).
        """
        by_layer = self.vlm.geometry.validate(heads).by_layer()
        missing = [layer for layer in by_layer if layer not in source]
        if missing:
            raise ValueError(f"source has no captured outputs for layers {missing}")

        def patch(layer: int, head_index: list[int]) -> HookFunction:
            def overwrite_heads(z: torch.Tensor, hook: Any) -> torch.Tensor:
                pos = torch.arange(z.shape[1]) if positions is None else torch.as_tensor(list(positions))
                values = source[layer].to(device=z.device, dtype=z.dtype)[:, pos][:, :, head_index]
                z = z.clone()
                z[:, pos[:, None], torch.tensor(head_index)[None, :]] = values.expand(z.shape[0], -1, -1, -1)
                return z
            return overwrite_heads

        return self._logits(encoding, [(_z_hook(layer), patch(layer, idx)) for layer, idx in by_layer.items()])

    def generate_region_stats(self, encoding: Mapping[str, Any], input_rows: torch.Tensor, region: torch.Tensor,
                              visual: torch.Tensor, *, max_new_tokens: int,
                              templates: Sequence[Any] = ()) -> RegionStats:
        """``base.generate_then_read``: generate, then read the rows in one forward (no readout inside the
        bridge's uncached generation). ``templates`` (nnsight's) are refused."""
        if templates:
            raise BackendError(f"the {self.name} backend runs no nnsight templates while scoring (given "
                               f"{', '.join(type(t).__name__ for t in templates)}): use --backend nnsight")
        return generate_then_read(self, encoding, input_rows, region, visual, max_new_tokens=max_new_tokens)

    def region_stats(self, encoding: Mapping[str, Any], rows: torch.Tensor, region: torch.Tensor,
                     visual: torch.Tensor) -> torch.Tensor:
        return read_region_stats(self, encoding, rows, region, visual)

    # -- helpers ----------------------------------------------------------------------------------

    def _ablation_hooks(self, heads: HeadSet) -> list[tuple[str, HookFunction]]:
        def zero(head_index: list[int]) -> HookFunction:
            def zero_heads(z: torch.Tensor, hook: Any) -> torch.Tensor:
                z = z.clone()
                z[:, :, head_index] = 0
                return z
            return zero_heads

        by_layer = self.vlm.geometry.validate(heads).by_layer()
        return [(_z_hook(layer), zero(idx)) for layer, idx in by_layer.items()]

    def _row_ablation_hooks(self, heads_per_row: Sequence[HeadSet | None]) -> list[tuple[str, HookFunction]]:
        """Row r zeroes ``heads_per_row[r]`` (None or empty: nothing) at ``hook_z``."""
        geometry = self.vlm.geometry
        keep: dict[int, torch.Tensor] = {}
        for row, heads in enumerate(heads_per_row):
            if heads is None:
                continue
            for layer, head_index in geometry.validate(heads).by_layer().items():
                keep.setdefault(layer, torch.ones(len(heads_per_row), geometry.num_heads, dtype=torch.bool))
                keep[layer][row, head_index] = False

        def zero(mask: torch.Tensor) -> HookFunction:
            def zero_row_heads(z: torch.Tensor, hook: Any) -> torch.Tensor:
                return torch.where(mask.to(z.device)[:, None, :, None], z, torch.zeros((), dtype=z.dtype))
            return zero_row_heads

        return [(_z_hook(layer), zero(mask)) for layer, mask in sorted(keep.items())]

    def _generate(self, encoding: Mapping[str, Any], hooks: list[tuple[str, HookFunction]],
                  max_new_tokens: int) -> torch.Tensor:
        """Greedy ids ``[batch, prompt + new]`` with ``hooks`` at every step (the module doc's workarounds)."""
        inputs = dict(encoding)
        input_ids = inputs.pop("input_ids")
        generation_config = self.bridge.original_model.generation_config
        eos = generation_config.eos_token_id
        with torch.no_grad(), self.bridge.hooks(fwd_hooks=hooks):
            ids = self.bridge.hf_generate(
                input_ids, max_new_tokens=max_new_tokens, do_sample=False, stop_at_eos=eos is not None,
                eos_token_id=eos, return_type="tokens", use_past_kv_cache=False, use_cache=False, **inputs,
            )
        return _repad_after_eos(ids, input_ids.shape[1], eos, generation_config.pad_token_id)

    def _layers(self, layers: Sequence[int] | None) -> list[int]:
        num_layers = self.vlm.geometry.num_layers
        chosen = sorted(layers) if layers is not None else list(range(num_layers))
        bad = [layer for layer in chosen if not 0 <= layer < num_layers]
        if bad:
            raise ValueError(f"layers {bad} out of range for a model with {num_layers} layers")
        return chosen

    def _logits(self, encoding: Mapping[str, Any], hooks: list[tuple[str, HookFunction]]) -> torch.Tensor:
        inputs = dict(encoding)
        input_ids = inputs.pop("input_ids")
        with torch.no_grad():
            return self.bridge.run_with_hooks(input_ids, return_type="logits", fwd_hooks=hooks, **inputs)


def _repad_after_eos(ids: torch.Tensor, prompt_length: int, eos: int | list[int] | None,
                     pad: int | None) -> torch.Tensor:
    """Replace the padding HF wrote after each row's first generated EOS with ``pad``."""
    if eos is None or pad is None:
        return ids
    eos_ids = torch.as_tensor(eos if isinstance(eos, list) else [eos], device=ids.device)
    new = ids[:, prompt_length:]
    is_eos = torch.isin(new, eos_ids)
    after_first_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    out = ids.clone()
    out[:, prompt_length:] = torch.where(after_first_eos, torch.as_tensor(pad, device=ids.device), new)
    return out
