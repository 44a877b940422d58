"""Tiny random-weight Qwen3-VL.

Facts (transformers 5.24, models/qwen3_vl/): same special tokens as Qwen2-VL; the image processor is
``Qwen2VLImageProcessorPil`` with patch 16 (merge 2, so 32-pixel merged tokens). The text attention reads
``config.head_dim``; ``rope_parameters`` needs ``mrope_section`` summing to head_dim / 2 and
``mrope_interleaved: True``. The vision tower adds interpolated learned position embeddings
(``num_position_embeddings`` must be a square) and feeds DeepStack features from
``deepstack_visual_indexes`` into the first LM layers' outputs at the image positions. The chat template
is the Qwen3-VL-Instruct one reduced to text and image turns (no default system turn).
"""

from __future__ import annotations

import torch
from transformers import (
    Qwen2VLImageProcessorPil,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
)

from vrh_interp.testing.tiny import TINY_HEAD_DIM, TINY_TEXT_CONFIG, TinyVLM
from vrh_interp.testing.tiny.qwen2_vl import (
    TINY_MIN_PIXELS,
    build_qwen_processor,
    build_qwen_tokenizer,
    merger_vision_config,
    mrope_parameters,
    qwen_config_token_ids,
    qwen_text_token_ids,
    vision_attention_modules,
)

QWEN3_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# At most 48 merged tokens of 32 x 32 pixels.
TINY_MAX_PIXELS = 32 * 32 * 48


def build(seed: int = 0) -> TinyVLM:
    torch.manual_seed(seed)
    tokenizer = build_qwen_tokenizer(QWEN3_VL_CHAT_TEMPLATE)
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=16, min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    )
    processor = build_qwen_processor(Qwen3VLProcessor, image_processor, tokenizer)
    config = Qwen3VLConfig(
        text_config={
            **TINY_TEXT_CONFIG,
            **qwen_text_token_ids(tokenizer),
            "head_dim": TINY_HEAD_DIM,
            "rope_parameters": mrope_parameters([2, 3, 3], mrope_interleaved=True),
        },
        vision_config=merger_vision_config(image_processor, num_position_embeddings=64, deepstack_visual_indexes=[0]),
        **qwen_config_token_ids(tokenizer),
    )
    model = Qwen3VLForConditionalGeneration(config).eval()
    return TinyVLM(family="qwen3_vl", model=model, processor=processor,
                   vision_attention_modules=vision_attention_modules)
