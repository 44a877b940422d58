"""Tiny random-weight Qwen2-VL, plus the tokenizer and processor pieces the Qwen2.5-VL and Qwen3-VL fixtures share.

Facts (transformers 5.24, models/qwen2_vl/): ``Qwen2VLProcessor`` expands each ``<|image_pad|>`` into
``image_grid_thw.prod() // merge_size**2`` copies and returns ``mm_token_type_ids``, which the model requires
whenever ``pixel_values`` is passed (multimodal RoPE positions). ``rope_parameters["mrope_section"]`` must sum
to head_dim / 2 (the default ``[16, 24, 24]`` is for head_dim 128). The chat template is the one shipped with
Qwen/Qwen2-VL-7B-Instruct (default system turn, ``<|vision_start|><|image_pad|><|vision_end|>`` per image).
The image processor keeps the real resize policy (``smart_resize`` to multiples of patch x merge) with a
small ``longest_edge`` pixel budget so images stay at a few dozen visual tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    PreTrainedTokenizerFast,
    ProcessorMixin,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen2VLProcessor,
)

from vrh_interp.testing.tiny import QWEN2_NAMED_TOKENS, TINY_TEXT_CONFIG, TinyVLM, text_token_ids
from vrh_interp.testing.tiny._image_only_processor import image_only_processor_class
from vrh_interp.testing.tokenizer import build_byte_tokenizer

QWEN_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Pixel budget of the tiny processors: at most 48 merged tokens of 28 x 28 pixels (Qwen2/2.5-VL).
TINY_MIN_PIXELS = 56 * 56
TINY_MAX_PIXELS = 28 * 28 * 48


def build_qwen_tokenizer(chat_template: str) -> PreTrainedTokenizerFast:
    """Byte tokenizer with the Qwen2-VL family's special tokens (same strings in Qwen2.5-VL and Qwen3-VL)."""
    return build_byte_tokenizer(
        QWEN_SPECIAL_TOKENS,
        named_special_tokens=QWEN2_NAMED_TOKENS,
        extra_special_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>"},
        chat_template=chat_template,
    )


def build_qwen_processor(processor_class: type[ProcessorMixin], image_processor: Any,
                         tokenizer: PreTrainedTokenizerFast) -> ProcessorMixin:
    return image_only_processor_class(processor_class)(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=tokenizer.chat_template
    )


def qwen_config_token_ids(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    """The special-token ids a Qwen-VL config carries, read from the tokenizer."""
    ids = tokenizer.convert_tokens_to_ids
    return {
        "image_token_id": ids("<|image_pad|>"),
        "video_token_id": ids("<|video_pad|>"),
        "vision_start_token_id": ids("<|vision_start|>"),
        "vision_end_token_id": ids("<|vision_end|>"),
    }


def qwen_text_token_ids(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    # Qwen configs use <|endoftext|> as bos and pad.
    return {**text_token_ids(tokenizer), "bos_token_id": tokenizer.pad_token_id}


def mrope_parameters(mrope_section: list[int], **extra: Any) -> dict[str, Any]:
    """Default RoPE with multimodal sections (``mrope_section`` sums to the rotary dims / 2)."""
    return {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope_section, **extra}


def patch_grid(image_processor: Any) -> dict[str, int]:
    """The vision-config entries a Qwen2-VL-style image processor fixes (patch, merge, temporal patch)."""
    return {
        "patch_size": image_processor.patch_size,
        "spatial_merge_size": image_processor.merge_size,
        "temporal_patch_size": image_processor.temporal_patch_size,
    }


def merger_vision_config(image_processor: Any, **extra: Any) -> dict[str, Any]:
    """The tiny vision tower of Qwen2.5-VL, Qwen3-VL and GLM-4V, projecting to the tiny LM's hidden size."""
    return {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": TINY_TEXT_CONFIG["hidden_size"],
        **patch_grid(image_processor),
        **extra,
    }


def vision_attention_modules(model: Any) -> list[torch.nn.Module]:
    """Attention of every vision-tower block (``model.model.visual.blocks[i].attn``)."""
    return [block.attn for block in model.model.visual.blocks]


def build(seed: int = 0) -> TinyVLM:
    torch.manual_seed(seed)
    tokenizer = build_qwen_tokenizer(QWEN2_VL_CHAT_TEMPLATE)
    image_processor = Qwen2VLImageProcessorPil(min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS)
    processor = build_qwen_processor(Qwen2VLProcessor, image_processor, tokenizer)
    config = Qwen2VLConfig(
        text_config={
            **TINY_TEXT_CONFIG,
            **qwen_text_token_ids(tokenizer),
            "rope_parameters": mrope_parameters([2, 3, 3]),
        },
        vision_config={
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": TINY_TEXT_CONFIG["hidden_size"],
            "mlp_ratio": 2,
            "num_heads": 2,
            **patch_grid(image_processor),
        },
        **qwen_config_token_ids(tokenizer),
    )
    model = Qwen2VLForConditionalGeneration(config).eval()
    return TinyVLM(family="qwen2_vl", model=model, processor=processor,
                   vision_attention_modules=vision_attention_modules)
