"""Tiny Idefics3 (``Idefics3ForConditionalGeneration``) and SmolVLM variant, built offline.

Frames are M = 32 px (patch 4 -> 8 x 8 patches -> 4 x 4 tokens after the scale-2 pixel shuffle) and the
longest edge is resized to L = 96 px, so an image is split into at most 3 x 3 tiles plus the global
image. The chat template is the Idefics3 one (``User:<image>...<end_of_utterance>\\nAssistant:``).

``build_smolvlm`` gives a ``SmolVLMForConditionalGeneration`` (model_type ``smolvlm``) with the SmolVLM
image processor. ``SmolVLMProcessor`` needs the optional ``num2words`` package (absent here), so the
variant is wrapped in ``Idefics3Processor``, whose image-prompt string is the same as SmolVLM's
(``processing_smolvlm._prompt_split_image`` / ``_prompt_single_image``).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3ImageProcessorPil,
    Idefics3Processor,
    Idefics3VisionConfig,
    LlamaConfig,
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
    SmolVLMImageProcessorPil,
    SmolVLMVisionConfig,
)

from vrh_interp.testing.tiny import (
    TINY_HEAD_DIM,
    TINY_TEXT_CONFIG,
    TINY_VISION_CONFIG,
    TinyVLM,
    composite_model,
    text_token_ids,
)
from vrh_interp.testing.tokenizer import build_byte_tokenizer

FRAME_SIZE = 32
LONGEST_EDGE = 3 * FRAME_SIZE
PATCH_SIZE = 4
SCALE_FACTOR = 2
TOKENS_PER_FRAME = (FRAME_SIZE // PATCH_SIZE // SCALE_FACTOR) ** 2

ROW_COL_TOKENS = tuple(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))
SPECIAL_TOKENS = ("<|end_of_text|>", "<|begin_of_text|>", "<end_of_utterance>", "<fake_token_around_image>",
                  "<image>", "<global-img>", *ROW_COL_TOKENS)
CHAT_TEMPLATE = (
    "<|begin_of_text|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}{{ ': ' + message['content'] }}"
    "{% else %}{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def build_processor(image_processor_class: type = Idefics3ImageProcessorPil) -> Idefics3Processor:
    tokenizer = build_byte_tokenizer(
        SPECIAL_TOKENS,
        named_special_tokens={"pad_token": "<|end_of_text|>", "bos_token": "<|begin_of_text|>",
                              "eos_token": "<end_of_utterance>"},
        chat_template=CHAT_TEMPLATE,
    )
    image_processor = image_processor_class(
        size={"longest_edge": LONGEST_EDGE}, max_image_size={"longest_edge": FRAME_SIZE},
        image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5),
    )
    return Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer,
                             image_seq_len=TOKENS_PER_FRAME, chat_template=CHAT_TEMPLATE)


def text_config(tokenizer: Any) -> LlamaConfig:
    return LlamaConfig(**TINY_TEXT_CONFIG, **text_token_ids(tokenizer), head_dim=TINY_HEAD_DIM)


def vision_config_kwargs() -> dict[str, int]:
    return {**TINY_VISION_CONFIG, "image_size": FRAME_SIZE, "patch_size": PATCH_SIZE}


def build(seed: int = 0) -> TinyVLM:
    return build_variant(seed, Idefics3ImageProcessorPil, Idefics3Config, Idefics3VisionConfig,
                         Idefics3ForConditionalGeneration)


def build_smolvlm(seed: int = 0) -> TinyVLM:
    return build_variant(seed, SmolVLMImageProcessorPil, SmolVLMConfig, SmolVLMVisionConfig,
                         SmolVLMForConditionalGeneration)


def build_variant(seed: int, image_processor_class: type, config_class: type, vision_config_class: type,
                  model_class: type) -> TinyVLM:
    """The tiny model of ``model_class`` (Idefics3 or SmolVLM) behind an ``Idefics3Processor``."""
    torch.manual_seed(seed)
    processor = build_processor(image_processor_class)
    config = config_class(
        vision_config=vision_config_class(**vision_config_kwargs()),
        text_config=text_config(processor.tokenizer),
        image_token_id=processor.image_token_id,
        scale_factor=SCALE_FACTOR,
    )
    model = composite_model(model_class, config, processor.tokenizer)
    return TinyVLM(family="idefics3", model=model, processor=processor,
                   vision_attention_modules=vision_attention_modules)


def vision_attention_modules(model: Any) -> list[torch.nn.Module]:
    return [layer.self_attn for layer in model.model.vision_model.encoder.layers]
