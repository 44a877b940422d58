"""``toy_training.grow``: the head revival and the layer sharing that rebuild toy C (issue 31), checked on the wide
model built from toy A (``planted.embed_donor``), against the donor's outputs and the weights they start from."""

from __future__ import annotations

import pytest
import torch

from toy_training import grow
from toy_training import train as trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def wide():
    config = trainer.TrainConfig(**{**trainer.MODEL_PRESETS["c"], "model": "c"})
    processor = trainer.build_processor("c")
    model = trainer.build_model(config, processor).eval()
    trainer.load_whole_model(model, config.warm_start)
    samples = trainer.held_out_samples(1, 1)
    inputs = dict(processor(images=[s.image for s in samples], text=trainer.grounding_prompts(processor, "c", samples),
                            return_tensors="pt", padding=True))
    return model, inputs


def _logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits[inputs["attention_mask"].bool()]


def _copy(model):
    clone = type(model)(model.config).eval()
    clone.load_state_dict(model.state_dict())
    return clone


def test_revive_without_noise_preserves_the_function_and_leaves_no_head_inert(wide) -> None:
    model, inputs = wide
    revived = _copy(model)
    norms_before = grow.head_norms(revived)
    done = grow.revive(revived, noise=0.0)
    assert done["split"], "the donor layers' inert slots were not split"
    assert torch.allclose(_logits(revived, inputs), _logits(model, inputs), atol=1e-4)
    donor_layers = sorted({layer for layer, _, _ in done["split"]})
    norms = grow.head_norms(revived)[donor_layers]
    assert (norms_before[donor_layers] < done["threshold"]).any()
    assert (norms >= 0.25 * norms.max() / 2).all()  # every slot of a donor layer now holds half a live head


@pytest.mark.parametrize("pairs", [((1, 2), (3, 4)), ((7, 6),)])
def test_share_attention_copies_the_source_layer_and_halves_both(wide, pairs) -> None:
    """The inserted layers take the layer above (toy C's c-share); the last layer, with none above, the one below."""
    model, inputs = wide
    original = model.model.language_model.layers
    shared = _copy(model)
    assert grow.share_attention(shared, pairs) == list(pairs)
    layers = shared.model.language_model.layers
    for layer, source in pairs:
        donor = original[source].self_attn
        for name in ("q_proj", "k_proj", "v_proj"):
            assert torch.equal(getattr(layers[layer].self_attn, name).weight, getattr(donor, name).weight)
        assert torch.equal(layers[layer].input_layernorm.weight, original[source].input_layernorm.weight)
        total = layers[layer].self_attn.o_proj.weight + layers[source].self_attn.o_proj.weight
        assert torch.allclose(total, donor.o_proj.weight)
        assert torch.equal(layers[layer].self_attn.o_proj.weight, layers[source].self_attn.o_proj.weight)
    # near the original function; without the halving the shared layers' attention would count twice
    doubled = _copy(model)
    for layer, source in pairs:
        doubled.model.language_model.layers[layer].load_state_dict(
            {**doubled.model.language_model.layers[layer].state_dict(),
             **{f"self_attn.{k}": v for k, v in original[source].self_attn.state_dict().items()},
             **{f"input_layernorm.{k}": v for k, v in original[source].input_layernorm.state_dict().items()}})
    reference = _logits(model, inputs)
    assert (_logits(shared, inputs) - reference).norm() < 0.5 * (_logits(doubled, inputs) - reference).norm()


def test_share_attention_refuses_a_missing_layer_and_a_layer_sharing_with_itself(wide) -> None:
    model, _ = wide
    with pytest.raises(ValueError, match="no layer 8"):
        grow.share_attention(_copy(model), ((7, 8),))
    with pytest.raises(ValueError, match="cannot share its own attention"):
        grow.share_attention(_copy(model), ((3, 3),))


def test_split_heads_makes_a_slot_half_of_its_kv_groups_largest_head(wide) -> None:
    model, inputs = wide
    norms = grow.head_norms(model)
    group = model.config.get_text_config().num_attention_heads // model.config.get_text_config().num_key_value_heads
    layer = int(norms.max(axis=1).argmax())  # a donor layer: it has live heads and zero-output slots
    slot = next(h for h in range(norms.shape[1])
                if norms[layer, h] < 1e-6 and norms[layer, h - h % group:h - h % group + group].max() > 0)
    start = slot - slot % group
    donor = max(range(start, start + group), key=lambda h: norms[layer, h])
    split = _copy(model)
    assert grow.split_heads(split, ((layer, slot),), noise=0.0) == [(layer, donor, slot)]
    # the slot output nothing, so the split preserves the function exactly (no noise)
    assert torch.allclose(_logits(split, inputs), _logits(model, inputs), atol=1e-4)
    head_dim = model.config.get_text_config().head_dim
    rows = lambda h: slice(h * head_dim, (h + 1) * head_dim)  # noqa: E731
    before = model.model.language_model.layers[layer].self_attn
    after = split.model.language_model.layers[layer].self_attn
    assert torch.equal(after.q_proj.weight[rows(slot)], before.q_proj.weight[rows(donor)])
    for h in (donor, slot):
        assert torch.allclose(after.o_proj.weight[:, rows(h)], 0.5 * before.o_proj.weight[:, rows(donor)])


def test_split_heads_shares_a_donor_of_two_slots_in_thirds(wide) -> None:
    """Two slots of one key/value group split from the same donor: the donor and both copies carry a third of its
    output projection each (splitting one after the other would leave 1/2, 1/4, 1/4)."""
    model, inputs = wide
    norms = grow.head_norms(model)
    group = model.config.get_text_config().num_attention_heads // model.config.get_text_config().num_key_value_heads
    layer = int(norms.max(axis=1).argmax())
    start = next(s for s in range(0, norms.shape[1], group)
                 if (norms[layer, s:s + group] < 1e-6).sum() >= 2 and norms[layer, s:s + group].max() > 0)
    first, second = [h for h in range(start, start + group) if norms[layer, h] < 1e-6][:2]
    donor = max((h for h in range(start, start + group) if h not in (first, second)), key=lambda h: norms[layer, h])
    split = _copy(model)
    assert grow.split_heads(split, ((layer, first), (layer, second)), noise=0.0) == [(layer, donor, first),
                                                                                     (layer, donor, second)]
    assert torch.allclose(_logits(split, inputs), _logits(model, inputs), atol=1e-4)
    head_dim = model.config.get_text_config().head_dim
    rows = lambda h: slice(h * head_dim, (h + 1) * head_dim)  # noqa: E731
    before = model.model.language_model.layers[layer].self_attn.o_proj.weight[:, rows(donor)]
    after = split.model.language_model.layers[layer].self_attn.o_proj.weight
    for h in (donor, first, second):
        assert torch.allclose(after[:, rows(h)], before / 3)


def test_split_heads_refuses_unknown_heads_and_a_group_with_no_donor(wide) -> None:
    model, _ = wide
    with pytest.raises(ValueError, match="no head L9H0"):
        grow.split_heads(_copy(model), ((9, 0),))
    with pytest.raises(ValueError, match="none can donate"):
        grow.split_heads(_copy(model), tuple((0, h) for h in range(4)))


def test_train_cli_refuses_a_malformed_split_heads_list_without_a_traceback(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "toy_training.train", "--model", "c", "--warm-start", "x",
                           "--split-heads", "7,12", "--out", str(tmp_path / "run")], cwd=root, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "--split-heads: cannot parse '7' as a head" in done.stderr
    assert not (tmp_path / "run").exists()
