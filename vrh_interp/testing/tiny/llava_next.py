"""Tiny random-weight LLaVA-NeXT (``LlavaNextForConditionalGeneration``: CLIP tower + Llama backbone, anyres).

Facts (transformers 5.24, models/llava_next/): the image processor returns a base view (the whole image
stretched to the tile size) plus the tiles of the best grid resolution (``select_best_resolution`` over
``image_grid_pinpoints``; aspect-preserving resize, centred zero padding); ``pixel_values`` is
``[batch, 1 + tiles, 3, T, T]`` and ``image_sizes`` the original (height, width). The model reassembles the
tile features into one grid, removes padded rows/columns (``unpad_image``) and appends ``image_newline`` after
every row; ``LlavaNextProcessor._get_number_of_features`` expands ``<image>`` to the same count.

Tiny sizes: tile T = 32 with patch 8 (4 x 4 tokens per tile, gap-free like the real 336 / 14), pinpoints
scaled from llava-v1.6 (1x2, 2x1, 2x2, 3x1, 1x3 tiles). NEAREST resampling for the layout experiment.
The chat template mirrors llava-hf/llava-v1.6-mistral-7b-hf (``[INST] <image>\\n... [/INST]``).

``build_llama3`` is the same fixture with the language backbone of LLaVA-NeXT-Llama3-8B
(llava-hf/llama3-llava-next-8b-hf): a Llama 3 text config (GQA with four query heads per KV head as in 32 / 8,
rope_theta 500000), Llama 3's header tokens and a chat template in that checkpoint's format.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from transformers import (
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextImageProcessorPil,
    LlavaNextProcessor,
)
from transformers.image_utils import PILImageResampling

from vrh_interp.testing.tiny import TinyVLM, text_token_ids, vision_encoder_attention_modules
from vrh_interp.testing.tiny.llava import TINY_CLIP_VISION_CONFIG, TINY_LLAMA_CONFIG, build_llava_tokenizer
from vrh_interp.testing.tokenizer import build_byte_tokenizer

TILE_SIZE = 32
PATCH_SIZE = 8
GRID_PINPOINTS: list[list[int]] = [
    [TILE_SIZE * rows, TILE_SIZE * cols] for rows, cols in ((1, 2), (2, 1), (2, 2), (3, 1), (1, 3))
]

LLAVA_NEXT_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' }}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{{ ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'][0]['text'] + '</s>' }}"
    "{% endif %}{% endfor %}"
)


LLAMA3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<pad>",
    "<image>",
)
LLAMA3_LLAVA_NEXT_CHAT_TEMPLATE = (
    "<|begin_of_text|>{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
TINY_LLAMA3_CONFIG: dict[str, Any] = {
    **TINY_LLAMA_CONFIG, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 8,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
}


def build_llama3(seed: int = 0) -> TinyVLM:
    """LLaVA-NeXT with a Llama 3 backbone (the language model of LLaVA-NeXT-Llama3-8B)."""
    tokenizer = build_byte_tokenizer(
        LLAMA3_SPECIAL_TOKENS,
        named_special_tokens={"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": "<pad>"},
        extra_special_tokens={"image_token": "<image>"},
        chat_template=LLAMA3_LLAVA_NEXT_CHAT_TEMPLATE,
    )
    return build(seed, tokenizer=tokenizer, text_config=TINY_LLAMA3_CONFIG, family="llava_next_llama3")


def build(seed: int = 0, *, tokenizer: Any = None, text_config: Mapping[str, Any] = TINY_LLAMA_CONFIG,
          family: str = "llava_next") -> TinyVLM:
    torch.manual_seed(seed)
    tokenizer = tokenizer if tokenizer is not None else build_llava_tokenizer(LLAVA_NEXT_CHAT_TEMPLATE)
    image_processor = LlavaNextImageProcessorPil(
        size={"shortest_edge": TILE_SIZE},
        crop_size={"height": TILE_SIZE, "width": TILE_SIZE},
        image_grid_pinpoints=GRID_PINPOINTS,
        resample=PILImageResampling.NEAREST,
    )
    processor = LlavaNextProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=tokenizer.chat_template,
    )
    config = LlavaNextConfig(
        vision_config={**TINY_CLIP_VISION_CONFIG, "image_size": TILE_SIZE, "patch_size": PATCH_SIZE},
        text_config={**text_config, **text_token_ids(tokenizer)},
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        image_grid_pinpoints=GRID_PINPOINTS,
        image_seq_length=(TILE_SIZE // PATCH_SIZE) ** 2,
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
    )
    model = LlavaNextForConditionalGeneration(config).eval()
    return TinyVLM(family=family, model=model, processor=processor,
                   vision_attention_modules=vision_encoder_attention_modules)
