"""Attention redirection (``templates.redirect.HeadRedirect``) against a plain-PyTorch reference, on every family.

The reference (``tests.reference.redirected_attention``) replaces the steered layers' attention by eager attention
written out by hand, with ``alpha`` added to the chosen heads' pre-softmax scores on the target keys at the answer
rows; the library recomputes those heads inside the model's own (sdpa) attention call. Images are non-square and of
two sizes (tiled families get several tiles), the prompts of two lengths (left padding)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_vlm
from tests.families.checks import edge_heads, two_prompt_batch
from tests.reference import decoder_layers, redirected_attention, text_geometry
from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.description.heads import Head, HeadSet

ALPHA = 6.0
BOXES = [(10, 5, 50, 40), (30, 40, 64, 96)]




def _by_layer(heads: HeadSet) -> dict[int, list[int]]:
    return {layer: list(idx) for layer, idx in heads.by_layer().items()}


def test_region_keys_are_the_boxes_visual_tokens(family):
    vlm = tiny_vlm(family)
    batch = two_prompt_batch(vlm)
    keys = iv.region_keys(batch, BOXES)
    for row, (layout, box) in enumerate(zip(batch.layouts, BOXES)):
        chosen = keys[row].nonzero().flatten().tolist()
        assert chosen, f"row {row}: the box selects no visual token"
        assert set(chosen) <= set(layout.visual_positions)
        assert len(chosen) < len(layout.visual_positions), "the box must select a part of the image"


def test_redirected_prompt_forward_equals_reference(family):
    vlm = tiny_vlm(family)
    batch = two_prompt_batch(vlm)
    heads = edge_heads(vlm)
    keys = iv.region_keys(batch, BOXES)
    result = iv.run_forward(vlm, batch.encoding, [iv.head_redirect(vlm, heads, ALPHA, keys)])
    with torch.no_grad():
        plain = vlm.hf_model(**batch.encoding).logits
    with torch.no_grad(), redirected_attention(vlm.hf_model, _by_layer(heads), ALPHA, keys):
        reference = vlm.hf_model(**batch.encoding).logits
    real = batch.encoding["attention_mask"].bool()  # left-padding rows attend nowhere: not compared
    assert (result.logits[:, -1] - plain[:, -1]).abs().max() > 1e-4, "redirection had no effect: a no-op would pass"
    assert (result.logits - reference).abs().amax(-1)[real].max().item() <= 2e-5
    # only the answer row is steered at the prompt forward: every earlier row is the unsteered model's (except in
    # PaliGemma, whose whole prompt is a bidirectional prefix: earlier rows see the steered row at later layers)
    if family != "paligemma":
        torch.testing.assert_close(result.logits[:, :-1], plain[:, :-1], rtol=0, atol=0)


def test_redirected_generation_equals_reference_step_by_step(family):
    """Greedy ids equal, and the steered heads' outputs at every generation step equal the reference's."""
    vlm = tiny_vlm(family)
    batch = two_prompt_batch(vlm)
    heads = edge_heads(vlm)
    keys = iv.region_keys(batch, BOXES)
    steps = 4
    capture = iv.head_output_capture(vlm, sorted(heads.by_layer()))
    result = iv.run_generate(vlm, batch.encoding, [iv.head_redirect(vlm, heads, ALPHA, keys), capture],
                             max_new_tokens=steps, min_new_tokens=steps)
    num_heads, head_dim = text_geometry(vlm.hf_model)
    seen: dict[int, list[torch.Tensor]] = {layer: [] for layer in heads.by_layer()}
    handles = []
    for layer in heads.by_layer():
        def hook(_module, args, layer=layer):
            b, s, _ = args[0].shape
            seen[layer].append(args[0].detach().clone().view(b, s, num_heads, head_dim)[:, -1])

        handles.append(decoder_layers(vlm.hf_model)[layer].self_attn.o_proj.register_forward_pre_hook(hook))
    try:
        with torch.no_grad(), redirected_attention(vlm.hf_model, _by_layer(heads), ALPHA, keys):
            reference = vlm.hf_model.generate(**batch.encoding, max_new_tokens=steps, min_new_tokens=steps,
                                              do_sample=False)
    finally:
        for handle in handles:
            handle.remove()
    assert torch.equal(result.ids, reference)
    assert len(result.steps) == steps
    for step in range(steps):
        for layer, idx in heads.by_layer().items():
            got = result.steps[step][1][layer][:, -1][:, list(idx)]
            want = seen[layer][step][:, list(idx)]
            assert (got - want).abs().max().item() <= 2e-5, f"step {step} layer {layer}"


def test_alpha_zero_is_the_unsteered_run(family):
    vlm = tiny_vlm(family)
    batch = two_prompt_batch(vlm)
    keys = iv.region_keys(batch, BOXES)
    template = iv.head_redirect(vlm, edge_heads(vlm), 0.0, keys)
    with torch.no_grad():
        plain = vlm.hf_model(**batch.encoding).logits
        plain_ids = vlm.hf_model.generate(**batch.encoding, max_new_tokens=5, do_sample=False)
    torch.testing.assert_close(iv.run_forward(vlm, batch.encoding, [template]).logits, plain, rtol=0, atol=0)
    assert torch.equal(iv.run_generate(vlm, batch.encoding, [template], max_new_tokens=5).ids, plain_ids)


@pytest.mark.parametrize("family", ["qwen2_vl", "internvl"])
def test_rows_redirect_like_their_condition_alone(family):
    """One batch replicated per condition (heads x alpha, row by row) gives each block what it gives alone."""
    vlm = tiny_vlm(family)
    batch = two_prompt_batch(vlm)
    keys = iv.region_keys(batch, BOXES)
    heads, other = edge_heads(vlm), HeadSet([Head(0, 0)])
    conditions = [(heads, ALPHA), (other, 2 * ALPHA), (None, 0.0), (heads, -ALPHA)]
    rows = batch.batch_size
    template = iv.head_redirect(vlm, [h for h, _ in conditions for _ in range(rows)],
                                [a for _, a in conditions for _ in range(rows)], keys.repeat(len(conditions), 1))
    together = iv.run_forward(vlm, iv.replicate_encoding(batch.encoding, len(conditions)), [template]).logits
    for c, (h, alpha) in enumerate(conditions):
        alone = iv.run_forward(vlm, batch.encoding, [iv.head_redirect(vlm, h or HeadSet(), alpha, keys)]).logits
        torch.testing.assert_close(together[c * rows:(c + 1) * rows, -1], alone[:, -1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3"])
def test_redirect_survives_remote_serialisation(family):
    vlm = tiny_vlm(family)
    batch = two_prompt_batch(vlm)
    template = iv.head_redirect(vlm, edge_heads(vlm), ALPHA, iv.region_keys(batch, BOXES))
    local = iv.run_generate(vlm, batch.encoding, [template], max_new_tokens=3)
    remote = iv.run_generate(vlm.on(remote="local"), batch.encoding, [template], max_new_tokens=3)
    assert torch.equal(local.ids, remote.ids)


def test_redirect_is_refused_on_transformer_lens():
    from vrh_interp.core.execution.backends.base import BackendError, check_supported
    from vrh_interp.core.execution.backends.select import backend_type

    with pytest.raises(BackendError, match="redirect"):
        check_supported(backend_type("transformer-lens"), operations=["steering"])
    check_supported(backend_type("nnsight"), operations=["steering"])
