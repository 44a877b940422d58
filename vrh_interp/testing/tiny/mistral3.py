"""Tiny random-weight Mistral3 (``Mistral3ForConditionalGeneration``: Pixtral tower + patch merger + Mistral).

Facts (transformers 5.24, models/mistral3/ and models/pixtral/): ``PixtralImageProcessorPil`` downscales an
image to fit ``longest_edge`` (``floor`` of each side / ratio) and stretches each side UP to a multiple of
``patch_size`` (the processor passes patch x spatial_merge); ``image_sizes`` is that resized (h, w).
``PixtralProcessor.replace_image_token`` writes, per merged row, ``[IMG]`` x cols then ``[IMG_BREAK]``, the
last ``[IMG_BREAK]`` replaced by ``[IMG_END]``. ``Mistral3PatchMerger`` merges spatial_merge x
spatial_merge patches (``unfold``, row-major) and the model scatters the features into the ``[IMG]``
positions only.

``transformers.models.pixtral.processing_pixtral`` imports torchvision at module level (through
``image_processing_pixtral``), so ``PixtralProcessor`` cannot be imported in an environment without
torchvision. ``PixtralProcessorPort`` below is a port of its ``__init__`` token attributes,
``_process_images`` and ``replace_image_token`` (nothing else differs; ``ProcessorMixin.__call__`` does the
rest); ``tests/families/test_families.py -k mistral3`` compares it with the real class when torchvision is installed.

Tiny sizes: patch 8, spatial merge 2 (16-pixel tokens), longest edge 64. NEAREST resampling for the layout
experiment. The chat template follows mistralai/Mistral-Small-3.1-24B-Instruct-2503 (``[INST]...[/INST]``,
images inline as ``[IMG]``) without its default system prompt.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    Mistral3Config,
    Mistral3ForConditionalGeneration,
    PixtralImageProcessorPil,
    ProcessorMixin,
)
from transformers.image_utils import PILImageResampling

from vrh_interp.testing.tiny import (
    LLAMA_NAMED_TOKENS,
    TINY_HEAD_DIM,
    TINY_TEXT_CONFIG,
    TINY_VISION_CONFIG,
    TinyVLM,
    text_token_ids,
)
from vrh_interp.testing.tokenizer import build_byte_tokenizer

PATCH_SIZE = 8
SPATIAL_MERGE_SIZE = 2
LONGEST_EDGE = 64

MISTRAL3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]",
    "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
)

MISTRAL3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}[SYSTEM_PROMPT]{{ message['content'] }}[/SYSTEM_PROMPT]"
    "{% elif message['role'] == 'user' %}[INST]{% for content in message['content'] %}"
    "{% if content['type'] == 'text' %}{{ content['text'] }}{% elif content['type'] == 'image' %}[IMG]{% endif %}"
    "{% endfor %}[/INST]{% elif message['role'] == 'assistant' %}{{ message['content'][0]['text'] }}{{ eos_token }}"
    "{% endif %}{% endfor %}"
)


class PixtralProcessorPort(ProcessorMixin):
    """``PixtralProcessor`` (transformers 5.24) without its module-level torchvision import."""

    text_kwargs = {"return_tensors": "pt"}
    images_kwargs = {"return_tensors": "pt"}

    def __init__(self, image_processor: Any = None, tokenizer: Any = None, patch_size: int = 16,
                 spatial_merge_size: int = 1, chat_template: str | None = None, image_token: str = "[IMG]",
                 image_break_token: str = "[IMG_BREAK]", image_end_token: str = "[IMG_END]", **kwargs: Any) -> None:
        super().__init__(image_processor, tokenizer, chat_template=chat_template)
        self.patch_size = patch_size
        self.spatial_merge_size = spatial_merge_size
        self.image_token = image_token
        self.image_break_token = image_break_token
        self.image_end_token = image_end_token
        self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)
        self.image_break_token_id = tokenizer.convert_tokens_to_ids(image_break_token)
        self.image_end_token_id = tokenizer.convert_tokens_to_ids(image_end_token)

    @property
    def image_token_ids(self) -> list[int]:
        return [self.image_token_id, self.image_break_token_id, self.image_end_token_id]

    def _process_images(self, images: Any, **images_kwargs: Any) -> Any:
        images_kwargs["patch_size"] = self.patch_size * self.spatial_merge_size
        return super()._process_images(images, **images_kwargs)

    def replace_image_token(self, image_inputs: dict, image_idx: int, **kwargs: Any) -> str:
        patch_size = self.patch_size * self.spatial_merge_size
        height, width = image_inputs["image_sizes"][image_idx]
        row = [self.image_token] * (width // patch_size) + [self.image_break_token]
        tokens = row * (height // patch_size)
        tokens[-1] = self.image_end_token
        return "".join(tokens)


def pixtral_vision_attention_modules(model: Any) -> list[torch.nn.Module]:
    """Attention of every Pixtral layer (``model.model.vision_tower.transformer.layers[i].attention``)."""
    return [layer.attention for layer in model.model.vision_tower.transformer.layers]


def build(seed: int = 0) -> TinyVLM:
    torch.manual_seed(seed)
    tokenizer = build_byte_tokenizer(
        MISTRAL3_SPECIAL_TOKENS,
        named_special_tokens=LLAMA_NAMED_TOKENS,
        chat_template=MISTRAL3_CHAT_TEMPLATE,
    )
    processor = PixtralProcessorPort(
        image_processor=PixtralImageProcessorPil(
            patch_size={"height": PATCH_SIZE, "width": PATCH_SIZE},
            size={"longest_edge": LONGEST_EDGE},
            resample=PILImageResampling.NEAREST,
        ),
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        spatial_merge_size=SPATIAL_MERGE_SIZE,
        chat_template=MISTRAL3_CHAT_TEMPLATE,
    )
    config = Mistral3Config(
        vision_config={
            "model_type": "pixtral", **TINY_VISION_CONFIG, "image_size": LONGEST_EDGE, "patch_size": PATCH_SIZE
        },
        text_config={
            "model_type": "mistral",
            **TINY_TEXT_CONFIG,
            "head_dim": TINY_HEAD_DIM,
            "sliding_window": None,
            **text_token_ids(tokenizer),
        },
        image_token_index=processor.image_token_id,
        spatial_merge_size=SPATIAL_MERGE_SIZE,
        vision_feature_layer=-1,
    )
    model = Mistral3ForConditionalGeneration(config).eval()
    return TinyVLM(family="mistral3", model=model, processor=processor,
                   vision_attention_modules=pixtral_vision_attention_modules)
