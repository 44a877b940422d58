"""Tiny random-weight LLaVA-OneVision (``LlavaOnevisionForConditionalGeneration``: SigLIP tower + Qwen2 backbone).

Facts (transformers 5.24, models/llava_onevision/): the image processing is LLaVA-NeXT's anyres (base view
first, best-resolution tiles, centred zero padding) with ``size = {"height": T, "width": T}``; the model
unpads the tile grid like LLaVA-NeXT and then bilinearly downsamples it when it exceeds
``vision_aspect_ratio = "anyres_max_K"`` tiles' worth of tokens (ratio > 1.1), before the newlines.
SigLIP has no CLS token: ``vision_feature_select_strategy = "full"`` and ``LlavaOnevisionProcessor``
counts ``num_image_tokens`` (g * g) per view. The processor's ``__init__`` takes a video processor, which
imports torchvision; the image-only subclass (``_image_only_processor``) constructs without it.

Tiny sizes: tile T = 36 with patch 8, so each tile's 4 x 4 tokens cover its first 32 x 32 pixels and leave
a 4-pixel gap, like the released 384 / 14 checkpoints (27 x 27 tokens over 378 pixels); pinpoints are all
1..6 x 1..6 tile grids as in the released configs, so images above ~9 tiles are downsampled. NEAREST
resampling for the layout experiment. The chat template mirrors llava-hf/llava-onevision-qwen2-0.5b-ov-hf.
"""

from __future__ import annotations

import torch
from transformers import (
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionImageProcessorPil,
    LlavaOnevisionProcessor,
)
from transformers.image_utils import PILImageResampling

from vrh_interp.testing.tiny import (
    QWEN2_NAMED_TOKENS,
    TINY_HEAD_DIM,
    TINY_TEXT_CONFIG,
    TINY_VISION_CONFIG,
    TinyVLM,
    text_token_ids,
    vision_encoder_attention_modules,
)
from vrh_interp.testing.tiny._image_only_processor import image_only_processor_class
from vrh_interp.testing.tokenizer import build_byte_tokenizer

TILE_SIZE = 36
PATCH_SIZE = 8
GRID_PINPOINTS: list[list[int]] = [
    [TILE_SIZE * rows, TILE_SIZE * cols] for rows in range(1, 7) for cols in range(1, 7)
]

ONEVISION_SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>")

LLAVA_ONEVISION_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + ' ' }}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ '\n' + content['text'] }}"
    "{% endfor %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build(seed: int = 0) -> TinyVLM:
    torch.manual_seed(seed)
    tokenizer = build_byte_tokenizer(
        ONEVISION_SPECIAL_TOKENS,
        named_special_tokens=QWEN2_NAMED_TOKENS,
        extra_special_tokens={"image_token": "<image>", "video_token": "<video>"},
        chat_template=LLAVA_ONEVISION_CHAT_TEMPLATE,
    )
    image_processor = LlavaOnevisionImageProcessorPil(
        size={"height": TILE_SIZE, "width": TILE_SIZE},
        image_grid_pinpoints=GRID_PINPOINTS,
        resample=PILImageResampling.NEAREST,
    )
    tile_tokens = (TILE_SIZE // PATCH_SIZE) ** 2
    processor = image_only_processor_class(LlavaOnevisionProcessor)(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=LLAVA_ONEVISION_CHAT_TEMPLATE,
        num_image_tokens=tile_tokens,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9",
    )
    ids = tokenizer.convert_tokens_to_ids
    config = LlavaOnevisionConfig(
        vision_config={
            "model_type": "siglip_vision_model",
            **TINY_VISION_CONFIG,
            "image_size": TILE_SIZE,
            "patch_size": PATCH_SIZE,
            "vision_use_head": False,
        },
        text_config={
            "model_type": "qwen2",
            **TINY_TEXT_CONFIG,
            "head_dim": TINY_HEAD_DIM,
            **text_token_ids(tokenizer),
            "bos_token_id": tokenizer.pad_token_id,  # Qwen configs use <|endoftext|> as bos and pad
        },
        image_token_index=ids("<image>"),
        video_token_index=ids("<video>"),
        image_grid_pinpoints=GRID_PINPOINTS,
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        vision_aspect_ratio="anyres_max_9",
    )
    model = LlavaOnevisionForConditionalGeneration(config).eval()
    return TinyVLM(family="llava_onevision", model=model, processor=processor,
                   vision_attention_modules=vision_encoder_attention_modules)
