"""Tiny random-weight GLM-4V (GLM-4.1V architecture, ``Glm4vForConditionalGeneration``).

Facts (transformers 5.24, models/glm4v/): ``Glm4vProcessor`` expands ``<|image|>`` (between
``<|begin_of_image|>``/``<|end_of_image|>``) into ``image_grid_thw.prod() // merge_size**2`` copies and returns
``mm_token_type_ids``, required with ``pixel_values``. ``Glm4vImageProcessorPil`` resizes with its own
``smart_resize`` (patch 14 x merge 2; pixel budgets count the two temporal frames, images smaller than 28
pixels on a side are first upscaled). The text attention uses ``head_dim = hidden_size // heads`` and a
partial rotary embedding, so ``mrope_section`` sums to head_dim * partial_rotary_factor / 2. The vision
tower adds bicubic-interpolated learned position embeddings ((image_size / patch)^2 of them). The chat
template is GLM-4.1V's reduced to text and image turns (``[gMASK]<sop>``, ``<|user|>``, ``<|assistant|>``).

``build_glm46v`` builds the same model through transformers' ``glm46v`` classes (``Glm46VForConditionalGeneration``,
whose language model is ``AutoModel.from_config(text_config)``, a ``glm4v_text`` model) with GLM-4.6V-Flash's
attention shape: one KV head for all query heads of a group (32 / 2 in the real model, 4 / 1 here) and
rope_theta 500000. The hub checkpoint zai-org/GLM-4.6V-Flash itself declares ``model_type: glm4v``.
"""

from __future__ import annotations

import torch
from transformers import (
    Glm46VConfig,
    Glm46VForConditionalGeneration,
    Glm46VProcessor,
    Glm4vConfig,
    Glm4vForConditionalGeneration,
    Glm4vImageProcessorPil,
    Glm4vProcessor,
)

from vrh_interp.testing.tiny import TINY_TEXT_CONFIG, TinyVLM
from vrh_interp.testing.tiny._image_only_processor import image_only_processor_class
from vrh_interp.testing.tiny.qwen2_vl import merger_vision_config, mrope_parameters, vision_attention_modules
from vrh_interp.testing.tokenizer import build_byte_tokenizer

GLM4V_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|image|>",
    "<|video|>",
    "<|begin_of_box|>",
    "<|end_of_box|>",
    "<think>",
    "</think>",
)

GLM4V_CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for message in messages %}"
    "{% if message['role'] == 'system' %}<|system|>\n{{ message['content'] }}"
    "{% elif message['role'] == 'user' %}<|user|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'video' or 'video' in item %}<|begin_of_video|><|video|><|end_of_video|>"
    "{% elif item['type'] == 'image' or 'image' in item %}<|begin_of_image|><|image|><|end_of_image|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% elif message['role'] == 'assistant' %}<|assistant|>\n{{ message['content'] }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# Pixel budget counts the two temporal frames: at most 48 merged tokens of 28 x 28 pixels.
TINY_MIN_PIXELS = 2 * 56 * 56
TINY_MAX_PIXELS = 2 * 28 * 28 * 48


# GLM-4.6V-Flash's text attention at tiny scale (real: 32 query heads, 2 KV heads, rope_theta 500000)
TINY_GLM46V_TEXT = {"num_attention_heads": 4, "num_key_value_heads": 1, "model_type": "glm4v_text"}


def build_glm46v(seed: int = 0) -> TinyVLM:
    """GLM-4.6V(-Flash) through the ``glm46v`` classes."""
    return build(seed, classes=(Glm46VConfig, Glm46VForConditionalGeneration, Glm46VProcessor),
                 text_extra=TINY_GLM46V_TEXT, rope_theta=500000.0, family="glm46v")


def build(seed: int = 0, *, classes: tuple[type, type, type] = (Glm4vConfig, Glm4vForConditionalGeneration,
                                                                   Glm4vProcessor),
          text_extra: dict | None = None, rope_theta: float | None = None, family: str = "glm4v") -> TinyVLM:
    config_class, model_class, processor_class = classes
    torch.manual_seed(seed)
    tokenizer = build_byte_tokenizer(
        GLM4V_SPECIAL_TOKENS,
        named_special_tokens={"eos_token": "<|user|>", "pad_token": "<|endoftext|>"},
        extra_special_tokens={"image_token": "<|image|>", "video_token": "<|video|>"},
        chat_template=GLM4V_CHAT_TEMPLATE,
    )
    image_processor = Glm4vImageProcessorPil(size={"shortest_edge": TINY_MIN_PIXELS, "longest_edge": TINY_MAX_PIXELS})
    processor = image_only_processor_class(processor_class)(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=GLM4V_CHAT_TEMPLATE
    )
    ids = tokenizer.convert_tokens_to_ids
    config = config_class(
        text_config={
            **TINY_TEXT_CONFIG,
            "vocab_size": len(tokenizer),
            "eos_token_id": [ids("<|endoftext|>"), ids("<|user|>"), ids("<|observation|>")],
            "pad_token_id": tokenizer.pad_token_id,
            "rope_parameters": mrope_parameters([2, 1, 1], partial_rotary_factor=0.5,
                                                **({} if rope_theta is None else {"rope_theta": rope_theta})),
            **(text_extra or {}),
        },
        vision_config=merger_vision_config(image_processor, image_size=112),
        image_token_id=ids("<|image|>"),
        video_token_id=ids("<|video|>"),
        image_start_token_id=ids("<|begin_of_image|>"),
        image_end_token_id=ids("<|end_of_image|>"),
        video_start_token_id=ids("<|begin_of_video|>"),
        video_end_token_id=ids("<|end_of_video|>"),
    )
    model = model_class(config).eval()
    return TinyVLM(family=family, model=model, processor=processor,
                   vision_attention_modules=vision_attention_modules)
