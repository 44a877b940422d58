"""Loading from a local folder goes through the same code path as a hub id; bad models get clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import GPT2Config

from tests.conftest import noise_image
from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.description.families import UnsupportedModelError, adapter_for_config
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.specs import load
from vrh_interp.core.description.tiny import build_tiny


def test_load_local_folder_equals_in_memory_model(tmp_path):
    tiny = build_tiny("llava")
    tiny.model.save_pretrained(tmp_path)
    tiny.processor.save_pretrained(tmp_path)
    loaded = load(tmp_path, dtype=torch.float32)
    assert loaded.adapter.name == "llava" and loaded.model_id == str(tmp_path)
    batch = loaded.encode_grounding([noise_image(70, 50)], ["the red circle"])
    with torch.no_grad():
        want = tiny.model(**batch.encoding).logits
        got = loaded.hf_model(**batch.encoding).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load(tmp_path / "no" / "such-model")


def test_unsupported_architecture_lists_families_and_how_to_add_one():
    with pytest.raises(UnsupportedModelError) as info:
        adapter_for_config(GPT2Config())
    message = str(info.value)
    assert "'gpt2'" in message and "Qwen2.5-VL" in message and "FamilyAdapter" in message and "adapter=" in message


def test_hub_ids_are_not_mistaken_for_missing_folders(monkeypatch):
    """A hub id reaches from_pretrained (here: refused offline), not the missing-folder check."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(Exception) as info:
        load("Qwen/Qwen2-VL-2B-Instruct")
    assert not isinstance(info.value, FileNotFoundError) or "does not exist (pass a hub id" not in str(info.value)


def test_per_layer_device_map_loads_through_the_same_path_and_computes_the_same(tmp_path):
    """A ``device_map`` splitting the language layers (layer 1 offloaded to disk: accelerate keeps it on ``meta``
    and streams it in through a hook, the hook that moves activations between GPUs in a multi-GPU map) gives the
    plain load's logits, ablated logits, greedy answers and attention statistics exactly."""
    from vrh_interp.scoring.collect import collect_batch
    from vrh_interp.data.sources import synthetic_samples

    tiny = build_tiny("llava")
    tiny.model.save_pretrained(tmp_path / "model")
    tiny.processor.save_pretrained(tmp_path / "model")
    device_map = {"model.vision_tower": "cpu", "model.multi_modal_projector": "cpu",
                  "model.language_model.embed_tokens": "cpu", "model.language_model.layers.0": "cpu",
                  "model.language_model.layers.1": "disk", "model.language_model.norm": "cpu", "lm_head": "cpu"}
    plain = load(tmp_path / "model", dtype=torch.float32)
    split = load(tmp_path / "model", dtype=torch.float32, device_map=device_map, offload_folder=tmp_path / "offload")
    assert split.hf_model.hf_device_map == device_map
    offloaded = split.hf_model.get_decoder().layers[1].self_attn.o_proj.weight
    assert offloaded.device.type == "meta" and split.device == torch.device("cpu")
    batch = plain.encode_grounding([noise_image(70, 50), noise_image(40, 60, seed=1)], ["the red circle", "a cat"])
    heads = HeadSet([Head(0, 1), Head(1, 0), Head(1, 2)])
    for templates in ([], [iv.head_ablation(plain, heads)]):
        want = iv.run_forward(plain, batch.encoding, templates).logits
        got = iv.run_forward(split, batch.encoding, [iv.head_ablation(split, heads)] if templates else []).logits
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    want_ids = iv.run_generate(plain, batch.encoding, [iv.head_ablation(plain, heads)], max_new_tokens=4).ids
    got_ids = iv.run_generate(split, batch.encoding, [iv.head_ablation(split, heads)], max_new_tokens=4).ids
    assert torch.equal(got_ids, want_ids)
    samples = synthetic_samples("detect", 2)
    for want_stats, got_stats in zip(collect_batch(plain, samples, max_new_tokens=3),
                                     collect_batch(split, samples, max_new_tokens=3)):
        assert got_stats.answer == want_stats.answer
        assert np.array_equal(got_stats.output_rows, want_stats.output_rows)
        assert np.array_equal(got_stats.input_rows, want_stats.input_rows)


def _rotary_buffers(model) -> dict[str, torch.Tensor]:
    return {name: buf for name, buf in model.named_buffers() if name.endswith("inv_freq")}


@pytest.mark.parametrize("family", ["paligemma2", "qwen2_5_vl"])
def test_cast_model_leaves_rotary_frequencies_as_from_config_builds_them(family):
    from transformers import AutoModelForImageTextToText

    from vrh_interp.core.description.model import cast_model

    tiny = build_tiny(family)
    reference = AutoModelForImageTextToText.from_config(tiny.model.config, dtype=torch.bfloat16)  # HF's own dtype path
    model = cast_model(tiny.model, torch.bfloat16)
    expected, got = _rotary_buffers(reference), _rotary_buffers(model)
    assert expected and got.keys() == expected.keys()
    for name, buf in expected.items():
        assert buf.dtype == got[name].dtype == torch.float32 and torch.equal(got[name], buf), name
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_half_precision_rotary_frequencies_move_far_positions_and_cast_model_does_not():
    """Why cast_model exists: ``.to(bf16)`` rounds ``inv_freq``, and the rotary angle error grows with position."""
    import copy

    from vrh_interp.core.description.model import cast_model

    model = build_tiny("paligemma2").model
    rotary = model.model.language_model.rotary_emb
    x, far = torch.zeros(1, dtype=torch.bfloat16), torch.tensor([[1000]])
    exact, _ = rotary(x.float(), far)
    errors = {}
    for how in ("to", "cast_model"):
        copied = copy.deepcopy(model)
        copied = copied.to(torch.bfloat16) if how == "to" else cast_model(copied, torch.bfloat16)
        cos, _ = copied.model.language_model.rotary_emb(x, far)
        errors[how] = (cos.float() - exact).abs().max().item()
    assert errors["to"] > 0.1  # radians-sized errors at position 1,000
    assert errors["cast_model"] <= 2 ** -8  # the rounding of cos itself


def test_wrap_warns_when_rotary_frequencies_are_half_precision(recwarn):
    import copy

    from vrh_interp.core.description.model import cast_model, wrap

    tiny = build_tiny("paligemma2")
    with pytest.warns(UserWarning, match=r"rotary frequency buffer.*bfloat16.*cast_model"):
        wrap(copy.deepcopy(tiny.model).to(torch.bfloat16), tiny.processor)
    recwarn.clear()
    wrap(cast_model(tiny.model, torch.bfloat16), tiny.processor)
    assert not [w for w in recwarn if "rotary frequency" in str(w.message)]


def test_loading_a_builtin_spec_in_bf16_keeps_rotary_frequencies_float32():
    from vrh_interp.specs import load_spec

    vlm = load_spec("tiny:paligemma", dtype="bfloat16")
    buffers = _rotary_buffers(vlm.hf_model)
    assert buffers and {b.dtype for b in buffers.values()} == {torch.float32}
    assert {p.dtype for p in vlm.hf_model.parameters()} == {torch.bfloat16}


def test_attn_implementation_is_honoured_for_builtin_specs():
    """``vrh.load("toy:planted", attn_implementation="eager")`` loads eager attention (it once ran sdpa), so a user's
    own read of ``self_attn.output[1]`` in a trace is the attention pattern."""
    import nnsight

    toy = load("toy:planted", attn_implementation="eager", progress=False)
    assert toy.hf_model.config._attn_implementation == "eager"
    assert toy.hf_model.config.get_text_config()._attn_implementation == "eager"
    assert load("toy:planted", progress=False).hf_model.config._attn_implementation == "sdpa"  # the default stays

    for attention in ("eager", None):
        vlm = load("tiny:qwen2_vl", attn_implementation=attention, progress=False)
        batch = vlm.encode_grounding([noise_image(70, 50)], ["the red circle"])
        with torch.no_grad(), vlm.nn.trace(**batch.encoding):
            pattern = nnsight.save(vlm.adapter.attention_module(vlm.nn, 1).output[1])
        if attention == "eager":
            assert pattern.shape == (1, vlm.geometry.num_heads, batch.prompt_length, batch.prompt_length)
            torch.testing.assert_close(pattern.sum(-1), torch.ones(pattern.shape[:3]))
        else:
            assert pattern is None  # sdpa builds no pattern: what eager on demand is for


def test_load_refuses_keywords_it_would_drop_in_one_line():
    with pytest.raises(ValueError, match="unknown keyword attn_implementaton=: did you mean attn_implementation=") \
            as info:
        load("toy:planted", attn_implementaton="eager")
    assert "\n" not in str(info.value) and "device_map, dtype, revision" in str(info.value)
    with pytest.raises(ValueError, match="unknown keyword attn_implementaton="):  # the same for a hub id or folder
        load("Qwen/Qwen2-VL-2B-Instruct", attn_implementaton="eager")
    for keywords, named in (({"revision": "main"}, "revision="), ({"low_cpu_mem_usage": True}, "low_cpu_mem_usage="),
                            ({"trust_remote_code": True}, "trust_remote_code=")):
        with pytest.raises(ValueError, match=f"load\\('tiny:qwen2_vl'\\) does not take {named}.* takes only "
                                             "device_map, dtype, adapter, attn_implementation"):
            load("tiny:qwen2_vl", **keywords)
    with pytest.raises(ValueError, match="attn_implementation='eagr'"):
        load("tiny:qwen2_vl", attn_implementation="eagr")
    with pytest.raises(ValueError, match="a built-in spec loads on one device"):
        load("tiny:qwen2_vl", device_map={"": "cpu"})


def test_remote_id_and_device_are_honoured_for_builtin_specs():
    assert load("tiny:qwen2_vl", remote_id="me/tiny").remote_id == "me/tiny"
    assert load("toy:planted", remote_id="me/planted", progress=False).remote_id == "me/planted"
    assert load("tiny:qwen2_vl", device_map="cpu").device.type == "cpu"


def test_a_from_pretrained_keyword_no_model_takes_is_one_line(tmp_path):
    tiny = build_tiny("llava")
    tiny.model.save_pretrained(tmp_path)
    tiny.processor.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="does not take foo_bar=: neither vrh_interp.load nor transformers' "
                                         "from_pretrained") as info:
        load(tmp_path, foo_bar=1, progress=False)
    assert "\n" not in str(info.value)
