"""Tiny random-weight Qwen2.5-VL.

Facts (transformers 5.24, models/qwen2_5_vl/): same tokens, chat template and image processor
(``Qwen2VLImageProcessorPil``, patch 14, merge 2) as Qwen2-VL; the vision tower uses windowed attention
(``window_size`` pixels, full attention in ``fullatt_block_indexes``) over a window-permuted patch order that
the merger un-permutes, and RMSNorm/SwiGLU blocks (``intermediate_size``, ``out_hidden_size``).
"""

from __future__ import annotations

import torch
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessorPil,
)

from vrh_interp.testing.tiny import TINY_TEXT_CONFIG, TinyVLM
from vrh_interp.testing.tiny.qwen2_vl import (
    QWEN2_VL_CHAT_TEMPLATE,
    TINY_MAX_PIXELS,
    TINY_MIN_PIXELS,
    build_qwen_processor,
    build_qwen_tokenizer,
    merger_vision_config,
    mrope_parameters,
    qwen_config_token_ids,
    qwen_text_token_ids,
    vision_attention_modules,
)


def build(seed: int = 0) -> TinyVLM:
    torch.manual_seed(seed)
    tokenizer = build_qwen_tokenizer(QWEN2_VL_CHAT_TEMPLATE)
    image_processor = Qwen2VLImageProcessorPil(min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS)
    processor = build_qwen_processor(Qwen2_5_VLProcessor, image_processor, tokenizer)
    config = Qwen2_5_VLConfig(
        text_config={
            **TINY_TEXT_CONFIG,
            **qwen_text_token_ids(tokenizer),
            "rope_parameters": mrope_parameters([2, 3, 3]),
        },
        vision_config=merger_vision_config(image_processor, window_size=56, fullatt_block_indexes=[1]),
        **qwen_config_token_ids(tokenizer),
    )
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    return TinyVLM(family="qwen2_5_vl", model=model, processor=processor,
                   vision_attention_modules=vision_attention_modules)
