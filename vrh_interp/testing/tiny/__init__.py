"""Tiny random-weight VLM fixtures, one module per family, built offline in seconds on CPU.

Each module ``vrh_interp/testing/tiny/<family>.py`` exposes ``build(seed: int = 0) -> TinyVLM``. The
model is a real transformers ``*ForConditionalGeneration`` class with a tiny config (LM: hidden 64,
2 layers, 4 heads, 2 KV heads, head_dim 16 unless the family needs otherwise), its real processor, and a
tokenizer built locally (``vrh_interp.testing.tokenizer``). The sizes, special-token roles and helpers the
fixtures share live here (``TINY_TEXT_CONFIG``, ``TINY_VISION_CONFIG``, ``*_NAMED_TOKENS``, ``text_token_ids``,
``composite_model``, ``vision_encoder_attention_modules``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

# Registry key of each family adapter -> fixture module (same name).
TINY_FAMILIES: tuple[str, ...] = (
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "internvl",
    "llava",
    "llava_next",
    "llava_onevision",
    "paligemma",
    "gemma3",
    "idefics3",
    "glm4v",
    "mistral3",
    "aya_vision",
)

# A family's fixture with the language backbone of one of the paper's models (Llama 3, Gemma 2 with soft-capping
# and sliding windows, GLM-4.6V, Qwen3 in InternVL3.5): name -> "module:function" in this package. ``build_tiny``
# and ``tiny:NAME`` accept them; tests/families/test_paper_models.py runs the reference checks on them.
TINY_BACKBONE_VARIANTS: dict[str, str] = {
    "internvl_qwen3": "internvl:build_qwen3",
    "llava_next_llama3": "llava_next:build_llama3",
    "paligemma2": "paligemma:build_gemma2",
    "glm46v": "glm4v:build_glm46v",
}


# The tiny language backbone every fixture uses (head_dim 16 where the config takes one: TINY_HEAD_DIM).
TINY_TEXT_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
}
TINY_HEAD_DIM = 16

# The tiny ViT encoder (CLIP, SigLIP, Pixtral, InternViT, Idefics3); image and patch sizes are per family.
TINY_VISION_CONFIG: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
}


# Standard special-token roles of the tokenizer families the fixtures mimic (``build_byte_tokenizer``).
LLAMA_NAMED_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}  # + Mistral
GEMMA_NAMED_TOKENS = {"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>"}
QWEN2_NAMED_TOKENS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}  # Qwen-VL, OneVision, InternVL3


def text_token_ids(tokenizer: Any) -> dict[str, Any]:
    """Vocabulary size and bos/eos/pad ids of a text config, read from the tokenizer."""
    return {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def composite_model(model_class: type, config: Any, tokenizer: Any) -> Any:
    """``model_class(config)`` in eval mode, its top-level ``config.vocab_size`` set to the tokenizer's size.

    Composite configs (vision + text) do not carry the text config's vocabulary size at the top level.
    """
    model = model_class(config).eval()
    model.config.vocab_size = len(tokenizer)
    return model


def vision_encoder_attention_modules(model: Any) -> list[torch.nn.Module]:
    """Attention of every CLIP or SigLIP encoder layer (``model.model.vision_tower.encoder.layers[i].self_attn``)."""
    return [layer.self_attn for layer in model.model.vision_tower.encoder.layers]


@dataclass
class TinyVLM:
    """A tiny VLM plus what the layout experiment needs to switch off mixing inside the vision tower."""

    family: str
    model: Any  # the *ForConditionalGeneration, eval mode, fp32
    processor: Any
    vision_attention_modules: Callable[[Any], list[torch.nn.Module]]  # model -> vision-tower attention modules


def build_tiny(family: str, seed: int = 0) -> TinyVLM:
    """The tiny fixture of ``family`` (a ``TINY_FAMILIES`` key) or of a ``TINY_BACKBONE_VARIANTS`` name."""
    if family in TINY_BACKBONE_VARIANTS:
        module_name, function = TINY_BACKBONE_VARIANTS[family].split(":")
        return getattr(importlib.import_module(f"vrh_interp.testing.tiny.{module_name}"), function)(seed=seed)
    if family not in TINY_FAMILIES:
        available = ", ".join((*TINY_FAMILIES, *TINY_BACKBONE_VARIANTS))
        raise ValueError(f"no tiny fixture for {family!r}; available: {available}")
    module = importlib.import_module(f"vrh_interp.testing.tiny.{family}")
    return module.build(seed=seed)
