"""Trace templates against independent plain-PyTorch references, on the tiny model of every family."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import noise_image, tiny_vlm
from tests.reference import (
    captured_o_proj_inputs,
    eager_attention_maps,
    zeroed_attention_outputs,
    zeroed_heads,
)
from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.description.heads import Head, HeadOutOfRangeError, HeadSet
from vrh_interp.core.execution.templates.readout import eager_attention_rows


def _batch(vlm):
    """Two prompts of different lengths (left padding exercised) on a non-square image."""
    image = noise_image(83, 61, seed=1)
    return vlm.encode_grounding([image, noise_image(64, 96, seed=2)], ["the red circle", "the cat left of the dog"])


def _heads(vlm) -> HeadSet:
    g = vlm.geometry
    return HeadSet([Head(0, 1), Head(g.num_layers - 1, 0), Head(g.num_layers - 1, g.num_heads - 1)])


def test_ablation_logits_equal_pre_hook_reference(family):
    vlm = tiny_vlm(family)
    batch = _batch(vlm)
    heads = _heads(vlm)
    result = iv.run_forward(vlm, batch.encoding, [iv.head_ablation(vlm, heads)])
    with torch.no_grad(), zeroed_heads(vlm.hf_model, heads.by_layer()):
        reference = vlm.hf_model(**batch.encoding).logits
    with torch.no_grad():
        plain = vlm.hf_model(**batch.encoding).logits
    assert (result.logits - plain).abs().max() > 1e-6, "ablation had no effect: the test would not catch a no-op"
    torch.testing.assert_close(result.logits, reference, rtol=0, atol=1e-6)


def test_ablated_greedy_generation_equals_reference(family):
    vlm = tiny_vlm(family)
    batch = _batch(vlm)
    heads = _heads(vlm)
    result = iv.run_generate(vlm, batch.encoding, [iv.head_ablation(vlm, heads)], max_new_tokens=6)
    with torch.no_grad(), zeroed_heads(vlm.hf_model, heads.by_layer()):
        reference = vlm.hf_model.generate(**batch.encoding, max_new_tokens=6, do_sample=False)
    assert torch.equal(result.ids, reference)


def test_ablating_all_heads_equals_zeroing_attention_output(family):
    vlm = tiny_vlm(family)
    batch = _batch(vlm)
    result = iv.run_forward(vlm, batch.encoding, [iv.head_ablation(vlm, vlm.geometry.all_heads())])
    with torch.no_grad(), zeroed_attention_outputs(vlm.hf_model, range(vlm.geometry.num_layers)):
        reference = vlm.hf_model(**batch.encoding).logits
    torch.testing.assert_close(result.logits, reference, rtol=0, atol=1e-5)


def test_memory_efficient_readout_equals_eager_rows(family):
    vlm = tiny_vlm(family)
    batch = _batch(vlm)
    layout = batch.layouts[0]
    rows = [layout.visual_positions[0], layout.visual_positions[-1], batch.prompt_length - 2, -1]
    result = iv.run_forward(vlm, batch.encoding, [iv.attention_readout(vlm, rows)])
    maps = eager_attention_maps(vlm.hf_model, batch.encoding)
    assert len(maps) == vlm.geometry.num_layers
    absolute = torch.tensor(rows) % batch.prompt_length
    real_query = batch.encoding["attention_mask"][:, absolute].bool()  # left-padding query rows attend nowhere
    for layer, full in enumerate(maps):
        got = result.values[0][layer]
        want = full[:, :, absolute]
        assert (got - want).abs()[real_query[:, None, :, None].expand_as(got)].max().item() <= 1e-5, f"layer {layer}"
        assert torch.isfinite(got).all()
    # the library's own eager path agrees too
    eager = eager_attention_rows(vlm.hf_model, batch.encoding, absolute)
    assert (eager - torch.stack([m[:, :, absolute] for m in maps])).abs().max().item() == 0


def test_readout_during_generation_equals_eager_rows_of_full_sequence(family):
    vlm = tiny_vlm(family)
    batch = _batch(vlm)
    heads = HeadSet([Head(0, 0)])
    result = iv.run_generate(vlm, batch.encoding, [iv.attention_readout(vlm, [-1]), iv.head_ablation(vlm, heads)],
                             max_new_tokens=4, min_new_tokens=4)
    prompt_len = batch.prompt_length
    full = dict(batch.encoding)
    new = result.ids.shape[1] - prompt_len
    full["input_ids"] = result.ids
    full["attention_mask"] = torch.cat(
        [batch.encoding["attention_mask"], torch.ones(result.ids.shape[0], new, dtype=torch.long)], dim=1)
    if "mm_token_type_ids" in full:
        full["mm_token_type_ids"] = torch.cat(
            [batch.encoding["mm_token_type_ids"], torch.zeros(result.ids.shape[0], new, dtype=torch.long)], dim=1)
    with zeroed_heads(vlm.hf_model, heads.by_layer()):
        maps = eager_attention_maps(vlm.hf_model, full)
    assert len(result.steps) == new
    for step, values in enumerate(result.steps):
        for layer in range(vlm.geometry.num_layers):
            got = values[0][layer][:, :, 0]
            keys = got.shape[-1]
            want = maps[layer][:, :, prompt_len - 1 + step, :keys]
            assert (got - want).abs().max().item() <= 1e-5, f"step {step} layer {layer}"


def test_head_output_capture_equals_pre_hook_capture(family):
    vlm = tiny_vlm(family)
    batch = _batch(vlm)
    result = iv.run_forward(vlm, batch.encoding, [iv.head_output_capture(vlm)])
    reference = captured_o_proj_inputs(vlm.hf_model, dict(batch.encoding))
    for layer, value in reference.items():
        torch.testing.assert_close(result.values[0][layer], value, rtol=0, atol=0)


def test_patching_a_run_into_itself_changes_nothing(family):
    vlm = tiny_vlm(family)
    batch = _batch(vlm)
    captured = iv.run_forward(vlm, batch.encoding, [iv.head_output_capture(vlm)]).values[0]
    heads = vlm.geometry.all_heads()
    patched = iv.run_forward(vlm, batch.encoding, [iv.head_output_patch(vlm, heads, source=captured)])
    with torch.no_grad():
        plain = vlm.hf_model(**batch.encoding).logits
    torch.testing.assert_close(patched.logits, plain, rtol=0, atol=1e-6)


def test_templates_survive_remote_serialisation(family):
    """A ``vlm.on(remote="local")`` handle serialises the request as the NDIF path does, with local modules hidden."""
    vlm = tiny_vlm(family)
    batch = _batch(vlm)
    templates = [iv.attention_readout(vlm, [-1]), iv.head_ablation(vlm, _heads(vlm)), iv.head_output_capture(vlm, [0])]
    local = iv.run_forward(vlm, batch.encoding, templates)
    remote = iv.run_forward(vlm.on(remote="local"), batch.encoding, templates)
    torch.testing.assert_close(remote.logits, local.logits, rtol=0, atol=0)
    for a, b in zip(local.values, remote.values):
        for layer in a:
            torch.testing.assert_close(b[layer], a[layer], rtol=0, atol=0)
    gen_local = iv.run_generate(vlm, batch.encoding, templates[1:2], max_new_tokens=3)
    gen_remote = iv.run_generate(vlm.on(remote="local"), batch.encoding, templates[1:2], max_new_tokens=3)
    assert torch.equal(gen_local.ids, gen_remote.ids)


def test_heads_out_of_range_are_refused(family):
    vlm = tiny_vlm(family)
    g = vlm.geometry
    with pytest.raises(HeadOutOfRangeError, match=f"L{g.num_layers}H0"):
        iv.head_ablation(vlm, HeadSet([Head(g.num_layers, 0)]))
    with pytest.raises(HeadOutOfRangeError):
        iv.attention_readout(vlm, [-1], heads=HeadSet([Head(0, g.num_heads)]))
