"""Builders of the toy grounding VLMs (model configs, processors) and their family-native prompt/box formats.

Training only (not shipped in the wheel). The two families, their visual grids and native answer formats are
described in ``vrh_interp.toy.configs``, which keeps what loading a shipped checkpoint needs.
"""

from __future__ import annotations

import dataclasses
import re

from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    GotOcr2ImageProcessorPil,
    InternVLConfig,
    InternVLVisionConfig,
    LlavaConfig,
    LlavaProcessor,
    PreTrainedTokenizerFast,
    ProcessorMixin,
    Qwen2Config,
)

from toy_training.tokenizer import IM_END, build_tokenizer
from vrh_interp.data.scenes import IMAGE_SIZE
from vrh_interp.toy.configs import GRID_SIDE, PATCH_SIZE, InternVLImageOnlyProcessor, ModelName, family

INTERNVL_TILE_SIZE = 2 * IMAGE_SIZE
COORDINATE_BINS = 101  # v in 0..100 -> v/100 of the image side
CLIP_MEAN = (0.5, 0.5, 0.5)
CLIP_STD = (0.25, 0.25, 0.25)

GROUNDING_INSTRUCTION = "please provide the bounding box coordinate of the region this sentence describes :"

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}IMAGE_PLACEHOLDER\n"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclasses.dataclass(frozen=True)
class TextBackboneShape:
    hidden_size: int = 128
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 16


@dataclasses.dataclass(frozen=True)
class VisionTowerShape:
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4


# toys C and D: 8 layers x 16 heads (head_dim 16, 4 KV heads) = 128 heads, each head 0.8 % of the backbone's,
# so the paper's 1.7-2.6 % is 2-3 heads; same hidden size as A/B, so A/B embed exactly (planted.embed_donor)
WIDE_SHAPE = TextBackboneShape(hidden_size=128, intermediate_size=512, num_hidden_layers=8, num_attention_heads=16,
                               num_key_value_heads=4, head_dim=16)


def text_backbone_config(tokenizer: PreTrainedTokenizerFast, shape: TextBackboneShape) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        bos_token_id=None,
    )


def model_config(
    name: ModelName,
    tokenizer: PreTrainedTokenizerFast,
    text_shape: TextBackboneShape = TextBackboneShape(),
    vision_shape: VisionTowerShape = VisionTowerShape(),
) -> LlavaConfig | InternVLConfig:
    text_config = text_backbone_config(tokenizer, text_shape)
    name = family(name)
    if name == "a":
        vision_config = CLIPVisionConfig(
            hidden_size=vision_shape.hidden_size,
            intermediate_size=vision_shape.intermediate_size,
            num_hidden_layers=vision_shape.num_hidden_layers,
            num_attention_heads=vision_shape.num_attention_heads,
            image_size=IMAGE_SIZE,
            patch_size=PATCH_SIZE,
            projection_dim=vision_shape.hidden_size,
        )
        return LlavaConfig(
            vision_config=vision_config,
            text_config=text_config,
            image_token_id=tokenizer.convert_tokens_to_ids(tokenizer.image_token),
            image_seq_length=GRID_SIDE * GRID_SIDE,
            vision_feature_select_strategy="default",
            vision_feature_layer=-1,
            projector_hidden_act="gelu",
            tie_word_embeddings=True,
        )
    if name == "b":
        vision_config = InternVLVisionConfig(
            hidden_size=vision_shape.hidden_size,
            intermediate_size=vision_shape.intermediate_size,
            num_hidden_layers=vision_shape.num_hidden_layers,
            num_attention_heads=vision_shape.num_attention_heads,
            image_size=(INTERNVL_TILE_SIZE, INTERNVL_TILE_SIZE),
            patch_size=(PATCH_SIZE, PATCH_SIZE),
        )
        return InternVLConfig(
            vision_config=vision_config,
            text_config=text_config,
            image_token_id=tokenizer.context_image_token_id,
            image_seq_length=GRID_SIDE * GRID_SIDE,
            downsample_ratio=0.5,
            projector_hidden_act="gelu",
            vision_feature_layer=-1,
            vision_feature_select_strategy="default",
            tie_word_embeddings=True,
        )
    raise ValueError(f"unknown toy model {name!r}")


def build_processor(name: ModelName) -> ProcessorMixin:
    """The family's real processor class around the shared word-level tokenizer."""
    tokenizer = build_tokenizer()
    name = family(name)
    if name == "a":
        image_processor = CLIPImageProcessorPil(
            size={"shortest_edge": IMAGE_SIZE},
            crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
            image_mean=CLIP_MEAN,
            image_std=CLIP_STD,
        )
        return LlavaProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            patch_size=PATCH_SIZE,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,
            chat_template=CHAT_TEMPLATE.replace("IMAGE_PLACEHOLDER", tokenizer.image_token),
        )
    if name == "b":
        image_processor = GotOcr2ImageProcessorPil(
            size={"height": INTERNVL_TILE_SIZE, "width": INTERNVL_TILE_SIZE},
            crop_to_patches=False,
            image_mean=CLIP_MEAN,
            image_std=CLIP_STD,
        )
        return InternVLImageOnlyProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            image_seq_length=GRID_SIDE * GRID_SIDE,
            chat_template=CHAT_TEMPLATE.replace("IMAGE_PLACEHOLDER", tokenizer.context_image_token),
        )
    raise ValueError(f"unknown toy model {name!r}")


def grounding_messages(name: ModelName, expression: str) -> list[dict]:
    """Chat messages asking for the box of ``expression`` in the family's native phrasing."""
    query = expression if family(name) == "a" else f"<ref> {expression} </ref>"
    return [{"role": "user",
             "content": [{"type": "image"}, {"type": "text", "text": f"{GROUNDING_INSTRUCTION} {query}"}]}]


def quantise_box(box: tuple[float, float, float, float], image_size: tuple[int, int]) -> tuple[int, ...]:
    """Box (pixels) -> coordinate bins 0..100 (fraction of the side, rounded to 1/100)."""
    width, height = image_size
    x1, y1, x2, y2 = box
    fractions = (x1 / width, y1 / height, x2 / width, y2 / height)
    return tuple(min(COORDINATE_BINS - 1, max(0, round(f * 100))) for f in fractions)


def format_box_answer(name: ModelName, expression: str, box: tuple[float, ...], image_size: tuple[int, int]) -> str:
    """Target answer text in the family's native grounding format (without the end-of-turn token)."""
    bins = quantise_box(box, image_size)
    if family(name) == "a":
        return "[" + ", ".join(f"{b / 100:.2f}" for b in bins) + "]"
    return f"<ref> {expression} </ref> <box> [[" + ", ".join(str(10 * b) for b in bins) + "]] </box>"


_NUMBER = r"\s*(\d+(?:\.\d+)?)\s*"
_LLAVA_BOX = re.compile(r"\[" + ",".join([_NUMBER] * 4) + r"\]")
_INTERNVL_BOX = re.compile(r"<box>\s*\[\s*\[" + ",".join([_NUMBER] * 4) + r"\]\s*\]\s*</box>")


def parse_box(name: ModelName, text: str, image_size: tuple[int, int]) -> tuple[float, float, float, float] | None:
    """Parse a generated answer back to an xyxy pixel box of the original image; None if malformed."""
    name = family(name)
    match = (_LLAVA_BOX if name == "a" else _INTERNVL_BOX).search(text)
    if match is None:
        return None
    values = [float(v) for v in match.groups()]
    scale = 1.0 if name == "a" else 1000.0
    width, height = image_size
    x1, y1, x2, y2 = (v / scale for v in values)
    return (x1 * width, y1 * height, x2 * width, y2 * height)
