"""Tiny Aya Vision (``AyaVisionForConditionalGeneration``: SigLIP tower, pixel shuffle, Cohere2 LM) offline.

Tiles are 56 x 56 (SigLIP patch 7 -> 8 x 8 patches -> 4 x 4 tokens after the downsample-2 pixel shuffle),
at most 6 tiles plus the global thumbnail. The processor's ``patch_size=14`` (7 x 2) and ``img_size=56``
give the same 16 ``<|IMG_PATCH|>`` tokens per tile. The chat template follows Cohere's turn tokens with
``<image>`` as the placeholder that ``AyaVisionProcessor`` expands. The Cohere2 LM has a sliding-window
layer (RoPE) then a full-attention layer (no position encoding); the window (4096, as released) is longer
than any test prompt.
"""

from __future__ import annotations

import torch
from transformers import (
    AyaVisionConfig,
    AyaVisionForConditionalGeneration,
    AyaVisionProcessor,
    Cohere2Config,
    GotOcr2ImageProcessorPil,
    SiglipVisionConfig,
)

from vrh_interp.testing.tiny import (
    TINY_TEXT_CONFIG,
    TINY_VISION_CONFIG,
    TinyVLM,
    composite_model,
    text_token_ids,
    vision_encoder_attention_modules,
)
from vrh_interp.testing.tokenizer import build_byte_tokenizer

TILE_SIZE = 56
VISION_PATCH_SIZE = 7
DOWNSAMPLE_FACTOR = 2
MAX_TILES = 6

IMAGE_TOKENS = ("<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>", "<|IMG_LINE_BREAK|>", "TILE", "TILE_GLOBAL")
CHAT_TOKENS = ("<PAD>", "<BOS_TOKEN>", "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>",
               "<|CHATBOT_TOKEN|>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|START_OF_TURN_TOKEN|>"
    "{% if message['role'] == 'user' %}<|USER_TOKEN|>{% else %}<|CHATBOT_TOKEN|>{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<image>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|END_OF_TURN_TOKEN|>{% endfor %}"
    "{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}"
)


def build_processor() -> AyaVisionProcessor:
    tokenizer = build_byte_tokenizer(
        (*CHAT_TOKENS, *IMAGE_TOKENS),
        named_special_tokens={"pad_token": "<PAD>", "bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>"},
        chat_template=CHAT_TEMPLATE,
    )
    image_processor = GotOcr2ImageProcessorPil(
        size={"height": TILE_SIZE, "width": TILE_SIZE}, crop_to_patches=True, min_patches=1, max_patches=MAX_TILES,
        image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5),
    )
    return AyaVisionProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=VISION_PATCH_SIZE * DOWNSAMPLE_FACTOR,
        img_size=TILE_SIZE,
        chat_template=CHAT_TEMPLATE,
    )


def build(seed: int = 0) -> TinyVLM:
    torch.manual_seed(seed)
    processor = build_processor()
    tokenizer = processor.tokenizer
    text_config = Cohere2Config(
        **TINY_TEXT_CONFIG,
        **text_token_ids(tokenizer),
        sliding_window=4096,
        layer_types=["sliding_attention", "full_attention"],
    )
    vision_config = SiglipVisionConfig(
        **TINY_VISION_CONFIG, image_size=TILE_SIZE, patch_size=VISION_PATCH_SIZE, vision_use_head=False
    )
    config = AyaVisionConfig(
        vision_config=vision_config,
        text_config=text_config,
        downsample_factor=DOWNSAMPLE_FACTOR,
        image_token_index=processor.image_token_id,
    )
    model = composite_model(AyaVisionForConditionalGeneration, config, tokenizer)
    return TinyVLM(family="aya_vision", model=model, processor=processor,
                   vision_attention_modules=vision_encoder_attention_modules)
