"""Configurations of the two toy grounding VLMs and their family-native prompt/box formats.

Both models share ONE tiny Qwen2 language backbone architecture (the paper's same-backbone pairs):

* model ``a``: ``LlavaForConditionalGeneration`` (LLaVA-1.5 class): CLIP vision tower, CLS dropped
  (``vision_feature_select_strategy="default"``), 2-layer GELU MLP projector. 96x96 images, patch 8,
  so 12x12 = 144 visual tokens, row-major; token (r, c) covers pixels x in [8c, 8c+8), y in
  [8r, 8r+8) of the original 96x96 image (the processor's resize/crop are identities at 96 px).
  Native box format: ``[x1, y1, x2, y2]`` with floats in [0, 1] and 2 decimals.
* model ``b``: ``InternVLForConditionalGeneration``: InternViT-type tower (layer scale, mean-pool
  head unused), pixel-shuffle (downsample 0.5) + MLP projector. One 192x192 tile (the processor
  upsamples the 96 px image 2x; ``crop_to_patches`` is off so there is no thumbnail), patch 8 ->
  24x24 patches -> 12x12 = 144 visual tokens after pixel shuffle, row-major, each covering the same
  8x8 original pixels as model a's tokens. Native format:
  ``<ref>EXPR</ref><box>[[x1, y1, x2, y2]]</box>`` with integers 0..1000 quantised to multiples of 10.

Both formats therefore use 101 values per coordinate (v/100 of the image side), so one dense
vision-pretraining target (box bins) serves both towers, and quantisation error is <= 0.5 % of the
side (0.48 px at 96 px), far below what IoU >= 0.5 tolerates.

Head-level study: the language backbone has 4 layers x 8 query heads (head_dim 16, 4 KV heads):
32 heads, i.e. top-1..3 heads are ~3-10 % of all heads, close to the paper's top-20 of ~1,000.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    GotOcr2ImageProcessorPil,
    InternVLConfig,
    InternVLProcessor,
    InternVLVisionConfig,
    LlavaConfig,
    LlavaProcessor,
    PreTrainedTokenizerFast,
    ProcessorMixin,
    Qwen2Config,
)

from vrh_interp.data.scenes import IMAGE_SIZE
from vrh_interp.toy.tokenizer import IM_END, build_tokenizer

ModelName = Literal["a", "b", "planted", "c", "d"]
Family = Literal["a", "b"]
# each toy model's family: its model class, processor, prompt and native box format ("planted", the positive
# control of docs/results/planted.md, is a LLaVA-class model like "a" with a wider-headed backbone)
# "c" and "d" are the paper-regime pair (128-head backbone shared by a LLaVA-class and an InternVL-class model)
FAMILIES: dict[str, Family] = {"a": "a", "b": "b", "planted": "a", "c": "a", "d": "b"}


def family(name: str) -> Family:
    """The family (``"a"``: LLaVA class, ``"b"``: InternVL class) of toy model ``name``."""
    if name not in FAMILIES:
        raise ValueError(f"unknown toy model {name!r}; expected one of {sorted(FAMILIES)}")
    return FAMILIES[name]
PATCH_SIZE = 8
GRID_SIDE = IMAGE_SIZE // PATCH_SIZE  # 12 visual tokens per row for both models
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


class InternVLImageOnlyProcessor(InternVLProcessor):
    """``InternVLProcessor`` without a video processor (which would need torchvision).

    The processor reads its attribute list from the ``__init__`` signature, so dropping the
    ``video_processor`` argument here is enough; images are processed exactly as upstream.
    """

    def __init__(self, image_processor=None, tokenizer=None, image_seq_length: int = GRID_SIDE * GRID_SIDE,
                 chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, image_seq_length=image_seq_length,
                         chat_template=chat_template, **kwargs)


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
