"""Tiny PaliGemma (``PaliGemmaForConditionalGeneration``: SigLIP tower, linear projector, Gemma LM) offline.

Images are stretched to 56 x 56 (SigLIP patch 7 -> 8 x 8 = 64 tokens). ``PaliGemmaProcessor`` adds the
``<loc0000>``..``<loc1023>`` and ``<seg000>``..``<seg127>`` tokens to the tokenizer, so the model's vocabulary
is sized after the processor is built. PaliGemma has no chat template: prompts are task prefixes.
"""

from __future__ import annotations

import torch
from transformers import (
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


def build(seed: int = 0) -> TinyVLM:
    torch.manual_seed(seed)
    processor = build_processor()
    tokenizer = processor.tokenizer
    text_config = GemmaConfig(**TINY_TEXT_CONFIG, **text_token_ids(tokenizer), head_dim=TINY_HEAD_DIM)
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
    return TinyVLM(family="paligemma", model=model, processor=processor,
                   vision_attention_modules=vision_encoder_attention_modules)
