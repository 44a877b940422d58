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
"""

from __future__ import annotations

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


def build(seed: int = 0) -> TinyVLM:
    torch.manual_seed(seed)
    tokenizer = build_llava_tokenizer(LLAVA_NEXT_CHAT_TEMPLATE)
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
        chat_template=LLAVA_NEXT_CHAT_TEMPLATE,
    )
    config = LlavaNextConfig(
        vision_config={**TINY_CLIP_VISION_CONFIG, "image_size": TILE_SIZE, "patch_size": PATCH_SIZE},
        text_config={**TINY_LLAMA_CONFIG, **text_token_ids(tokenizer)},
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        image_grid_pinpoints=GRID_PINPOINTS,
        image_seq_length=(TILE_SIZE // PATCH_SIZE) ** 2,
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
    )
    model = LlavaNextForConditionalGeneration(config).eval()
    return TinyVLM(family="llava_next", model=model, processor=processor,
                   vision_attention_modules=vision_encoder_attention_modules)
