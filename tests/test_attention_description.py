"""Described attention (``vrh_interp.core.description.families.described``) against native adapters and plain-PyTorch
references.

Two kinds of proof:

* the library's tiny models of five families, described by hand (paths, head grid, q/k norms, rotary computed
  from ``position_ids`` or taken from the module's ``(cos, sin)``), give results IDENTICAL to their native
  adapters: head scores from the greedy and teacher-forced scoring passes, masked generations, captured and
  patched head outputs;
* a fused-qkv attention module written here (InternLM2-like ``wqkv`` + ``wo``, its own rotary and softmax, no
  ``attention_interface`` call, so the native readout cannot read it) swapped into the tiny LLaVA model with the
  native weights packed into ``wqkv``: described masking, capture and readout equal forward pre-hooks on ``wo``
  and transformers' eager attention maps of the unfused native model.
"""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.conftest import noise_image, tiny_vlm
from tests.reference import eager_attention_maps
from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.description.boxes import Box
from vrh_interp.core.description.families.described import (
    MODULE_ROTARY,
    AttentionDescription,
    AttentionDescriptionError,
    DescribedAdapter,
    FusedQKV,
    Rotary,
    SeparateQKV,
    apply_rotary,
)
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.core.description.model import VLM, wrap
from vrh_interp.scoring.collect import collect_batch
from vrh_interp.core.execution.templates.readout import ReadoutUnavailableError

# The project's descriptions of its tiny fixtures, written from the fixture configs (vrh_interp/core/description/tiny):
# 2 layers, 4 heads, 2 KV heads, head_dim 16; rope theta: the text config's.
TINY_DESCRIPTIONS = {
    "qwen2_vl": dict(attention="model.language_model.layers.{layer}.self_attn", rotary=MODULE_ROTARY),
    "qwen3_vl": dict(attention="model.language_model.layers.{layer}.self_attn", rotary=MODULE_ROTARY,
                     qkv=SeparateQKV(q_norm="q_norm", k_norm="k_norm")),
    "llava": dict(attention="model.language_model.layers.{layer}.self_attn", rotary="theta"),
    "internvl": dict(attention="model.language_model.layers.{layer}.self_attn", rotary="theta"),
    "idefics3": dict(attention="model.text_model.layers.{layer}.self_attn", rotary="theta"),
}


def describe(vlm: VLM, attention: str, rotary: str, **fields) -> AttentionDescription:
    if rotary == "theta":
        rotary = Rotary(theta=vlm.hf_model.config.get_text_config().rope_parameters["rope_theta"])
    return AttentionDescription(attention, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rotary=rotary,
                                **fields)


def samples():
    """Two samples of different prompt lengths (left padding) on non-square images."""
    return [SimpleNamespace(sample_id="a", image=noise_image(83, 61, seed=1), expression="the red circle",
                            box=Box(10, 10, 50, 40)),
            SimpleNamespace(sample_id="b", image=noise_image(64, 96, seed=2), expression="the cat left of the dog",
                            box=Box(0, 20, 30, 90))]


HEADS = HeadSet([Head(0, 1), Head(1, 0), Head(1, 3)])


@pytest.fixture(scope="module", params=sorted(TINY_DESCRIPTIONS))
def native_and_described(request):
    native = tiny_vlm(request.param)
    described = wrap(native.hf_model, native.processor, attention=describe(native, **TINY_DESCRIPTIONS[request.param]))
    assert isinstance(described.adapter, DescribedAdapter)
    return native, described


def test_described_geometry_and_paths_equal_the_native_adapter(native_and_described):
    native, described = native_and_described
    assert described.geometry == native.geometry
    assert iv.projection_path(described)(1) == iv.projection_path(native)(1)


@pytest.mark.parametrize("output_source", ["greedy", "teacher_forced"])
def test_head_scores_are_identical_to_the_native_adapter(native_and_described, output_source):
    native, described = native_and_described
    want = collect_batch(native, samples(), max_new_tokens=4, output_source=output_source)
    got = collect_batch(described, samples(), max_new_tokens=4, output_source=output_source)
    for a, b in zip(want, got):
        assert a.answer == b.answer
        assert a.output_rows.size and a.input_rows.size
        assert np.array_equal(a.output_rows, b.output_rows) and np.array_equal(a.input_rows, b.input_rows)
        assert np.array_equal(a.neg_entropy, b.neg_entropy, equal_nan=True)


def test_masked_generation_captured_and_patched_outputs_are_identical(native_and_described):
    native, described = native_and_described
    batch = native.encode_grounding([s.image for s in samples()], [s.expression for s in samples()])
    ids = [iv.run_generate(vlm, batch.encoding, [iv.head_ablation(vlm, HEADS)], max_new_tokens=5).ids
           for vlm in (native, described)]
    assert torch.equal(ids[0], ids[1])
    captured = [iv.run_forward(vlm, batch.encoding, [iv.head_output_capture(vlm)]).values[0]
                for vlm in (native, described)]
    for layer in range(2):
        assert torch.equal(captured[0][layer], captured[1][layer])
    last = batch.prompt_length - 1  # patch row 0's outputs of HEADS into row 1 at the last prompt position
    patched = [iv.run_forward(vlm, batch.encoding, [iv.head_output_patch(vlm, HEADS, source_row=0, target_rows=[1],
                                                                         positions=[last])]).logits
               for vlm in (native, described)]
    assert torch.equal(patched[0], patched[1])


# ---------------------------------------------------------------------------------------------- rotary
def complex_rotary(x: torch.Tensor, positions: torch.Tensor, theta: float, rotary_dim: int,
                   interleaved: bool) -> torch.Tensor:
    """Reference RoPE as complex multiplication: pair i (dims (i, i + d/2), or (2i, 2i+1) interleaved) times
    exp(1j * position * theta ** (-2i / d)); dims past ``rotary_dim`` untouched. ``x`` [b, h, s, D]."""
    x = x.double()
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    if interleaved:
        z = torch.complex(rot[..., 0::2], rot[..., 1::2])
    else:
        z = torch.complex(rot[..., :half], rot[..., half:])
    freq = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / rotary_dim)
    z = z * torch.polar(torch.ones((), dtype=torch.float64), positions.double()[:, None, :, None] * freq)
    out = torch.stack((z.real, z.imag), dim=-1).flatten(-2) if interleaved else torch.cat((z.real, z.imag), -1)
    return torch.cat((out, rest), dim=-1)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_rotary_equals_complex_multiplication(interleaved, rotary_dim):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 16)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [1, 1, 1, 2, 3, 40, 41]])
    rotary = Rotary(theta=500.0, rotary_dim=rotary_dim, interleaved=interleaved)
    cos, sin = rotary.cos_sin(positions, 16, torch.float32)
    got = apply_rotary(x, cos, sin, interleaved=interleaved)
    want = complex_rotary(x, positions, 500.0, rotary_dim or 16, interleaved)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)
    assert (got - x).abs().max() > 0.1


# ---------------------------------------------------------------------------------------------- fused qkv
def pack_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, kv_heads: int, head_dim: int,
             layout: str) -> torch.Tensor:
    """Rows of one fused weight (or bias) from separate q / k / v rows, in ``layout``."""
    if layout == "concatenated":
        return torch.cat([q, k, v], dim=0)
    group = heads // kv_heads
    blocks = []
    for g in range(kv_heads):
        blocks += [q[(g * group + j) * head_dim:(g * group + j + 1) * head_dim] for j in range(group)]
        blocks += [k[g * head_dim:(g + 1) * head_dim], v[g * head_dim:(g + 1) * head_dim]]
    return torch.cat(blocks, dim=0)


class FusedAttention(torch.nn.Module):
    """An InternLM2-like attention block in plain PyTorch: one ``wqkv`` projection packed in ``layout``, RoPE from
    ``position_ids`` (complex multiplication), explicit softmax attention, ``wo``. No ``attention_interface``."""

    def __init__(self, native: torch.nn.Module, layer_idx: int, layout: str, theta: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.layout, self.theta = 4, 2, 16, layout, theta
        self.layer_idx = layer_idx
        hidden = native.q_proj.in_features
        self.wqkv = torch.nn.Linear(hidden, (self.heads + 2 * self.kv_heads) * self.head_dim, bias=False)
        with torch.no_grad():
            self.wqkv.weight.copy_(pack_qkv(native.q_proj.weight, native.k_proj.weight, native.v_proj.weight,
                                            self.heads, self.kv_heads, self.head_dim, layout))
        self.wo = copy.deepcopy(native.o_proj)

    def split(self, packed: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, s, _ = packed.shape
        d, width_q, width_kv = self.head_dim, self.heads * self.head_dim, self.kv_heads * self.head_dim
        if self.layout == "concatenated":
            q, k, v = packed.split([width_q, width_kv, width_kv], dim=-1)
        else:
            grid = packed.view(b, s, self.kv_heads, -1, d)
            q, k, v = grid[:, :, :, :-2].flatten(2), grid[:, :, :, -2].flatten(2), grid[:, :, :, -1].flatten(2)
        return tuple(t.reshape(b, s, -1, d).transpose(1, 2) for t in (q, k, v))

    def forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None, **kwargs):
        q, k, v = self.split(self.wqkv(hidden_states))
        q = complex_rotary(q, position_ids, self.theta, self.head_dim, False).to(q.dtype)
        k = complex_rotary(k, position_ids, self.theta, self.head_dim, False).to(k.dtype)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        q_len, k_len = q.shape[2], k.shape[2]
        if attention_mask is None:
            causal = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
            scores = scores.masked_fill(~causal, float("-inf"))
        elif attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask[..., :k_len], float("-inf"))
        else:
            scores = scores + attention_mask[..., :k_len]
        probs = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
        out = (probs @ v).transpose(1, 2).reshape(q.shape[0], q_len, -1)
        return self.wo(out), None


@pytest.fixture(scope="module", params=["grouped", "concatenated"])
def fused(request):
    """(native tiny LLaVA, the same weights with fused attention described, the layout)."""
    native = tiny_vlm("llava")
    model = copy.deepcopy(native.hf_model)
    theta = model.config.get_text_config().rope_parameters["rope_theta"]
    for i, layer in enumerate(model.model.language_model.layers):
        layer.self_attn = FusedAttention(layer.self_attn, i, request.param, theta)
    description = AttentionDescription("model.language_model.layers.{layer}.self_attn", 2, 4, 2, 16,
                                       qkv=FusedQKV("wqkv", request.param), output_projection="wo",
                                       rotary=Rotary(theta=theta))
    return native, wrap(model, native.processor, attention=description), request.param


def _encoding(vlm: VLM):
    return vlm.encode_grounding([s.image for s in samples()], [s.expression for s in samples()])


def wo_hook_outputs(model, encoding, zero: dict[int, list[int]] | None = None):
    """Plain-PyTorch reference on the fused model: forward pre-hooks on every ``wo`` capture its input
    ``[b, s, heads, head_dim]`` (after zeroing the heads in ``zero``); returns (logits, captured)."""
    captured, handles = {}, []
    for i, layer in enumerate(model.model.language_model.layers):
        def pre_hook(_module, args, i=i):
            x = args[0].clone()
            view = x.view(*x.shape[:2], 4, 16)
            view[:, :, (zero or {}).get(i, [])] = 0
            captured[i] = view.clone()
            return (x,)
        handles.append(layer.self_attn.wo.register_forward_pre_hook(pre_hook))
    try:
        with torch.no_grad():
            logits = model(**encoding).logits
    finally:
        for handle in handles:
            handle.remove()
    return logits, captured


def test_fused_module_computes_the_native_attention(fused):
    native, described, _ = fused
    batch = _encoding(native)
    with torch.no_grad():
        fused_logits = described.hf_model(**batch.encoding).logits
        torch.testing.assert_close(fused_logits, native.hf_model(**batch.encoding).logits, rtol=0, atol=1e-5)


def test_fused_masking_and_capture_equal_wo_pre_hooks(fused):
    native, described, _ = fused
    batch = _encoding(described)
    result = iv.run_forward(described, batch.encoding, [iv.head_ablation(described, HEADS)])
    reference, _ = wo_hook_outputs(described.hf_model, batch.encoding, HEADS.by_layer())
    plain, captured = wo_hook_outputs(described.hf_model, batch.encoding)
    assert (result.logits - plain).abs().max() > 1e-6
    torch.testing.assert_close(result.logits, reference, rtol=0, atol=1e-6)
    values = iv.run_forward(described, batch.encoding, [iv.head_output_capture(described)]).values[0]
    for layer in range(2):
        assert torch.equal(values[layer], captured[layer])
    # and the same heads masked on the unfused native model
    native_masked = iv.run_forward(native, batch.encoding, [iv.head_ablation(native, HEADS)]).logits
    torch.testing.assert_close(result.logits, native_masked, rtol=0, atol=1e-5)
    ids = [iv.run_generate(vlm, batch.encoding, [iv.head_ablation(vlm, HEADS)], max_new_tokens=5).ids
           for vlm in (native, described)]
    assert torch.equal(ids[0], ids[1])


def test_fused_readout_equals_eager_maps_of_the_native_model(fused):
    native, described, _ = fused
    batch = _encoding(described)
    layout = batch.layouts[0]
    rows = [layout.visual_positions[0], layout.visual_positions[-1], batch.prompt_length - 2, -1]
    with pytest.raises(ReadoutUnavailableError):  # the native readout has no attention call to read
        iv.attention_readout(wrap(described.hf_model, described.processor), rows)
    result = iv.run_forward(described, batch.encoding, [iv.attention_readout(described, rows)])
    maps = eager_attention_maps(native.hf_model, batch.encoding)
    absolute = torch.tensor(rows) % batch.prompt_length
    real_query = batch.encoding["attention_mask"][:, absolute].bool()
    for layer, full in enumerate(maps):
        got = result.values[0][layer]
        assert (got - full[:, :, absolute]).abs()[real_query[:, None, :, None].expand_as(got)].max() <= 1e-5


def test_fused_readout_during_generation_equals_eager_maps_of_the_full_sequence(fused):
    native, described, _ = fused
    batch = _encoding(described)
    result = iv.run_generate(described, batch.encoding, [iv.attention_readout(described, [-1])], max_new_tokens=4,
                             min_new_tokens=4)
    new = result.ids.shape[1] - batch.prompt_length
    full = dict(batch.encoding, input_ids=result.ids, attention_mask=torch.cat(
        [batch.encoding["attention_mask"], torch.ones(result.ids.shape[0], new, dtype=torch.long)], dim=1))
    maps = eager_attention_maps(native.hf_model, full)
    assert len(result.steps) == new == 4
    for step, values in enumerate(result.steps):
        for layer in range(2):
            got = values[0][layer][:, :, 0]
            want = maps[layer][:, :, batch.prompt_length - 1 + step, :got.shape[-1]]
            assert got.shape[-1] == batch.prompt_length + step
            assert (got - want).abs().max() <= 1e-5, f"step {step} layer {layer}"


def test_fused_head_scores_match_the_native_model(fused):
    native, described, _ = fused
    for want, got in zip(collect_batch(native, samples(), max_new_tokens=4),
                         collect_batch(described, samples(), max_new_tokens=4)):
        assert want.answer == got.answer
        np.testing.assert_allclose(got.output_rows, want.output_rows, rtol=0, atol=1e-5)
        np.testing.assert_allclose(got.input_rows, want.input_rows, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------- refusals
def test_descriptions_that_do_not_fit_the_model_are_refused():
    native = tiny_vlm("llava")
    good = dict(attention="model.language_model.layers.{layer}.self_attn", num_layers=2, num_heads=4,
                num_kv_heads=2, head_dim=16)
    cases = [
        (dict(good, num_heads=8, head_dim=8), "k_proj has 32 outputs but the description implies 16"),
        (dict(good, num_layers=3), "says 3 layers"),
        (dict(good, attention="model.layers.{layer}.self_attn"), "no attention module at"),
        (dict(good, qkv=FusedQKV()), "wqkv is NoneType, not an nn.Linear"),
        (dict(good, output_projection="wo"), "wo is NoneType"),
    ]
    for fields, message in cases:
        with pytest.raises(AttentionDescriptionError, match=message):
            wrap(native.hf_model, native.processor, attention=AttentionDescription(**fields))
    with pytest.raises(AttentionDescriptionError, match="placeholder"):
        AttentionDescription(**dict(good, attention="model.language_model.layers.self_attn"))
    with pytest.raises(AttentionDescriptionError, match="not a multiple"):
        AttentionDescription(**dict(good, num_kv_heads=3))
    with pytest.raises(AttentionDescriptionError, match="rotary_dim 32 exceeds"):
        AttentionDescription(**good, rotary=Rotary(10000.0, rotary_dim=32))
    with pytest.raises(AttentionDescriptionError, match="layout"):
        FusedQKV("wqkv", "interleaved")  # type: ignore[arg-type]


def test_positions_beyond_the_plain_rope_range_are_refused(fused):
    _, described, _ = fused
    limited = wrap(described.hf_model, described.processor,
                   attention=AttentionDescription("model.language_model.layers.{layer}.self_attn", 2, 4, 2, 16,
                                                  qkv=described.adapter.description.qkv, output_projection="wo",
                                                  rotary=Rotary(10000.0, max_positions=8)))
    batch = _encoding(limited)
    with pytest.raises(ReadoutUnavailableError, match="beyond max_positions=8"):
        iv.run_forward(limited, batch.encoding, [iv.attention_readout(limited, [-1])])


# ---------------------------------------------------------------------------------------------- transformers' fused qkv
@pytest.mark.parametrize("rotary", [MODULE_ROTARY, Rotary(theta=10000.0, rotary_dim=8)])
def test_phi3_fused_qkv_with_partial_rotary_equals_native_readout_and_eager_maps(rotary):
    """transformers' Phi-3 attention (the Phi-4 backbone's class): ``qkv_proj`` packed queries | keys | values, rotary
    on the first half of each head (``partial_rotary_factor=0.5``), given as the module's (cos, sin) or computed."""
    import nnsight
    from transformers import Phi3Config, Phi3ForCausalLM

    from vrh_interp.core.description.families.described import DescribedRowsReadout
    from vrh_interp.core.execution.templates.readout import AttentionRowsReadout, attention_call_label

    torch.manual_seed(0)
    config = Phi3Config(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, partial_rotary_factor=0.5,
                        max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = Phi3ForCausalLM(config).eval()
    ids = torch.randint(3, 100, (2, 9))
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0  # left padding
    description = AttentionDescription("model.layers.{layer}.self_attn", 2, 4, 2, 16,
                                       qkv=FusedQKV("qkv_proj", "concatenated"), rotary=rotary)
    description.check(model)
    envoy = nnsight.NNsight(model)
    rows = [3, 5, -1]
    described = DescribedRowsReadout.for_description(description, [0, 1], rows)
    label = attention_call_label(envoy.model.layers[0].self_attn.source.names)
    native = AttentionRowsReadout.build({layer: description.attention_path(layer) for layer in (0, 1)}, label, rows)
    values = []
    for readout in (described, native):
        with torch.no_grad(), envoy.trace(input_ids=ids, attention_mask=mask):
            values.append(nnsight.save([readout.at_attention_call(envoy, layer) for layer in (0, 1)]))
    maps = eager_attention_maps(model, {"input_ids": ids, "attention_mask": mask})
    for layer in (0, 1):
        assert torch.equal(values[0][layer], values[1][layer])
        torch.testing.assert_close(values[0][layer], maps[layer][:, :, [3, 5, 8]], rtol=0, atol=1e-5)
