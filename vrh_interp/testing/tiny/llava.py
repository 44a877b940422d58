"""Tiny random-weight LLaVA-1.5 (``LlavaForConditionalGeneration``: CLIP vision tower + Llama backbone).

Facts (transformers 5.24, models/llava/ and models/clip/): ``LlavaProcessor`` expands each ``<image>`` into
``(H // patch) * (W // patch) + num_additional_image_tokens`` copies, minus one with the ``"default"``
feature-selection strategy (the CLS token is dropped), where H x W is the processed image. The image
processor pads to square (``do_pad``, background = ``image_mean``), resizes (``size``), then centre-crops
(``do_center_crop`` / ``crop_size``), in that order (``LlavaImageProcessorPil._preprocess``); the
llava-hf checkpoints ship the crop configuration (shortest edge -> 336, centre crop 336), which ``build``
reproduces at small scale; ``build(pad_to_square=True)`` gives the pad configuration of the original LLaVA-1.5
training code. The CLIP tower needs processed images of exactly ``vision_config.image_size``.

Tiny sizes: 44 x 44 processed images and patch 8, so the conv sees 5 x 5 patches covering 40 x 40 pixels
(the last 4 rows and columns reach no token), which exercises the remainder rule the real 336 / 14 grid
never hits. Resampling is NEAREST so the layout experiment (``vrh_interp.testing.layout_probe``) is exact.
The chat template mirrors llava-hf/llava-1.5-7b-hf (``USER: <image>\\n... ASSISTANT:``).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaImageProcessorPil,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)
from transformers.image_utils import PILImageResampling

from vrh_interp.testing.tiny import (
    LLAMA_NAMED_TOKENS,
    TINY_HEAD_DIM,
    TINY_TEXT_CONFIG,
    TINY_VISION_CONFIG,
    TinyVLM,
    text_token_ids,
    vision_encoder_attention_modules,
)
from vrh_interp.testing.tokenizer import build_byte_tokenizer

IMAGE_SIZE = 44
PATCH_SIZE = 8

LLAVA_SPECIAL_TOKENS: tuple[str, ...] = ("<s>", "</s>", "<unk>", "<pad>", "<image>")

LLAVA_15_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}{% endif %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' ' }}"
    "{% endfor %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

TINY_LLAMA_CONFIG: dict[str, Any] = {"model_type": "llama", **TINY_TEXT_CONFIG, "head_dim": TINY_HEAD_DIM}

TINY_CLIP_VISION_CONFIG: dict[str, Any] = {
    "model_type": "clip_vision_model", **TINY_VISION_CONFIG, "projection_dim": 32
}


def build_llava_tokenizer(chat_template: str) -> PreTrainedTokenizerFast:
    """Byte tokenizer with Llama's specials and LLaVA's ``<image>`` placeholder."""
    return build_byte_tokenizer(
        LLAVA_SPECIAL_TOKENS,
        named_special_tokens=LLAMA_NAMED_TOKENS,
        extra_special_tokens={"image_token": "<image>"},
        chat_template=chat_template,
    )


def build_processor(pad_to_square: bool = False) -> LlavaProcessor:
    """Crop configuration (llava-hf default) or pad configuration (original LLaVA-1.5), NEAREST resampling."""
    image_processor = LlavaImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE},
        crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        do_center_crop=True,
        do_pad=pad_to_square,
        resample=PILImageResampling.NEAREST,
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=build_llava_tokenizer(LLAVA_15_CHAT_TEMPLATE),
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=LLAVA_15_CHAT_TEMPLATE,
    )


def build(seed: int = 0, *, pad_to_square: bool = False) -> TinyVLM:
    torch.manual_seed(seed)
    processor = build_processor(pad_to_square)
    tokenizer = processor.tokenizer
    grid = IMAGE_SIZE // PATCH_SIZE
    config = LlavaConfig(
        vision_config={**TINY_CLIP_VISION_CONFIG, "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE},
        text_config={**TINY_LLAMA_CONFIG, **text_token_ids(tokenizer)},
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        image_seq_length=grid * grid,
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
    )
    model = LlavaForConditionalGeneration(config).eval()
    return TinyVLM(family="llava", model=model, processor=processor,
                   vision_attention_modules=vision_encoder_attention_modules)
