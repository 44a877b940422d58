"""The TransformerLens backend against the nnsight backend (``vrh_interp.core.execution.interventions``), per family.

Both backends act on the same site (o_proj's input split per head), but the bridge always runs eager
attention while the fixtures run sdpa: positions that are left padding (fully masked queries) hold
implementation-defined values, so logits and head outputs are compared on real tokens only, to 1e-5.
Greedy ids must be equal. Each family's bridge is built once per module.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import copy
from typing import Any

import pytest
import torch

from tests.conftest import noise_image, tiny_vlm
from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.description.heads import Head, HeadOutOfRangeError, HeadSet

transformer_lens_backend = pytest.importorskip("vrh_interp.core.execution.backends.transformer_lens")
TransformerLensBackend = transformer_lens_backend.TransformerLensBackend
SUPPORTED_FAMILIES = transformer_lens_backend.SUPPORTED_FAMILIES

TOLERANCE = 1e-5
NEW_TOKENS = 5


@pytest.fixture(scope="module")
def backends() -> dict[str, Any]:
    """family -> TransformerLensBackend, or the reason its bridge cannot be built here (built lazily)."""
    return {}


def _built(backends: dict[str, Any], family: str) -> Any:
    """The cached backend of ``family``; skips, naming the error, when its bridge cannot be built here."""
    if family not in backends:
        try:
            backends[family] = TransformerLensBackend.from_vlm(tiny_vlm(family))
        except Exception as error:  # recorded and reported as the skip reason, never passed over
            backends[family] = f"TransformerLens bridge for {family} cannot be built: {type(error).__name__}: {error}"
    if isinstance(backends[family], str):
        pytest.skip(backends[family])
    return backends[family]


@pytest.fixture(params=SUPPORTED_FAMILIES)
def backend(request: pytest.FixtureRequest, backends: dict[str, Any]) -> Any:
    return _built(backends, request.param)


def _batch(vlm: Any) -> Any:
    """Two prompts of different lengths (left padding exercised) on non-square images."""
    return vlm.encode_grounding([noise_image(83, 61, seed=1), noise_image(64, 96, seed=2)],
                                ["the red circle", "the cat left of the dog"])


def _heads(vlm: Any) -> HeadSet:
    g = vlm.geometry
    return HeadSet([Head(0, 1), Head(g.num_layers - 1, 0), Head(g.num_layers - 1, g.num_heads - 1)])


def _max_diff_on_real_tokens(a: torch.Tensor, b: torch.Tensor, attention_mask: torch.Tensor) -> float:
    real = attention_mask.bool()
    return (a.float() - b.float()).abs()[real].max().item()


def test_ablated_logits_equal_nnsight(backend):
    vlm = backend.vlm
    batch = _batch(vlm)
    heads = _heads(vlm)
    got = backend.ablated_logits(batch.encoding, heads)
    want = iv.run_forward(vlm, batch.encoding, [iv.head_ablation(vlm, heads)]).logits
    plain = iv.run_forward(vlm, batch.encoding).logits
    mask = batch.encoding["attention_mask"]
    assert _max_diff_on_real_tokens(want, plain, mask) > 1e-4, "ablation had no effect: a no-op would pass"
    assert _max_diff_on_real_tokens(got, want, mask) <= TOLERANCE


def test_ablated_greedy_generation_equals_nnsight(backend):
    vlm = backend.vlm
    batch = _batch(vlm)
    heads = _heads(vlm)
    got = backend.ablated_generate(batch.encoding, heads, max_new_tokens=NEW_TOKENS)
    want = iv.run_generate(vlm, batch.encoding, [iv.head_ablation(vlm, heads)], max_new_tokens=NEW_TOKENS).ids
    assert got.shape == (2, batch.prompt_length + NEW_TOKENS)
    assert torch.equal(got, want)


def test_attention_rows_equal_nnsight_readout(backend):
    vlm = backend.vlm
    batch = _batch(vlm)
    layout = batch.layouts[0]
    rows = [layout.visual_positions[0], layout.visual_positions[-1], batch.prompt_length - 2, -1]
    got = backend.attention_rows(batch.encoding, rows)
    want = iv.run_forward(vlm, batch.encoding, [iv.attention_readout(vlm, rows)]).values[0]
    absolute = torch.tensor(rows) % batch.prompt_length
    real_query = batch.encoding["attention_mask"][:, absolute].bool()  # left-padding query rows attend nowhere
    assert sorted(got) == list(range(vlm.geometry.num_layers))
    for layer, probs in want.items():
        assert got[layer].shape == probs.shape
        selected = real_query[:, None, :, None].expand_as(probs)
        assert (got[layer] - probs).abs()[selected].max().item() <= TOLERANCE, f"layer {layer}"
        torch.testing.assert_close(got[layer].sum(-1)[real_query[:, None, :].expand(-1, probs.shape[1], -1)],
                                   torch.ones(int(real_query.sum()) * probs.shape[1]), rtol=0, atol=1e-5)


def test_captured_head_outputs_equal_nnsight(backend):
    vlm = backend.vlm
    batch = _batch(vlm)
    got = backend.capture_head_outputs(batch.encoding)
    want = iv.run_forward(vlm, batch.encoding, [iv.head_output_capture(vlm)]).values[0]
    g = vlm.geometry
    for layer, outputs in want.items():
        assert got[layer].shape == (2, batch.prompt_length, g.num_heads, g.head_dim)
        assert _max_diff_on_real_tokens(got[layer], outputs, batch.encoding["attention_mask"]) <= TOLERANCE


def test_patched_head_outputs_equal_nnsight(backend):
    vlm = backend.vlm
    batch = _batch(vlm)
    heads = _heads(vlm)
    source = {layer: values[1:2] for layer, values in backend.capture_head_outputs(batch.encoding).items()}
    positions = [batch.prompt_length - 3, batch.prompt_length - 1]
    got = backend.patch_head_outputs(batch.encoding, heads, source, positions)
    want = iv.run_forward(vlm, batch.encoding,
                          [iv.head_output_patch(vlm, heads, source=source, positions=positions)]).logits
    plain = iv.run_forward(vlm, batch.encoding).logits
    mask = batch.encoding["attention_mask"]
    assert _max_diff_on_real_tokens(want, plain, mask) > 1e-4, "patching had no effect: a no-op would pass"
    assert _max_diff_on_real_tokens(got, want, mask) <= TOLERANCE


def test_out_of_range_heads_rejected(backends):
    backend = _built(backends, "llava")
    g = backend.vlm.geometry
    with pytest.raises(HeadOutOfRangeError):
        backend.ablated_logits(_batch(backend.vlm).encoding, HeadSet([Head(g.num_layers, 0)]))


def test_unsupported_family_names_supported_ones():
    unsupported = "paligemma"
    assert unsupported not in SUPPORTED_FAMILIES
    with pytest.raises(transformer_lens_backend.UnsupportedFamilyError, match="supported: .*llava, llava_next"):
        TransformerLensBackend.from_vlm(tiny_vlm(unsupported))


def test_backend_leaves_the_vlm_untouched(backends):
    vlm = _built(backends, "llava").vlm
    assert vlm.hf_model.config._attn_implementation == "sdpa"
    assert type(vlm.hf_model.model.language_model.layers[0].self_attn).__module__.startswith("transformers.")


def test_generation_workarounds_are_still_needed_and_still_work(backends):
    """Fails once TL's own generation agrees with HF: then the workaround in the backend can go."""
    backend = _built(backends, "llava")
    vlm = backend.vlm
    batch = _batch(vlm)
    inputs = dict(batch.encoding)
    input_ids = inputs.pop("input_ids")
    eager = copy.deepcopy(vlm.hf_model)
    eager.set_attn_implementation("eager")
    with torch.no_grad():
        reference = eager.generate(**batch.encoding, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None)
        bridge_generate = backend.bridge.generate(
            input_ids, max_new_tokens=NEW_TOKENS, do_sample=False, stop_at_eos=False, return_type="tokens",
            verbose=False, **inputs)
        cached_hf_generate = backend.bridge.hf_generate(
            input_ids, max_new_tokens=NEW_TOKENS, do_sample=False, stop_at_eos=False, return_type="tokens", **inputs)
        uncached_hf_generate = backend.bridge.hf_generate(
            input_ids, max_new_tokens=NEW_TOKENS, do_sample=False, stop_at_eos=False, return_type="tokens",
            use_past_kv_cache=False, use_cache=False, **inputs)
    assert not torch.equal(bridge_generate, reference), "bridge.generate now works for VLMs: drop the workaround"
    assert not torch.equal(cached_hf_generate, reference), "cached hf_generate now works: use the KV cache again"
    assert torch.equal(uncached_hf_generate, reference)


def test_padding_after_eos_is_rewritten_to_the_generation_pad_id():
    eos, hf_generate_pad, pad = 7, 7, 0
    ids = torch.tensor([[5, 5, 3, eos, hf_generate_pad, hf_generate_pad],
                        [5, 5, 3, 4, eos, hf_generate_pad],
                        [5, 5, 3, 4, 4, 4]])
    repadded = transformer_lens_backend._repad_after_eos(ids, prompt_length=2, eos=[eos, 9], pad=pad)
    assert repadded.tolist() == [[5, 5, 3, eos, pad, pad], [5, 5, 3, 4, eos, pad], [5, 5, 3, 4, 4, 4]]
    assert transformer_lens_backend._repad_after_eos(ids, prompt_length=2, eos=eos, pad=None) is ids


def test_without_transformer_lens_the_backend_names_the_extra(monkeypatch):
    """TransformerLens is the optional ``[tl]`` extra: without it, one line naming the install, not an ImportError."""
    import importlib.util

    from vrh_interp.core.execution.backends.base import BackendError
    from vrh_interp.core.execution.backends.select import backend_for

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformer_lens" else real(name, *a))
    with pytest.raises(BackendError, match=r"pip install 'vrh-interp\[tl\]'") as info:
        backend_for(tiny_vlm(SUPPORTED_FAMILIES[0]).on(backend="transformer-lens"))
    assert "\n" not in str(info.value)
