"""Tiny HF-native InternVL (``InternVLForConditionalGeneration``) with its real processor, built offline.

Tiles are 64 x 64 (patch 8 -> 8 x 8 patches -> 4 x 4 tokens after the 0.5 pixel shuffle), at most 6
tiles plus the thumbnail, so non-square images exercise the real tiling policy with few tokens. The
chat template follows the ChatML layout of the ``-hf`` InternVL3 checkpoints, with ``<IMG_CONTEXT>`` as
the image placeholder that ``InternVLProcessor`` expands to ``<img>`` + tokens + ``</img>``. The processor
is built without its (torchvision-based) video processor.

``build_qwen3`` is the same fixture with InternVL3.5's language backbone, Qwen3 (per-head RMSNorm of queries and
keys before rotary; ``head_dim`` from the config), as in OpenGVLab/InternVL3_5-8B-HF.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    GotOcr2ImageProcessorPil,
    InternVLConfig,
    InternVLForConditionalGeneration,
    InternVLProcessor,
    InternVLVisionConfig,
    Qwen2Config,
    Qwen3Config,
)

from vrh_interp.testing.tiny import (
    QWEN2_NAMED_TOKENS,
    TINY_HEAD_DIM,
    TINY_TEXT_CONFIG,
    TINY_VISION_CONFIG,
    TinyVLM,
    composite_model,
    text_token_ids,
)
from vrh_interp.testing.tiny._image_only_processor import image_only_processor_class
from vrh_interp.testing.tokenizer import build_byte_tokenizer

TILE_SIZE = 64
PATCH_SIZE = 8
DOWNSAMPLE_RATIO = 0.5
TOKENS_PER_TILE = int(TILE_SIZE // PATCH_SIZE * DOWNSAMPLE_RATIO) ** 2
MAX_TILES = 6

IMAGE_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", *IMAGE_TOKENS.values(),
                  "<ref>", "</ref>", "<box>", "</box>")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_processor() -> InternVLProcessor:
    tokenizer = build_byte_tokenizer(
        SPECIAL_TOKENS,
        named_special_tokens=QWEN2_NAMED_TOKENS,
        extra_special_tokens=IMAGE_TOKENS,
        chat_template=CHAT_TEMPLATE,
    )
    image_processor = GotOcr2ImageProcessorPil(
        size={"height": TILE_SIZE, "width": TILE_SIZE}, crop_to_patches=True, min_patches=1, max_patches=MAX_TILES
    )
    return image_only_processor_class(InternVLProcessor)(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_length=TOKENS_PER_TILE,
        chat_template=CHAT_TEMPLATE,
    )


def build_qwen3(seed: int = 0) -> TinyVLM:
    """InternVL with a Qwen3 backbone (the language model of InternVL3.5)."""
    return build(seed, text_config_class=Qwen3Config, family="internvl_qwen3")


def build(seed: int = 0, *, text_config_class: type = Qwen2Config, family: str = "internvl") -> TinyVLM:
    torch.manual_seed(seed)
    processor = build_processor()
    tokenizer = processor.tokenizer
    text_config = text_config_class(**TINY_TEXT_CONFIG, **text_token_ids(tokenizer), head_dim=TINY_HEAD_DIM)
    vision_config = InternVLVisionConfig(
        **TINY_VISION_CONFIG, image_size=(TILE_SIZE, TILE_SIZE), patch_size=(PATCH_SIZE, PATCH_SIZE)
    )
    config = InternVLConfig(
        vision_config=vision_config,
        text_config=text_config,
        image_token_id=tokenizer.context_image_token_id,
        image_seq_length=TOKENS_PER_TILE,
        downsample_ratio=DOWNSAMPLE_RATIO,
    )
    model = composite_model(InternVLForConditionalGeneration, config, tokenizer)
    return TinyVLM(family=family, model=model, processor=processor,
                   vision_attention_modules=vision_attention_modules)


def vision_attention_modules(model: Any) -> list[torch.nn.Module]:
    return [layer.attention for layer in model.model.vision_tower.encoder.layer]
