"""The eleven VLMs of the paper (Park et al. 2026: Table A7, Fig. 6, Table A12) and how vrh_interp supports each.

For the seven whose architecture transformers ships, ``config`` records the checkpoint's configuration facts that
head-level work depends on: layer, head and KV-head counts, head_dim, rotary settings, soft-capping, sliding
windows (and the vision tower's sizes, so the whole model can be built). They are the project's own record of
the values in each checkpoint's public ``config.json`` (``PaperModel.source``), written from public knowledge:
nothing can be downloaded here. ``build_config`` turns them into the transformers config, from which
tests/families/test_paper_models.py builds each model on the meta device (no weights) and checks the adapter,
the head grid, the published head sets and the module paths of the masking and readout templates. Values the
head grid does not depend on (token ids, vocabulary sizes) are transformers' defaults unless written here.

The other four need their authors' code (``trust_remote_code``, never enabled on the user's behalf): their
attention is stated with ``vrh_interp.core.description.families.described.AttentionDescription``;
docs/recipes/remote-code-models.md gives the description for each (``described``). Where transformers ships the
language model's architecture (DeepSeek-VL2-Small: ``deepseek_v2``; Phi-4-Reasoning-Vision: Phi-4, ``phi3``),
``backbone_config`` records its facts, those of the hub checkpoint ``backbone_checkpoint``, so the tests build that
language model on the meta device and check its size, head grid and description. [GK]: written from memory of the
public files, not read here.

Checkpoints. Where the paper used OpenGVLab's remote-code InternVL3 / InternVL3.5 releases, the transformers-native
conversions (``-hf`` / ``-HF``) hold the same weights in ``InternVLForConditionalGeneration``; the language
backbone, hence the head grid and head indices, is the same. LLaVA-NeXT-Llama3-8B is llava-hf's conversion of
lmms-lab/llama3-llava-next-8b. The paper does not name its PaliGemma2-10B variant (pt / mix, 224 / 448): the
language backbone, which is what the heads live in, is the same Gemma 2 9B in all of them; 448 is written here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from vrh_interp.core.description.heads import HeadGeometry

NATIVE = "native"
REMOTE_CODE = "remote code"


@dataclass(frozen=True)
class PaperModel:
    """One of the paper's models: checkpoint, backbone, support and (native ones) configuration facts."""

    name: str  # as the paper writes it
    checkpoint: str  # hub id
    backbone: str  # the paper's language-backbone name (Table A7 / Table A12)
    support: str  # NATIVE (a built-in adapter) or REMOTE_CODE
    family: str | None = None  # registry key of the built-in adapter (native)
    model_type: str | None = None  # config.model_type (native)
    config: Mapping[str, Any] | None = None  # configuration facts (native), nested as transformers 5 reads them
    geometry: HeadGeometry | None = None  # the language backbone's head grid, where known
    note: str = ""
    described: bool = False  # remote code: docs/recipes/remote-code-models.md gives the AttentionDescription
    # the checkpoint's preprocessor_config.json: (transformers image processor class, its kwargs), and the
    # processor's own kwargs; what benchmarks/real_shape.py builds locally (native models it measures)
    image_processor: tuple[str, Mapping[str, Any]] | None = None
    processor_kwargs: Mapping[str, Any] | None = None
    # remote code: the language model's transformers model_type and configuration facts (a meta build), and the
    # hub id whose config.json / parameter count they are
    backbone_type: str | None = None
    backbone_config: Mapping[str, Any] | None = None
    backbone_checkpoint: str | None = None

    @property
    def status(self) -> str:
        """``native adapter (<key>)``; remote-code models: ``described (remote code)`` where
        docs/recipes/remote-code-models.md gives the ``AttentionDescription`` to pass (read from the public model
        code, not run here), else ``not yet (remote code)``."""
        if self.support == NATIVE:
            return f"native adapter ({self.family})"
        return "described (remote code)" if self.described else "not yet (remote code)"

    @property
    def source(self) -> str:
        """Where the configuration facts are published."""
        return f"https://huggingface.co/{self.checkpoint}/blob/main/config.json"

    def build_config(self) -> Any:
        """The transformers config of this checkpoint, from the recorded facts (native models only)."""
        if self.config is None or self.model_type is None:
            raise ValueError(f"{self.name} needs its authors' code (trust_remote_code): no transformers config")
        from transformers import AutoConfig

        return AutoConfig.for_model(self.model_type, **self.config)

    def build_backbone_config(self) -> Any:
        """The transformers config of this remote-code model's language model, from ``backbone_config``."""
        if self.backbone_config is None or self.backbone_type is None:
            raise ValueError(f"{self.name}: no language-model facts recorded")
        from transformers import AutoConfig

        return AutoConfig.for_model(self.backbone_type, **self.backbone_config)


def _qwen2_5_vl_vision(out_hidden_size: int) -> dict:
    """Qwen2.5-VL's vision tower (the same in the 3B and 7B checkpoints but for the projector's output width)."""
    return {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
            "out_hidden_size": out_hidden_size, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31]}


def _mrope(sections: list[int], theta: float, **extra: Any) -> dict[str, Any]:
    return {"rope_type": "default", "rope_theta": theta, "mrope_section": sections, **extra}


INTERN_VIT_300M = {  # InternViT-300M-448px-V2.5, the vision tower of InternVL3 and InternVL3.5 (8B)
    "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
    "image_size": [448, 448], "patch_size": [14, 14],
}

# Qwen2.5-VL's preprocessor_config.json (all sizes): Qwen2-VL's image processor, patch 14, merge 2, OpenAI CLIP
# mean / std (the class defaults), min_pixels 3136, max_pixels 12845056
QWEN2_5_VL_IMAGE_PROCESSOR = ("Qwen2VLImageProcessorPil", {"min_pixels": 3136, "max_pixels": 12845056})
# InternVL3-hf: GotOcr2 tiles of 448 px, 1..12 tiles plus a thumbnail, ImageNet mean / std; 256 tokens per tile
INTERNVL3_IMAGE_PROCESSOR = ("GotOcr2ImageProcessorPil", {
    "size": {"height": 448, "width": 448}, "crop_to_patches": True, "min_patches": 1, "max_patches": 12,
    "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]})
INTERNVL3_PROCESSOR = {"image_seq_length": 256}
# Qwen3-VL's preprocessor_config.json [GK]: Qwen2-VL's image processor with patch 16 (merge 2: 32 px per token),
# mean / std 0.5, size shortest_edge 65536 / longest_edge 16777216 pixels (min_pixels / max_pixels); neither binds
# at 1024 x 768, whose token count (32 x 24 = 768) follows from patch and merge alone
QWEN3_VL_IMAGE_PROCESSOR = ("Qwen2VLImageProcessorPil", {
    "patch_size": 16, "min_pixels": 65536, "max_pixels": 16777216,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]})
# llava-hf/llama3-llava-next-8b-hf's preprocessor_config.json [GK]: LLaVA-NeXT's anyres processor, 336 px tiles
# (shortest_edge 336, crop 336 x 336) over the config's pinpoints, OpenAI CLIP mean / std and bicubic (the class
# defaults); the processor: patch 14, the CLS token dropped ("default"), 576 tokens per tile view
LLAVA_NEXT_LLAMA3_IMAGE_PROCESSOR = ("LlavaNextImageProcessorPil", {
    "size": {"shortest_edge": 336}, "crop_size": {"height": 336, "width": 336},
    "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]})
LLAVA_NEXT_LLAMA3_PROCESSOR = {"patch_size": 14, "vision_feature_select_strategy": "default",
                               "num_additional_image_tokens": 1}
# GLM-4.6V-Flash's preprocessor_config.json [GK, the size bounds uncertain]: GLM-4.1V's image processor, patch 14,
# merge 2 (28 px per token), OpenAI CLIP mean / std, size shortest_edge 12544 / longest_edge 47040000 (pixels of
# the two temporal frames); neither bound binds at 1024 x 768 (37 x 27 = 999 tokens from patch and merge alone)
GLM46V_IMAGE_PROCESSOR = ("Glm4vImageProcessorPil", {
    "size": {"shortest_edge": 12544, "longest_edge": 47040000}, "patch_size": 14, "temporal_patch_size": 2,
    "merge_size": 2})
# google/paligemma2-10b-pt-448's preprocessor_config.json: SigLIP's processor stretching to 448 x 448, mean / std
# 0.5 and bicubic (the class defaults), (448 / 14)^2 = 1024 image tokens
PALIGEMMA2_448_IMAGE_PROCESSOR = ("SiglipImageProcessorPil", {"size": {"height": 448, "width": 448},
                                                               "image_seq_length": 1024})

# what InternVL3-8B and InternVL3.5-8B share around their different Qwen language models
INTERNVL_8B_TOP = {"vision_config": INTERN_VIT_300M, "downsample_ratio": 0.5, "projector_hidden_act": "gelu",
                   "vision_feature_layer": -1, "tie_word_embeddings": False}

PAPER_MODELS: tuple[PaperModel, ...] = (
    PaperModel(
        "Qwen2.5-VL-7B", "Qwen/Qwen2.5-VL-7B-Instruct", "Qwen2.5-7B", NATIVE, "qwen2_5_vl", "qwen2_5_vl",
        {
            # the hub file is the flat pre-5.0 layout (text fields at the top level, "rope_scaling": {"type":
            # "mrope", ...}); these are its values. sliding_window 32768 is declared but use_sliding_window false
            "text_config": {
                "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
                "num_key_value_heads": 4, "max_position_embeddings": 128000, "vocab_size": 152064,
                "rms_norm_eps": 1e-6, "use_sliding_window": False, "rope_parameters": _mrope([16, 24, 24], 1e6),
            },
            "vision_config": _qwen2_5_vl_vision(3584),
        },
        HeadGeometry(28, 28, 4, 128),  # head_dim = 3584 / 28 (the text config has none)
        image_processor=QWEN2_5_VL_IMAGE_PROCESSOR,
    ),
    PaperModel(
        "Qwen3-VL-8B", "Qwen/Qwen3-VL-8B-Instruct", "Qwen3-8B", NATIVE, "qwen3_vl", "qwen3_vl",
        {
            "text_config": {
                "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
                "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 262144, "vocab_size": 151936,
                "rms_norm_eps": 1e-6, "rope_parameters": _mrope([24, 20, 20], 5e6, mrope_interleaved=True),
            },
            "vision_config": {
                "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "out_hidden_size": 4096,
                "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 2304,
                "deepstack_visual_indexes": [8, 16, 24],
            },
        },
        HeadGeometry(36, 32, 8, 128),
        image_processor=QWEN3_VL_IMAGE_PROCESSOR,
    ),
    PaperModel(
        "InternVL3-8B", "OpenGVLab/InternVL3-8B-hf", "Qwen2.5-7B", NATIVE, "internvl", "internvl",
        {
            "text_config": {
                "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 32768,
                "vocab_size": 151674, "rms_norm_eps": 1e-6, "use_sliding_window": False,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
            },
            **INTERNVL_8B_TOP,
        },
        HeadGeometry(28, 28, 4, 128),
        "the paper's checkpoint is the remote-code OpenGVLab/InternVL3-8B; -hf is its transformers conversion",
        image_processor=INTERNVL3_IMAGE_PROCESSOR, processor_kwargs=INTERNVL3_PROCESSOR,
    ),
    PaperModel(
        "InternVL3.5-8B", "OpenGVLab/InternVL3_5-8B-HF", "Qwen3-8B", NATIVE, "internvl", "internvl",
        {
            "text_config": {
                "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
                "vocab_size": 151936, "rms_norm_eps": 1e-6,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
            },
            **INTERNVL_8B_TOP,
        },
        HeadGeometry(36, 32, 8, 128),
        "the paper's checkpoint is the remote-code OpenGVLab/InternVL3_5-8B; -HF is its transformers conversion",
        image_processor=INTERNVL3_IMAGE_PROCESSOR, processor_kwargs=INTERNVL3_PROCESSOR,  # the same in -HF [GK]
    ),
    PaperModel(
        "Magma-8B", "microsoft/Magma-8B", "Llama-3", REMOTE_CODE,
        geometry=HeadGeometry(32, 32, 8, 128),  # Meta-Llama-3-8B-Instruct, its language model [GK]
        note="Magma's own modeling code (auto_map); transformers ships no magma model", described=True,
    ),
    PaperModel(
        "LLaVA-NeXT-Llama3-8B", "llava-hf/llama3-llava-next-8b-hf", "Llama-3", NATIVE, "llava_next", "llava_next",
        {
            "text_config": {  # Meta-Llama-3-8B-Instruct: no rope scaling (that came with Llama 3.1)
                "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 8192,
                "vocab_size": 128320, "rms_norm_eps": 1e-5,
                "rope_parameters": {"rope_type": "default", "rope_theta": 5e5},
            },
            "vision_config": {  # CLIP ViT-L/14 at 336 px
                "model_type": "clip_vision_model", "hidden_size": 1024, "intermediate_size": 4096,
                "num_hidden_layers": 24, "num_attention_heads": 16, "image_size": 336, "patch_size": 14,
                "projection_dim": 768,
            },
            "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
            "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "image_token_index": 128256,
        },
        HeadGeometry(32, 32, 8, 128),
        "llava-hf's transformers conversion of lmms-lab/llama3-llava-next-8b",
        image_processor=LLAVA_NEXT_LLAMA3_IMAGE_PROCESSOR, processor_kwargs=LLAVA_NEXT_LLAMA3_PROCESSOR,
    ),
    PaperModel(
        "PaliGemma2-10B", "google/paligemma2-10b-pt-448", "Gemma 2", NATIVE, "paligemma", "paligemma",
        {
            "text_config": {  # Gemma 2 9B. attn_logit_softcapping 50.0 and final_logit_softcapping 30.0 are
                # Gemma2Config's defaults, not repeated in the hub file [uncertain whether it lists them]
                "model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
                "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "query_pre_attn_scalar": 256,
                "sliding_window": 4096, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                "max_position_embeddings": 8192, "vocab_size": 257216, "hidden_activation": "gelu_pytorch_tanh",
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            },
            "vision_config": {  # SigLIP So400m/14 at 448 px: 32 x 32 = 1024 image tokens
                "model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304,
                "num_hidden_layers": 27, "num_attention_heads": 16, "image_size": 448, "patch_size": 14,
                "projection_dim": 3584, "vision_use_head": False,
            },
            "projection_dim": 3584, "image_token_index": 257152,
        },
        HeadGeometry(42, 16, 8, 256),
        "pt / mix and 224 / 448 variants share the Gemma 2 9B language backbone",
        image_processor=PALIGEMMA2_448_IMAGE_PROCESSOR,
    ),
    PaperModel(
        "DeepSeek-VL2-Small", "deepseek-ai/deepseek-vl2-small", "DeepSeekMoE", REMOTE_CODE,
        geometry=HeadGeometry(27, 16, 16, 128),  # MLA: 16 query heads, v_head_dim 128 (o_proj input 16 x 128) [GK]
        note="deepseek_vl2 package (transformers 4.38); multi-head latent attention (MLA) and MoE MLPs, as "
             "transformers' deepseek_v2", described=True,
        backbone_type="deepseek_v2",
        backbone_config={  # language_config of deepseek-vl2-small = DeepSeek-V2-Lite's shape [GK]
            "vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 10944, "num_hidden_layers": 27,
            "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512, "q_lora_rank": None,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64,
            "n_shared_experts": 2, "num_experts_per_tok": 6, "moe_intermediate_size": 1408, "first_k_dense_replace": 1,
            "max_position_embeddings": 4096, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        },
        backbone_checkpoint="deepseek-ai/DeepSeek-V2-Lite",
    ),
    PaperModel(
        "InternVL2.5-8B", "OpenGVLab/InternVL2_5-8B", "InternLM2.5", REMOTE_CODE,
        geometry=HeadGeometry(32, 32, 8, 128),  # internlm2_5-7b-chat: fused wqkv [GK]
        note="InternLM2's fused wqkv / wo attention (auto_map code)", described=True,
    ),
    PaperModel(
        "GLM-4.6V-Flash", "zai-org/GLM-4.6V-Flash", "GLM", NATIVE, "glm4v", "glm4v",
        {
            "text_config": {  # attention_bias true in the file; Glm4vTextAttention always has q/k/v biases
                "hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 40, "num_attention_heads": 32,
                "num_key_value_heads": 2, "max_position_embeddings": 131072, "vocab_size": 151552,
                "rms_norm_eps": 1e-5, "rope_parameters": _mrope([8, 12, 12], 5e5, partial_rotary_factor=0.5),
            },
            "vision_config": {
                "depth": 24, "hidden_size": 1536, "intermediate_size": 13696, "num_heads": 12, "out_hidden_size": 4096,
                "image_size": 336, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
            },
        },
        HeadGeometry(40, 32, 2, 128),  # head_dim = 4096 / 32; rotary on half of it (partial_rotary_factor 0.5)
        "model_type glm4v (Glm4vForConditionalGeneration) in the hub file; transformers' glm46v classes also map "
        "to this adapter",
        image_processor=GLM46V_IMAGE_PROCESSOR,
    ),
    PaperModel(
        "Phi-4-Reasoning-Vision", "microsoft/Phi-4-reasoning-vision-15B", "Phi", REMOTE_CODE,
        geometry=HeadGeometry(40, 40, 10, 128),  # Phi-4 (14B) language model, model_type phi4-siglip [WEB]
        note="model_type phi4-siglip (Phi4ForCausalLMV, auto_map code); Phi-3-style fused qkv_proj; released after "
             "the paper's main experiments", described=True,
        backbone_type="phi3",
        backbone_config={  # microsoft/phi-4 config.json (Phi3ForCausalLM), the reasoning models' base [GK]
            "vocab_size": 100352, "hidden_size": 5120, "intermediate_size": 17920, "num_hidden_layers": 40,
            "num_attention_heads": 40, "num_key_value_heads": 10, "max_position_embeddings": 16384,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": 250000.0},
        },
        backbone_checkpoint="microsoft/phi-4",
    ),
)

# Not one of the paper's models: the smallest Qwen2.5-VL (Qwen/Qwen2.5-VL-3B-Instruct config.json), the first
# model benchmarks/real_shape.py measures (it fits this project's 24 GB development machine in bf16).
QWEN2_5_VL_3B = PaperModel(
    "Qwen2.5-VL-3B", "Qwen/Qwen2.5-VL-3B-Instruct", "Qwen2.5-3B", NATIVE, "qwen2_5_vl", "qwen2_5_vl",
    {
        "text_config": {  # tie_word_embeddings true (the 7B's are separate)
            "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16,
            "num_key_value_heads": 2, "max_position_embeddings": 128000, "vocab_size": 151936,
            "rms_norm_eps": 1e-6, "use_sliding_window": False, "rope_parameters": _mrope([16, 24, 24], 1e6),
        },
        "vision_config": _qwen2_5_vl_vision(2048),
        "tie_word_embeddings": True,
    },
    HeadGeometry(36, 16, 2, 128),  # head_dim = 2048 / 16
    "not in the paper: the smallest Qwen2.5-VL, measured by benchmarks/real_shape.py",
    image_processor=QWEN2_5_VL_IMAGE_PROCESSOR,
)


def paper_model(name: str) -> PaperModel:
    """The paper's model called ``name`` (case-insensitive; its paper name or checkpoint id)."""
    wanted = name.lower()
    for model in PAPER_MODELS:
        if wanted in (model.name.lower(), model.checkpoint.lower()):
            return model
    raise KeyError(f"{name!r} is not one of the paper's models: {', '.join(m.name for m in PAPER_MODELS)}")
