"""Tiny Gemma 3 (``Gemma3ForConditionalGeneration``: SigLIP tower, average pooling, Gemma3 LM) offline.

Images are stretched to 64 x 64 (SigLIP patch 8 -> 8 x 8 patches), average-pooled 2 x 2 to
``mm_tokens_per_image`` = 16 tokens (4 x 4). The LM has a sliding-window layer then a global layer and
sets ``query_pre_attn_scalar`` = head_dim; the window (4096) is longer than any test prompt, as
released checkpoints' windows are for single-image prompts. Gemma3 zero-initialises
``multi_modal_projector.mm_input_projection_weight`` (a fresh model would ignore the image): it is
re-initialised here.
"""

from __future__ import annotations

import torch
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3ImageProcessorPil,
    Gemma3Processor,
    Gemma3TextConfig,
    SiglipVisionConfig,
)

from vrh_interp.testing.tiny import (
    GEMMA_NAMED_TOKENS,
    TINY_HEAD_DIM,
    TINY_TEXT_CONFIG,
    TINY_VISION_CONFIG,
    TinyVLM,
    composite_model,
    text_token_ids,
    vision_encoder_attention_modules,
)
from vrh_interp.testing.tokenizer import build_byte_tokenizer

IMAGE_SIZE = 64
PATCH_SIZE = 8
TOKENS_PER_IMAGE = 16

IMAGE_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", *IMAGE_TOKENS.values())
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)


def build_processor() -> Gemma3Processor:
    tokenizer = build_byte_tokenizer(
        SPECIAL_TOKENS,
        named_special_tokens=GEMMA_NAMED_TOKENS,
        extra_special_tokens=IMAGE_TOKENS,
        chat_template=CHAT_TEMPLATE,
    )
    image_processor = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                                              image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5))
    return Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE,
                           image_seq_length=TOKENS_PER_IMAGE)


def build(seed: int = 0) -> TinyVLM:
    torch.manual_seed(seed)
    processor = build_processor()
    tokenizer = processor.tokenizer
    text_config = Gemma3TextConfig(
        **TINY_TEXT_CONFIG,
        **text_token_ids(tokenizer),
        head_dim=TINY_HEAD_DIM,
        query_pre_attn_scalar=TINY_HEAD_DIM,
        sliding_window=4096,
        layer_types=["sliding_attention", "full_attention"],
    )
    vision_config = SiglipVisionConfig(
        **TINY_VISION_CONFIG, image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, vision_use_head=False
    )
    config = Gemma3Config(
        vision_config=vision_config,
        text_config=text_config,
        mm_tokens_per_image=TOKENS_PER_IMAGE,
        boi_token_index=tokenizer.boi_token_id,
        eoi_token_index=tokenizer.eoi_token_id,
        image_token_index=tokenizer.image_token_id,
    )
    model = composite_model(Gemma3ForConditionalGeneration, config, tokenizer)
    with torch.no_grad():
        torch.nn.init.normal_(model.model.multi_modal_projector.mm_input_projection_weight, std=0.1)
    return TinyVLM(family="gemma3", model=model, processor=processor,
                   vision_attention_modules=vision_encoder_attention_modules)
