"""Tiny PaliGemma (``PaliGemmaForConditionalGeneration``: SigLIP tower, linear projector, Gemma LM) offline.

Images are stretched to 56 x 56 (SigLIP patch 7 -> 8 x 8 = 64 tokens). ``PaliGemmaProcessor`` adds the
``<loc0000>``..``<loc1023>`` and ``<seg000>``..``<seg127>`` tokens to the tokenizer, so the model's vocabulary
is sized after the processor is built. PaliGemma has no chat template: prompts are task prefixes.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    GemmaConfig,
    PaliGemmaConfig,
    PaliGemmaForConditionalGeneration,
    PaliGemmaProcessor,
    SiglipImageProcessorPil,
    SiglipVisionConfig,
)

from vrh_interp.testing.tiny import TinyVLM
from vrh_interp.testing.tokenizer import build_byte_tokenizer

IMAGE_SIZE = 56
PATCH_SIZE = 7
SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<image>")


def build_processor() -> PaliGemmaProcessor:
    tokenizer = build_byte_tokenizer(
        SPECIAL_TOKENS,
        named_special_tokens={"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>"},
        extra_special_tokens={"image_token": "<image>"},
    )
    image_processor = SiglipImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    image_processor.image_seq_length = (IMAGE_SIZE // PATCH_SIZE) ** 2
    return PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer)


def build(seed: int = 0) -> TinyVLM:
    torch.manual_seed(seed)
    processor = build_processor()
    tokenizer = processor.tokenizer
    text_config = GemmaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    vision_config = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
    )
    config = PaliGemmaConfig(
        vision_config=vision_config,
        text_config=text_config,
        image_token_index=processor.image_token_id,
        vocab_size=len(tokenizer),
        projection_dim=text_config.hidden_size,
        hidden_size=text_config.hidden_size,
    )
    model = PaliGemmaForConditionalGeneration(config).eval()
    model.config.vocab_size = len(tokenizer)
    return TinyVLM(family="paligemma", model=model, processor=processor,
                   vision_attention_modules=vision_attention_modules)


def vision_attention_modules(model: Any) -> list[torch.nn.Module]:
    return [layer.self_attn for layer in model.model.vision_tower.encoder.layers]
