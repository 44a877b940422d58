"""The paper's eleven models: the transformers-native ones at full size on the meta device, their language
backbones as tiny models against the plain-PyTorch references.

Meta device (no weights, about a second each): each checkpoint is built from the configuration facts recorded in
``vrh_interp.core.description.families.paper_models`` (sources: the checkpoints' config.json); the registry must pick
the right adapter, the head grid must match the attention modules and the published head sets, and the module paths the
masking, capture and readout templates name must resolve to the language model's attention and output projection
(found independently through transformers' ``get_decoder()``). The parameter count the facts give is checked
against the count each checkpoint's hub page shows, which ties every recorded size to the real model.

Tiny models: Llama 3 in LLaVA-NeXT, Gemma 2 (soft-capping, sliding windows) in PaliGemma 2, GLM-4.6V's
``glm46v`` classes and Qwen3 in InternVL (``TINY_BACKBONE_VARIANTS``) run the reference checks every family runs in
tests/test_templates.py (imported below; the ``family`` fixture here selects the variants), plus what Gemma 2 adds.

Remote-code models whose language model transformers ships (DeepSeek-VL2-Small: DeepSeek-V2's multi-head latent
attention with MoE MLPs; Phi-4-Reasoning-Vision: Phi-4, Phi-3's fused ``qkv_proj``): that language model is built on
the meta device from the recorded facts (its hub parameter count, the head grid, the recipe's description checked
against every layer), and as a tiny random model on which the described masking, capture and readout equal forward
pre-hooks on ``o_proj`` and attention rows computed by hand from the weights.
"""

from __future__ import annotations

import json
import warnings
from contextlib import contextmanager
from typing import Any, Iterator

import nnsight
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

import vrh_interp
from tests.conftest import noise_image, tiny_vlm
from tests.reference import decoder_layers, eager_attention_maps
from tests.test_templates import (  # noqa: F401  (collected here with this module's `family` fixture)
    _batch,
    test_ablated_greedy_generation_equals_reference,
    test_ablating_all_heads_equals_zeroing_attention_output,
    test_ablation_logits_equal_pre_hook_reference,
    test_head_output_capture_equals_pre_hook_capture,
    test_heads_out_of_range_are_refused,
    test_memory_efficient_readout_equals_eager_rows,
    test_patching_a_run_into_itself_changes_nothing,
    test_readout_during_generation_equals_eager_rows_of_full_sequence as _generation_readout_check,
    test_templates_survive_remote_serialisation,
)
from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.description import published
from vrh_interp.core.description.boxes import Box
from vrh_interp.apps.cli import main
from vrh_interp.core.description.families import UnsupportedModelError, adapter_for_config
from vrh_interp.core.description.families.described import (
    AttentionDescription,
    AttentionDescriptionError,
    FusedQKV,
    LatentQKV,
    Rotary,
)
from vrh_interp.core.description.families.paper_models import NATIVE, PAPER_MODELS, REMOTE_CODE, PaperModel, paper_model
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.core.description.model import VLM
from vrh_interp.core.execution.templates import module_at
from vrh_interp.core.execution.templates.readout import ReadoutUnavailableError
from tests.layout_probe import check_layout_by_painting
from vrh_interp.core.description.tiny import TINY_BACKBONE_VARIANTS, build_tiny

NATIVE_MODELS = [m for m in PAPER_MODELS if m.support == NATIVE]

# Parameter count on each checkpoint's hub page (safetensors), in billions, as rounded there (from public
# knowledge, not downloaded): checked to within half the last digit shown.
HUB_PARAMETERS_B = {
    "Qwen2.5-VL-7B": "8.29", "Qwen3-VL-8B": "8.77", "InternVL3-8B": "7.94", "InternVL3.5-8B": "8.53",
    "LLaVA-NeXT-Llama3-8B": "8.36", "PaliGemma2-10B": "9.66", "GLM-4.6V-Flash": "10.3",
}


def test_vrh_families_paper_lists_the_eleven_with_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["families", "--paper", "--json"]) == 0
    rows = {row["model"]: row for row in json.loads(capsys.readouterr().out)}
    assert list(rows) == [m.name for m in PAPER_MODELS]
    paligemma2 = rows["PaliGemma2-10B"]
    assert (paligemma2["status"], paligemma2["heads"]) == ("native adapter (paligemma)", "42x16")
    for name in ("Magma-8B", "InternVL2.5-8B", "DeepSeek-VL2-Small", "Phi-4-Reasoning-Vision"):
        assert rows[name]["status"] == "described (remote code)"
    assert (rows["DeepSeek-VL2-Small"]["heads"], rows["Phi-4-Reasoning-Vision"]["heads"]) == ("27x16", "40x40")
    assert all(row["heads"] != "?" for row in rows.values())  # all eleven have a head grid and a path


def test_the_eleven_models_are_listed_once_with_their_support() -> None:
    names = [m.name for m in PAPER_MODELS]
    assert len(names) == len(set(names)) == 11
    assert {m.name for m in NATIVE_MODELS} == set(HUB_PARAMETERS_B)
    assert {m.name for m in PAPER_MODELS if m.support == REMOTE_CODE} == {
        "Magma-8B", "DeepSeek-VL2-Small", "InternVL2.5-8B", "Phi-4-Reasoning-Vision"}
    assert all(m.config is None for m in PAPER_MODELS if m.support == REMOTE_CODE)
    assert paper_model("qwen/qwen2.5-vl-7b-instruct") is paper_model("Qwen2.5-VL-7B")
    with pytest.raises(KeyError, match="not one of the paper's models"):
        paper_model("llava-1.5-7b")


@pytest.fixture(scope="module", params=NATIVE_MODELS, ids=lambda m: m.name)
def meta_model(request: pytest.FixtureRequest) -> tuple[PaperModel, Any]:
    paper = request.param
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(paper.build_config())
    return paper, model.eval()


def test_meta_model_has_the_checkpoints_size_and_adapter(meta_model: tuple[PaperModel, Any]) -> None:
    paper, model = meta_model
    adapter = adapter_for_config(model.config)
    assert adapter.name == paper.family
    count = sum(p.numel() for p in model.parameters())
    shown = HUB_PARAMETERS_B[paper.name]
    assert abs(count / 1e9 - float(shown)) <= 0.5 * 10.0 ** -len(shown.split(".")[1]), count


def test_head_geometry_matches_the_attention_modules(meta_model: tuple[PaperModel, Any]) -> None:
    paper, model = meta_model
    geometry = adapter_for_config(model.config).geometry()
    assert geometry == paper.geometry
    layers = decoder_layers(model)
    assert len(layers) == geometry.num_layers
    for layer in layers:
        attention = layer.self_attn
        assert attention.head_dim == geometry.head_dim
        assert attention.q_proj.out_features == geometry.num_heads * geometry.head_dim
        assert attention.k_proj.out_features == geometry.num_kv_heads * geometry.head_dim
        assert attention.o_proj.in_features == geometry.num_heads * geometry.head_dim
        assert attention.num_key_value_groups == geometry.num_heads // geometry.num_kv_heads


def test_gemma2_backbone_soft_caps_and_alternates_sliding_windows() -> None:
    """PaliGemma2-10B: Gemma 2 9B attention as built from the facts (query scale 256^-0.5, cap 50, window 4096
    on every other layer, the first one sliding) and eager attention, since sdpa cannot soft-cap."""
    paper = paper_model("PaliGemma2-10B")
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(paper.build_config())
    assert model.config.text_config._attn_implementation == "eager"
    for index, layer in enumerate(decoder_layers(model)):
        attention = layer.self_attn
        assert attention.scaling == 256 ** -0.5 and attention.attn_logit_softcapping == 50.0
        assert attention.sliding_window == (4096 if index % 2 == 0 else None)


PUBLISHED = [m for m in NATIVE_MODELS if m.name in {p.name for p in published.MODELS}]


@pytest.mark.parametrize("paper", PUBLISHED, ids=lambda m: m.name)
def test_every_published_head_set_fits_the_model(paper: PaperModel) -> None:
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(paper.build_config())
    geometry = adapter_for_config(model.config).geometry()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a grid differing from the paper's would warn
        for benchmark in published.BENCHMARKS:
            heads = published.heads(paper.checkpoint, benchmark.name)
            assert len(heads) == 20
            assert published.check_geometry(heads, geometry) == heads


def _template_heads(paper: PaperModel, model: Any) -> HeadSet:
    """Every published head of the model, or (no published sets) the grid's corners."""
    if paper in PUBLISHED:
        union = HeadSet()
        for benchmark in published.BENCHMARKS:
            union = union.union(published.heads(paper.name, benchmark.name))
        return union
    g = adapter_for_config(model.config).geometry()
    return HeadSet([Head(0, 0), Head(g.num_layers - 1, g.num_heads - 1)])


def test_template_module_paths_resolve_to_the_backbone(meta_model: tuple[PaperModel, Any]) -> None:
    paper, model = meta_model
    # nnsight's TransformersModel would move the weights to a device; the plain envoy reads module sources only
    vlm = VLM(hf_model=model, processor=None, adapter=adapter_for_config(model.config),
              _nnsight_model=nnsight.NNsight(model))
    layers = decoder_layers(model)
    heads = _template_heads(paper, model)
    ablation = iv.head_ablation(vlm, heads)
    assert set(ablation.projection_paths) == set(heads.by_layer())
    for layer, path in ablation.projection_paths.items():
        assert module_at(model, path) is layers[layer].self_attn.o_proj
        assert ablation.heads_by_layer[layer] == tuple(heads.by_layer()[layer])
    capture = iv.head_output_capture(vlm)
    assert [module_at(model, capture.projection_paths[i]) for i in range(len(layers))] == \
        [layer.self_attn.o_proj for layer in layers]
    readout = iv.attention_readout(vlm, [-1], heads=heads)
    for layer, path in readout.attention_paths.items():
        assert module_at(model, path) is layers[layer].self_attn
    source = vlm.nn
    for part in readout.attention_paths[min(readout.attention_paths)].split("."):
        source = source[int(part)] if part.isdigit() else getattr(source, part)
    assert readout.call_label in source.source.names and readout.call_label.startswith("attention_interface_")


# ---------------------------------------------------------------------------------------------- tiny backbones

@pytest.fixture(params=sorted(TINY_BACKBONE_VARIANTS))
def family(request: pytest.FixtureRequest) -> str:
    """The tiny variants, for the reference checks imported from tests/test_templates.py."""
    return request.param


def test_readout_during_generation_equals_eager_rows_of_full_sequence(family: str) -> None:
    if family == "paligemma2":
        pytest.skip("sliding-window layers are refused during generation: test_gemma2_generation_readout")
    _generation_readout_check(family)


@pytest.mark.parametrize(("variant", "model_class", "adapter_name", "facts"), [
    ("llava_next_llama3", "LlavaNextForConditionalGeneration", "llava_next",
     {"model_type": "llama", "num_attention_heads": 8, "num_key_value_heads": 2}),
    ("paligemma2", "PaliGemmaForConditionalGeneration", "paligemma",
     {"model_type": "gemma2", "attn_logit_softcapping": 1.0, "sliding_window": 8, "query_pre_attn_scalar": 4}),
    ("glm46v", "Glm46VForConditionalGeneration", "glm4v", {"model_type": "glm4v_text", "num_key_value_heads": 1}),
    ("internvl_qwen3", "InternVLForConditionalGeneration", "internvl", {"model_type": "qwen3", "head_dim": 16}),
])
def test_variant_is_the_backbone_and_the_registry_picks_the_adapter(variant: str, model_class: str,
                                                                    adapter_name: str, facts: dict) -> None:
    vlm = tiny_vlm(variant)
    assert type(vlm.hf_model).__name__ == model_class and vlm.adapter.name == adapter_name
    text = vlm.hf_model.config.get_text_config()
    assert {key: getattr(text, key) for key in facts} == facts
    if variant != "internvl_qwen3":
        assert text.rope_parameters["rope_theta"] == {"paligemma2": 10000.0}.get(variant, 500000.0)
    if variant == "internvl_qwen3":  # Qwen3's per-head query / key norms are in the modules the hooks wrap
        assert decoder_layers(vlm.hf_model)[0].self_attn.q_norm.weight.shape == (16,)


def test_glm46v_with_a_moe_language_model_is_refused() -> None:
    """transformers' glm46v classes also take GLM-4.6V's MoE text model, whose head_dim is not hidden // heads."""
    from transformers import Glm46VConfig

    config = Glm46VConfig(text_config={"model_type": "glm4v_moe_text", "hidden_size": 64, "num_attention_heads": 8,
                                       "head_dim": 16})
    with pytest.raises(UnsupportedModelError, match="glm4v_moe_text"):
        adapter_for_config(config)


def test_glm46v_layout_equals_tokens_changed_by_painting_the_box() -> None:
    tiny = build_tiny("glm46v")
    check_layout_by_painting(tiny, adapter_for_config(tiny.model.config), noise_image(97, 203, seed=3),
                             Box(19, 20, 87, 71))


@contextmanager
def soft_capping_off(model: Any) -> Iterator[None]:
    attentions = [layer.self_attn for layer in decoder_layers(model)]
    caps = [attention.attn_logit_softcapping for attention in attentions]
    for attention in attentions:
        attention.attn_logit_softcapping = None
    try:
        yield
    finally:
        for attention, cap in zip(attentions, caps):
            attention.attn_logit_softcapping = cap


ANSWER_LENGTH = 12  # longer than the tiny window (8): answer tokens are causal, so the window cuts in


def test_gemma2_readout_equals_soft_capped_windowed_eager_rows() -> None:
    """Rows of a teacher-forced answer (the causal suffix) on PaliGemma 2: the readout equals eager attention,
    which is windowed on the sliding layer and soft-capped everywhere (both shown to matter here)."""
    vlm = tiny_vlm("paligemma2")
    text = vlm.hf_model.config.text_config
    batch = _batch(vlm)
    encoding = vlm.teacher_forced(batch, [[ord("a") + i for i in range(ANSWER_LENGTH)]] * 2)
    rows = list(range(batch.prompt_length, batch.prompt_length + ANSWER_LENGTH))
    result = iv.run_forward(vlm, encoding, [iv.attention_readout(vlm, rows)])
    maps = eager_attention_maps(vlm.hf_model, encoding)
    for layer, full in enumerate(maps):
        torch.testing.assert_close(result.values[0][layer], full[:, :, rows], rtol=0, atol=1e-5)
    assert text.layer_types == ["sliding_attention", "full_attention"]
    seen = [(m[:, :, rows] > 0).sum(-1) for m in maps]
    assert seen[0].max() <= text.sliding_window < seen[1].min()
    with soft_capping_off(vlm.hf_model):
        uncapped = eager_attention_maps(vlm.hf_model, encoding)
    assert min((u - m).abs().max().item() for u, m in zip(uncapped, maps)) > 1e-3


def test_gemma2_generation_readout() -> None:
    """During generation a sliding layer's cache keeps only the window: reading it is refused with the reason;
    the full-attention layer reads every position and equals eager rows of the whole sequence."""
    vlm = tiny_vlm("paligemma2")
    batch = _batch(vlm)
    with pytest.raises(ReadoutUnavailableError, match="sliding window of 8"):
        iv.run_generate(vlm, batch.encoding, [iv.attention_readout(vlm, [-1])], max_new_tokens=3, min_new_tokens=3)
    result = iv.run_generate(vlm, batch.encoding, [iv.attention_readout(vlm, [-1], layers=[1])],
                             max_new_tokens=3, min_new_tokens=3)
    prompt = batch.prompt_length
    full = dict(batch.encoding, input_ids=result.ids)
    new = result.ids.shape[1] - prompt
    full["attention_mask"] = torch.cat([batch.encoding["attention_mask"], torch.ones(2, new, dtype=torch.long)], 1)
    full["token_type_ids"] = torch.cat([batch.encoding["token_type_ids"], torch.ones(2, new, dtype=torch.long)], 1)
    maps = eager_attention_maps(vlm.hf_model, full)
    for step, values in enumerate(result.steps):
        got = values[0][1][:, :, 0]
        torch.testing.assert_close(got, maps[1][:, :, prompt - 1 + step, :got.shape[-1]], rtol=0, atol=1e-5)


def test_gemma2_checkpoint_loads_without_sdpa(tmp_path: Any) -> None:
    """``vrh_interp.load`` lets transformers pick sdpa per sub-model: Gemma 2 gets eager instead of a load error."""
    tiny = build_tiny("paligemma2")
    tiny.model.save_pretrained(tmp_path)
    tiny.processor.save_pretrained(tmp_path)
    vlm = vrh_interp.load(tmp_path)
    config = vlm.hf_model.config
    assert (config.text_config._attn_implementation, config.vision_config._attn_implementation) == ("eager", "sdpa")
    batch = _batch(vlm)
    with torch.no_grad():
        torch.testing.assert_close(vlm.hf_model(**batch.encoding).logits, tiny.model(**batch.encoding).logits)


# ---------------------------------------------------------------------------------------------- remote-code backbones

BACKBONES = [m for m in PAPER_MODELS if m.backbone_config is not None]
# Parameter count on the language model's hub page (safetensors), billions as rounded there [GK]
BACKBONE_PARAMETERS_B = {"DeepSeek-VL2-Small": "15.7", "Phi-4-Reasoning-Vision": "14.7"}


def backbone_description(config: Any, attention: str) -> AttentionDescription:
    """The description docs/recipes/remote-code-models.md gives, from the language model's config."""
    if config.model_type == "deepseek_v2":
        return AttentionDescription(
            attention, config.num_hidden_layers, config.num_attention_heads, config.num_attention_heads,
            config.v_head_dim,
            qkv=LatentQKV(config.qk_nope_head_dim, config.qk_rope_head_dim, config.kv_lora_rank,
                          q="q_proj" if config.q_lora_rank is None else "q_b_proj"),
            rotary=Rotary(config.rope_parameters["rope_theta"], rotary_dim=config.qk_rope_head_dim, interleaved=True))
    return AttentionDescription(attention, config.num_hidden_layers, config.num_attention_heads,
                                config.num_key_value_heads, config.hidden_size // config.num_attention_heads,
                                qkv=FusedQKV("qkv_proj", "concatenated"))


def test_remote_code_rows_with_backbone_facts() -> None:
    assert {m.name for m in BACKBONES} == set(BACKBONE_PARAMETERS_B)
    assert all(m.described and m.support == REMOTE_CODE for m in PAPER_MODELS if m.backbone_config is not None)
    assert not {m.checkpoint for m in BACKBONES} & {p.name for p in published.MODELS}  # no published head sets
    with pytest.raises(ValueError, match="no language-model facts"):
        paper_model("Magma-8B").build_backbone_config()


@pytest.mark.parametrize("paper", BACKBONES, ids=lambda m: m.name)
def test_remote_code_backbone_on_meta_has_the_hub_size_and_the_description_fits(paper: PaperModel) -> None:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(paper.build_backbone_config())
    count = sum(p.numel() for p in model.parameters())
    shown = BACKBONE_PARAMETERS_B[paper.name]
    assert abs(count / 1e9 - float(shown)) <= 0.5 * 10.0 ** -len(shown.split(".")[1]), count
    description = backbone_description(model.config, "model.layers.{layer}.self_attn")
    description.check(model)  # every layer: projection widths, the latent's norm, o_proj = heads x head_dim
    assert description.geometry() == paper.geometry
    for layer in decoder_layers(model):
        assert layer.self_attn.o_proj.in_features == paper.geometry.num_heads * paper.geometry.head_dim


def test_deepseek_vl2_small_experts_are_in_the_mlp_and_the_total_is_the_hub_count() -> None:
    """MoE replaces the MLP of every layer after the first, never the attention; with SigLIP-SO400M/14 at 384 px
    and the 2 x 2-downsampling GELU projector (4 x 1152 -> 2048 -> 2048) [GK] the total is the hub's 16.1B [GK]."""
    from transformers import SiglipVisionConfig, SiglipVisionModel

    paper = paper_model("DeepSeek-VL2-Small")
    with torch.device("meta"):
        language = AutoModelForCausalLM.from_config(paper.build_backbone_config())
        vision = SiglipVisionModel(SiglipVisionConfig(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                                                      num_attention_heads=16, image_size=384, patch_size=14,
                                                      vision_use_head=False))
    layers = decoder_layers(language)
    assert not hasattr(layers[0].mlp, "experts") and all(len(layer.mlp.experts.gate_up_proj) == 64
                                                          for layer in layers[1:])
    assert {type(layer.self_attn).__name__ for layer in layers} == {"DeepseekV2Attention"}
    projector = 4 * 1152 * 2048 + 2048 + 2048 * 2048 + 2048
    total = sum(p.numel() for p in (*language.parameters(), *vision.parameters())) + projector
    assert abs(total / 1e9 - 16.1) <= 0.05, total


TINY_BACKBONES = {  # tiny random language models of the two backbones (2 layers, 4 query heads)
    "DeepSeek-VL2-Small": dict(  # v_head_dim 12 differs from the query / key width 16: the o_proj slice is v's
        model_type="deepseek_v2", num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8,
        qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        moe_intermediate_size=32, first_k_dense_replace=1),
    "Phi-4-Reasoning-Vision": dict(model_type="phi3", num_key_value_heads=2),
}


@pytest.fixture(scope="module", params=sorted(TINY_BACKBONES))
def described_backbone(request: pytest.FixtureRequest) -> tuple[VLM, AttentionDescription]:
    from transformers import AutoConfig

    from vrh_interp.core.description.tiny import build_tiny

    torch.manual_seed(0)
    facts = dict(TINY_BACKBONES[request.param])
    config = AutoConfig.for_model(facts.pop("model_type"), vocab_size=100, hidden_size=64, intermediate_size=96,
                                  num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256,
                                  pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 250000.0},
                                  **facts)
    model = AutoModelForCausalLM.from_config(config).eval()
    description = backbone_description(config, "model.layers.{layer}.self_attn")
    tiny = build_tiny("llava")  # the visual side only (these tests feed token ids)
    return vrh_interp.wrap(model, tiny.processor, adapter=adapter_for_config(tiny.model.config),
                           attention=description), description


def _ids() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 100, (2, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0  # left padding
    return {"input_ids": ids, "attention_mask": mask}


@contextmanager
def o_proj_pre_hooks(model: Any, width: int, zero: dict[int, list[int]], captured: dict[int, torch.Tensor]
                     ) -> Iterator[None]:
    """Zero the ``width``-wide slices of heads ``zero[layer]`` of o_proj's input and keep the input per layer."""
    handles = []
    for i, layer in enumerate(decoder_layers(model)):
        def pre_hook(_module: Any, args: tuple[Any, ...], i: int = i) -> tuple[Any, ...]:
            x = args[0].clone()
            view = x.view(*x.shape[:2], -1, width)
            view[:, :, zero.get(i, [])] = 0
            captured[i] = view.clone()
            return (x,)
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(pre_hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


TINY_HEADS = HeadSet([Head(0, 1), Head(1, 0), Head(1, 3)])


def test_described_backbone_masking_and_capture_equal_o_proj_pre_hooks(
        described_backbone: tuple[VLM, AttentionDescription]) -> None:
    """A head's output is its head_dim slice of o_proj's input (v_head_dim for MLA): masking zeroes it."""
    vlm, description = described_backbone
    model, encoding = vlm.hf_model, _ids()
    masked = iv.run_forward(vlm, encoding, [iv.head_ablation(vlm, TINY_HEADS)]).logits
    captured: dict[int, torch.Tensor] = {}
    with torch.no_grad(), o_proj_pre_hooks(model, description.head_dim, TINY_HEADS.by_layer(), {}):
        reference = model(**encoding).logits
    with torch.no_grad(), o_proj_pre_hooks(model, description.head_dim, {}, captured):
        plain = model(**encoding).logits
    assert (masked - plain).abs().max() > 1e-4
    torch.testing.assert_close(masked, reference, rtol=0, atol=1e-6)
    values = iv.run_forward(vlm, encoding, [iv.head_output_capture(vlm)]).values[0]
    for layer in range(2):
        torch.testing.assert_close(values[layer], captured[layer], rtol=0, atol=1e-6)
    with o_proj_pre_hooks(model, description.head_dim, TINY_HEADS.by_layer(), {}):
        want = model.generate(**encoding, max_new_tokens=4, do_sample=False, pad_token_id=0)
    got = iv.run_generate(vlm, encoding, [iv.head_ablation(vlm, TINY_HEADS)], max_new_tokens=4).ids
    assert torch.equal(got, want)


def _rotate_half(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE of ``x`` [b, h, s, d] at ``positions`` [b or 1, s], written out."""
    d = x.shape[-1]
    freqs = positions[:, None, :, None].double() * theta ** (-torch.arange(0, d, 2).double() / d)
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


def hand_rows(model: Any, layer: int, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
              rows: list[int]) -> torch.Tensor:
    """Attention probabilities ``[b, heads, rows, keys]`` of one layer from its weights, in float64: MLA as
    DeepSeek's own code computes it (RMS-normed latent expanded per head, the rotary part de-interleaved then
    rotated half; one rotary key shared by every head), Phi-3 from its packed qkv_proj."""
    attention = decoder_layers(model)[layer].self_attn
    config = model.config
    h, (b, s, _), heads = hidden.double(), hidden.shape, config.num_attention_heads
    theta = config.rope_parameters["rope_theta"]
    if config.model_type == "deepseek_v2":
        nope, rope, rank = config.qk_nope_head_dim, config.qk_rope_head_dim, config.kv_lora_rank
        q = (h @ attention.q_proj.weight.double().T).view(b, s, heads, nope + rope).transpose(1, 2)
        compressed = h @ attention.kv_a_proj_with_mqa.weight.double().T
        latent, k_rope = compressed[..., :rank], compressed[..., rank:].view(b, 1, s, rope)
        norm = attention.kv_a_layernorm
        latent = latent * torch.rsqrt(latent.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        latent = latent * norm.weight.double()
        kv = (latent @ attention.kv_b_proj.weight.double().T).view(b, s, heads, -1).transpose(1, 2)

        def deinterleave(x: torch.Tensor) -> torch.Tensor:
            return x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)

        q_rope = _rotate_half(deinterleave(q[..., nope:]), positions, theta)
        k_rope = _rotate_half(deinterleave(k_rope), positions, theta).expand(b, heads, s, rope)
        query, key = torch.cat([q[..., :nope], q_rope], -1), torch.cat([kv[..., :nope], k_rope], -1)
    else:
        head_dim, kv_heads = config.hidden_size // heads, config.num_key_value_heads
        q, k, _ = (h @ attention.qkv_proj.weight.double().T).split(
            [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
        query = _rotate_half(q.view(b, s, heads, head_dim).transpose(1, 2), positions, theta)
        key = _rotate_half(k.view(b, s, kv_heads, head_dim).transpose(1, 2), positions, theta)
        key = key.repeat_interleave(heads // kv_heads, dim=1)
    scores = query @ key.transpose(-1, -2) * query.shape[-1] ** -0.5
    allowed = torch.ones(s, s, dtype=torch.bool).tril()[None, None] & mask.bool()[:, None, None, :]
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)[:, :, rows]


def test_described_backbone_readout_equals_rows_computed_by_hand(
        described_backbone: tuple[VLM, AttentionDescription]) -> None:
    vlm, _ = described_backbone
    model, encoding, rows = vlm.hf_model, _ids(), [3, 6, 10]  # real tokens in both rows of the batch
    inputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    handles = [layer.self_attn.register_forward_pre_hook(
        lambda _m, args, kwargs, i=i: inputs.__setitem__(i, (kwargs["hidden_states"], kwargs["position_ids"])),
        with_kwargs=True) for i, layer in enumerate(decoder_layers(model))]
    try:
        with torch.no_grad():
            model(**encoding)
    finally:
        for handle in handles:
            handle.remove()
    result = iv.run_forward(vlm, encoding, [iv.attention_readout(vlm, rows)])
    maps = eager_attention_maps(model, encoding)
    for layer in range(2):
        want = hand_rows(model, layer, *inputs[layer], encoding["attention_mask"], rows)
        torch.testing.assert_close(result.values[0][layer].double(), want, rtol=0, atol=1e-5)
        torch.testing.assert_close(result.values[0][layer], maps[layer][:, :, rows], rtol=0, atol=1e-5)


def test_described_backbone_readout_during_generation_equals_eager_rows(
        described_backbone: tuple[VLM, AttentionDescription]) -> None:
    """Each step's new query over every key so far (the MLA cache holds the latent: keys are recomputed)."""
    vlm, _ = described_backbone
    encoding = _ids()
    result = iv.run_generate(vlm, encoding, [iv.attention_readout(vlm, [-1])], max_new_tokens=3, min_new_tokens=3)
    prompt, new = encoding["input_ids"].shape[1], result.ids.shape[1] - encoding["input_ids"].shape[1]
    full = {"input_ids": result.ids,
            "attention_mask": torch.cat([encoding["attention_mask"], torch.ones(2, new, dtype=torch.long)], 1)}
    maps = eager_attention_maps(vlm.hf_model, full)
    assert len(result.steps) == new == 3
    for step, values in enumerate(result.steps):
        for layer in range(2):
            got = values[0][layer][:, :, 0]
            assert got.shape[-1] == prompt + step
            torch.testing.assert_close(got, maps[layer][:, :, prompt - 1 + step, :got.shape[-1]], rtol=0, atol=1e-5)


def test_latent_attention_descriptions_that_do_not_fit_are_refused() -> None:
    latent = LatentQKV(8, 8, 16)
    good = dict(attention="model.layers.{layer}.self_attn", num_layers=2, num_heads=4, num_kv_heads=4, head_dim=12,
                qkv=latent, rotary=Rotary(250000.0, rotary_dim=8, interleaved=True))
    with pytest.raises(AttentionDescriptionError, match="num_kv_heads must equal num_heads"):
        AttentionDescription(**dict(good, num_kv_heads=1))
    with pytest.raises(AttentionDescriptionError, match="rotary_dim=8"):
        AttentionDescription(**dict(good, rotary=Rotary(250000.0)))
    assert AttentionDescription(**good).softmax_scaling() == 16 ** -0.5
    from transformers import DeepseekV2Config

    config = DeepseekV2Config(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=4, **{
                                  k: v for k, v in TINY_BACKBONES["DeepSeek-VL2-Small"].items()
                                  if k not in ("model_type", "num_key_value_heads")})
    model = AutoModelForCausalLM.from_config(config)
    AttentionDescription(**good).check(model)
    with pytest.raises(AttentionDescriptionError, match="kv_a_proj_with_mqa has 24 outputs but the description "
                                                        "implies 40"):
        AttentionDescription(**dict(good, qkv=LatentQKV(8, 8, 32))).check(model)
    with pytest.raises(AttentionDescriptionError, match="kv_b_proj has 80 outputs but the description implies 96"):
        AttentionDescription(**dict(good, head_dim=16)).check(model)
