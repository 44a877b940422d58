"""Tiny PaliGemma (``PaliGemmaForConditionalGeneration``: SigLIP tower, linear projector, Gemma LM) offline.

Images are stretched to 56 x 56 (SigLIP patch 7 -> 8 x 8 = 64 tokens). ``PaliGemmaProcessor`` adds the
``<loc0000>``..``<loc1023>`` and ``<seg000>``..``<seg127>`` tokens to the tokenizer, so the model's vocabulary
is sized after the processor is built. PaliGemma has no chat template: prompts are task prefixes.

``build_gemma2`` is PaliGemma 2 (the language backbone of PaliGemma2-10B): a Gemma 2 text config whose layers
alternate sliding-window and full attention, with attention-logit soft-capping and a query scale
``query_pre_attn_scalar**-0.5`` that differs from ``head_dim**-0.5``. The tiny values are chosen so each matters
on random weights: the soft-cap (1.0, real 50.0) bends the tiny model's attention logits (initialised wider so they
reach it), and the window (8, real 4096) is shorter than an answer. Gemma 2 has no sdpa path
(``_supports_sdpa = False``: sdpa cannot soft-cap), so the language model runs eager attention.
"""

from __future__ import annotations

import torch
from transformers import (
    Gemma2Config,
    GemmaConfig,
    PaliGemmaConfig,
    PaliGemmaForConditionalGeneration,
    PaliGemmaProcessor,
    SiglipImageProcessorPil,
    SiglipVisionConfig,
)

from vrh_interp.testing.tiny import (
    GEMMA_NAMED_TOKENS,
    TINY_HEAD_DIM,
    TINY_TEXT_CONFIG,
    TINY_VISION_CONFIG,
    TinyVLM,
    composite_model,
    text_token_ids,
    vision_encoder_attention_modules,
)
from vrh_interp.testing.tokenizer import build_byte_tokenizer

IMAGE_SIZE = 56
PATCH_SIZE = 7
SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<image>")


def build_processor() -> PaliGemmaProcessor:
    tokenizer = build_byte_tokenizer(
        SPECIAL_TOKENS,
        named_special_tokens=GEMMA_NAMED_TOKENS,
        extra_special_tokens={"image_token": "<image>"},
    )
    image_processor = SiglipImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    image_processor.image_seq_length = (IMAGE_SIZE // PATCH_SIZE) ** 2
    return PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer)


# Gemma 2's attention extras, at tiny scale (PaliGemma2-10B: 50.0, 4096, query_pre_attn_scalar 256 = head_dim).
# Wider initial weights (0.2, default 0.02) give attention logits of order one, which the cap bends.
TINY_GEMMA2_ATTENTION = {"attn_logit_softcapping": 1.0, "sliding_window": 8, "query_pre_attn_scalar": 4,
                         "initializer_range": 0.2}


def build_gemma2(seed: int = 0) -> TinyVLM:
    """PaliGemma 2: the same fixture with a Gemma 2 backbone (soft-capping, sliding windows)."""
    return build(seed, text_config_class=Gemma2Config, text_extra=TINY_GEMMA2_ATTENTION, family="paligemma2")


def build(seed: int = 0, *, text_config_class: type = GemmaConfig, text_extra: dict | None = None,
          family: str = "paligemma") -> TinyVLM:
    torch.manual_seed(seed)
    processor = build_processor()
    tokenizer = processor.tokenizer
    text_config = text_config_class(**TINY_TEXT_CONFIG, **text_token_ids(tokenizer), head_dim=TINY_HEAD_DIM,
                                    **(text_extra or {}))
    vision_config = SiglipVisionConfig(**TINY_VISION_CONFIG, image_size=IMAGE_SIZE, patch_size=PATCH_SIZE)
    config = PaliGemmaConfig(
        vision_config=vision_config,
        text_config=text_config,
        image_token_index=processor.image_token_id,
        vocab_size=len(tokenizer),
        projection_dim=text_config.hidden_size,
        hidden_size=text_config.hidden_size,
    )
    model = composite_model(PaliGemmaForConditionalGeneration, config, tokenizer)
    return TinyVLM(family=family, model=model, processor=processor,
                   vision_attention_modules=vision_encoder_attention_modules)
