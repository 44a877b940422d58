"""The built-in families, one declarative row each: the one list everything else reads.

A ``FamilyRow`` names the family (registry key, display name, the ``config.model_type`` values and the
transformers model classes it matches) and its adapter class (in ``vrh_interp/core/description/families/<key>.py``,
imported on use), says whether TransformerLens 4.3 has a bridge for its model class, and carries the hand-written facts
docs/families.md prints beside the adapter's own (layout summary, caveats) and the recipe of its tiny
random-weight model (``TinyRecipe``: data that ``vrh_interp.core.description.tiny.build_recipe`` turns into a model,
processor and tokenizer). The adapter lookup (``vrh_interp.core.description.families``), the adapters' names
(``FamilyAdapter`` subclasses declared with ``family=KEY``), ``tiny:FAMILY`` specs, the parametrised family tests,
``docs/families.md`` and the TransformerLens backend's ``SUPPORTED_FAMILIES`` all iterate ``FAMILIES``, the way
TransformerLens' ``SUPPORTED_ARCHITECTURES`` and pyvene's type maps are one table. Adding a family is its
adapter module plus one row here (docs/recipes/new-family.md).

This module is data only: it imports no adapter and nothing from transformers, so any layer may read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from PIL.Image import Resampling


@dataclass(frozen=True)
class Call:
    """``target(**kwargs)``; ``target`` is a transformers attribute name or ``".module:attribute"`` in
    ``vrh_interp.core.description.tiny`` (``vrh_interp.core.description.tiny.resolve``)."""

    target: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def call(target: str, **kwargs: Any) -> Call:
    return Call(target, kwargs)


@dataclass(frozen=True)
class TinyTokenizer:
    """A byte tokenizer (``vrh_interp.core.description.tiny.tokenizer.build_byte_tokenizer``) with the family's
    tokens."""

    special_tokens: tuple[str, ...]
    named: Mapping[str, str]  # standard roles (bos_token, eos_token, pad_token, ...) -> token
    extra: Mapping[str, str] = field(default_factory=dict)  # processor-read attributes (image_token, ...) -> token
    chat_template: str | None = None


@dataclass(frozen=True)
class TinyRecipe:
    """A tiny random-weight model of a family, as data (built by ``vrh_interp.core.description.tiny.build_recipe``).

    The real ``*ForConditionalGeneration`` class with a tiny config (LM: ``TINY_TEXT_CONFIG``), its real
    processor and a local byte tokenizer. Sub-configs given as a ``Call`` are built as config objects, as
    mappings they are passed as dicts. Token-valued config fields are written as token strings and turned
    into ids with the tokenizer.
    """

    model: str  # the transformers model class
    config: Call  # the composite config class and its own kwargs
    text_config: Call | Mapping[str, Any]
    vision_config: Call | Mapping[str, Any]
    tokenizer: TinyTokenizer
    image_processor: Call
    processor: Call  # built with image_processor=, tokenizer= and the tokenizer's chat_template
    vision_attention: str  # path of the vision tower's attention modules, "*" for every layer
    image_only_processor: bool = False  # the processor's __init__ also takes a torchvision video processor
    token_ids: Mapping[str, str] = field(default_factory=dict)  # config kwarg -> token
    # text-config token fields -> token(s); None: bos/eos/pad ids of the tokenizer's named roles
    text_token_ids: Mapping[str, str | tuple[str, ...]] | None = None
    set_vocab_size: bool = False  # composite configs that do not carry the text config's vocabulary size
    reinit: Mapping[str, float] = field(default_factory=dict)  # parameter path -> std of a fresh normal init


@dataclass(frozen=True)
class FamilyRow:
    """One built-in family."""

    name: str  # registry key: the adapter's ``name``, ``tiny:NAME``, the docs anchor
    display_name: str
    box_format: str  # one-line description of the native grounding format (the adapter's ``box_format``)
    model_types: tuple[str, ...]  # config.model_type values the adapter serves
    model_classes: tuple[str, ...]  # transformers model classes of those model types
    adapter: str  # the adapter class, in the module named after the key: vrh_interp/core/description/families/<name>.py
    transformer_lens: bool  # TransformerLens 4.3 has a bridge adapter for the model class
    layout: str  # one-line layout rule for docs/families.md
    caveats: tuple[str, ...]  # what a user must know, for docs/families.md
    tiny: TinyRecipe
    # tiny models with the language backbone of one of the paper's models (tests/families/test_paper_models.py)
    tiny_variants: Mapping[str, TinyRecipe] = field(default_factory=dict)


# ----------------------------------------------------------------------------------- shared tiny sizes

# The tiny language backbone every recipe uses (head_dim 16 where the config takes one: TINY_HEAD_DIM).
TINY_TEXT_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
}
TINY_HEAD_DIM = 16
TINY_HIDDEN = TINY_TEXT_CONFIG["hidden_size"]

# The tiny ViT encoder (CLIP, SigLIP, Pixtral, InternViT, Idefics3); image and patch sizes are per family.
TINY_VISION_CONFIG: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
}

# Standard special-token roles of the tokenizer families the recipes mimic.
LLAMA_NAMED_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}  # + Mistral
GEMMA_NAMED_TOKENS = {"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>"}
QWEN2_NAMED_TOKENS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}  # Qwen-VL, OneVision, InternVL3
# Qwen configs use <|endoftext|> as bos and pad.
QWEN_TEXT_TOKEN_IDS = {"bos_token_id": "<|endoftext|>", "eos_token_id": "<|im_end|>", "pad_token_id": "<|endoftext|>"}

CLIP_ATTENTION = "model.vision_tower.encoder.layers.*.self_attn"  # CLIP and SigLIP towers
MERGER_ATTENTION = "model.visual.blocks.*.attn"  # Qwen-VL and GLM-4V towers


def mrope_parameters(mrope_section: list[int], **extra: Any) -> dict[str, Any]:
    """Default RoPE with multimodal sections (``mrope_section`` sums to the rotary dims / 2)."""
    return {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope_section, **extra}


def merger_vision_config(patch_size: int, **extra: Any) -> dict[str, Any]:
    """The tiny vision tower of Qwen2.5-VL, Qwen3-VL and GLM-4V (merge 2, two frames), projecting to the tiny LM."""
    return {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": TINY_HIDDEN,
            "patch_size": patch_size, "spatial_merge_size": 2, "temporal_patch_size": 2, **extra}


# ----------------------------------------------------------------------------------- Qwen-VL

# Same strings in Qwen2-VL, Qwen2.5-VL and Qwen3-VL.
QWEN_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
)
# The chat template shipped with Qwen/Qwen2-VL-7B-Instruct (default system turn).
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
# The Qwen3-VL-Instruct template reduced to text and image turns (no default system turn).
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
# Pixel budget of the tiny Qwen processors (real resize policy, small budget): at most 48 merged tokens.
QWEN_MIN_PIXELS = 56 * 56
QWEN2_VL_MAX_PIXELS = 28 * 28 * 48  # 28 x 28 pixel tokens (patch 14, merge 2)
QWEN3_VL_MAX_PIXELS = 32 * 32 * 48  # 32 x 32 pixel tokens (patch 16, merge 2)
QWEN_TOKEN_IDS = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
                  "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"}


def qwen_recipe(version: str, text: Mapping[str, Any], vision: Mapping[str, Any], image_processor: Call,
                chat_template: str) -> TinyRecipe:
    """Qwen2-VL, Qwen2.5-VL and Qwen3-VL: same tokens, image processor class and config token fields.

    ``rope_parameters["mrope_section"]`` must sum to head_dim / 2 (the default ``[16, 24, 24]`` is for head_dim
    128); the processor returns ``mm_token_type_ids``, which the model needs with ``pixel_values``.
    """
    return TinyRecipe(
        model=f"{version}ForConditionalGeneration", config=call(f"{version}Config"),
        text_config={**TINY_TEXT_CONFIG, **text}, vision_config=vision, text_token_ids=QWEN_TEXT_TOKEN_IDS,
        tokenizer=TinyTokenizer(QWEN_TOKENS, QWEN2_NAMED_TOKENS, chat_template=chat_template,
                                extra={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>"}),
        image_processor=image_processor, processor=call(f"{version}Processor"), image_only_processor=True,
        token_ids=QWEN_TOKEN_IDS, vision_attention=MERGER_ATTENTION,
    )


QWEN_IMAGE_PROCESSOR = call("Qwen2VLImageProcessorPil", min_pixels=QWEN_MIN_PIXELS, max_pixels=QWEN2_VL_MAX_PIXELS)

QWEN2_VL = FamilyRow(
    name="qwen2_vl", display_name="Qwen2-VL",
    box_format='<|box_start|>(x1,y1),(x2,y2)<|box_end|>, integers 0-1000 relative to the image',
    model_types=("qwen2_vl",),
    model_classes=("Qwen2VLForConditionalGeneration",), adapter="Qwen2VLAdapter",
    transformer_lens=False,
    layout="whole image stretched (`smart_resize`, axes independent, no crop or pad) to multiples of 28 "
           "(patch 14 x merge 2); one row-major grid of merged tokens, shape read from `image_grid_thw`",
    caveats=("The attention module uses `hidden_size // num_attention_heads` whatever the config says; the "
             "geometry follows the module.",),
    tiny=qwen_recipe(
        "Qwen2VL", {"rope_parameters": mrope_parameters([2, 3, 3])},
        {"depth": 2, "embed_dim": 32, "hidden_size": TINY_HIDDEN, "mlp_ratio": 2, "num_heads": 2, "patch_size": 14,
         "spatial_merge_size": 2, "temporal_patch_size": 2},
        QWEN_IMAGE_PROCESSOR, QWEN2_VL_CHAT_TEMPLATE),
)

QWEN2_5_VL = FamilyRow(
    name="qwen2_5_vl", display_name="Qwen2.5-VL",
    box_format=('JSON [{"bbox_2d": [x1, y1, x2, y2], "label": ...}], integer pixels of the RESIZED input '
                '(image_grid_thw[1:] * patch)'),
    model_types=("qwen2_5_vl",),
    model_classes=("Qwen2_5_VLForConditionalGeneration",),
    adapter="Qwen25VLAdapter", transformer_lens=True,
    layout="as Qwen2-VL",
    caveats=("Boxes are absolute pixels of the RESIZED input, not 0-1000: `box_frame` needs the encoding "
             "(`image_grid_thw`). Tools that guess the frame from value ranges misread them.",),
    # windowed vision attention (window_size pixels; full attention in fullatt_block_indexes)
    tiny=qwen_recipe(
        "Qwen2_5_VL", {"rope_parameters": mrope_parameters([2, 3, 3])},
        merger_vision_config(14, window_size=56, fullatt_block_indexes=[1]),
        QWEN_IMAGE_PROCESSOR, QWEN2_VL_CHAT_TEMPLATE),
)

QWEN3_VL = FamilyRow(
    name="qwen3_vl", display_name="Qwen3-VL",
    box_format='JSON [{"bbox_2d": [x1, y1, x2, y2], "label": ...}], integers 0-1000 relative to the image',
    model_types=("qwen3_vl",),
    model_classes=("Qwen3VLForConditionalGeneration",), adapter="Qwen3VLAdapter",
    transformer_lens=True,
    layout="as Qwen2-VL with factor 32 (patch 16 x merge 2)",
    caveats=("DeepStack adds vision features to the image positions after the first LM layers, outside the "
             "layer modules.", "The attention module reads `config.head_dim` (unlike Qwen2/2.5-VL)."),
    # learned position embeddings (a square count) and DeepStack features from deepstack_visual_indexes
    tiny=qwen_recipe(
        "Qwen3VL", {"head_dim": TINY_HEAD_DIM, "rope_parameters": mrope_parameters([2, 3, 3], mrope_interleaved=True)},
        merger_vision_config(16, num_position_embeddings=64, deepstack_visual_indexes=[0]),
        call("Qwen2VLImageProcessorPil", patch_size=16, min_pixels=QWEN_MIN_PIXELS, max_pixels=QWEN3_VL_MAX_PIXELS,
             image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5]),
        QWEN3_VL_CHAT_TEMPLATE),
)

# ----------------------------------------------------------------------------------- InternVL

# Tiles of 64 px (patch 8 -> 8 x 8 patches -> 4 x 4 = 16 tokens after the 0.5 pixel shuffle), at most 6 tiles
# plus the thumbnail. ChatML layout of the -hf InternVL3 checkpoints, <IMG_CONTEXT> as the placeholder.
INTERNVL_IMAGE_TOKENS = {"start_image_token": "<img>", "end_image_token": "</img>",
                         "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"}
INTERNVL_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
INTERNVL_TINY = TinyRecipe(
    model="InternVLForConditionalGeneration",
    config=call("InternVLConfig", image_seq_length=16, downsample_ratio=0.5),
    text_config=call("Qwen2Config", **TINY_TEXT_CONFIG, head_dim=TINY_HEAD_DIM),
    vision_config=call("InternVLVisionConfig", **TINY_VISION_CONFIG, image_size=(64, 64), patch_size=(8, 8)),
    tokenizer=TinyTokenizer(
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>", *INTERNVL_IMAGE_TOKENS.values(), "<ref>", "</ref>", "<box>",
         "</box>"), QWEN2_NAMED_TOKENS, INTERNVL_IMAGE_TOKENS, INTERNVL_CHAT_TEMPLATE),
    image_processor=call("GotOcr2ImageProcessorPil", size={"height": 64, "width": 64}, crop_to_patches=True,
                         min_patches=1, max_patches=6),
    processor=call("InternVLProcessor", image_seq_length=16), image_only_processor=True,
    token_ids={"image_token_id": "<IMG_CONTEXT>"}, set_vocab_size=True,
    vision_attention="model.vision_tower.encoder.layer.*.attention",
)

INTERNVL = FamilyRow(
    name="internvl", display_name="InternVL (HF-native)",
    box_format='<ref>EXPR</ref><box>[[x1, y1, x2, y2]]</box>, integers 0-1000 of the original image',
    model_types=("internvl",),
    model_classes=("InternVLForConditionalGeneration",), adapter="InternVLAdapter",
    transformer_lens=False,
    layout="closest-aspect cols x rows tiles (within `min_patches`..`max_patches`), image stretched to "
           "(cols T, rows T), tiles row-major, whole-image thumbnail LAST when there is more than one tile; "
           "G x G pixel-shuffled tokens per tile (448 px -> 16 x 16)",
    caveats=("HF-native `-hf` checkpoints only (`trust_remote_code` stays off).",
             "Only `<IMG_CONTEXT>` positions are visual; `<img>`/`</img>` are text.",
             "A call-time override of `min_patches`/`max_patches` raises instead of giving wrong tokens."),
    tiny=INTERNVL_TINY,
    # InternVL3.5's language backbone, Qwen3 (per-head RMSNorm of queries and keys before rotary)
    tiny_variants={"internvl_qwen3": replace(
        INTERNVL_TINY, text_config=call("Qwen3Config", **TINY_TEXT_CONFIG, head_dim=TINY_HEAD_DIM))},
)

# ----------------------------------------------------------------------------------- LLaVA

# Llama's specials and LLaVA's <image> placeholder; CLIP tower and Llama backbone.
LLAVA_TOKENIZER = TinyTokenizer(("<s>", "</s>", "<unk>", "<pad>", "<image>"), LLAMA_NAMED_TOKENS,
                                {"image_token": "<image>"})
TINY_LLAMA_CONFIG: dict[str, Any] = {"model_type": "llama", **TINY_TEXT_CONFIG, "head_dim": TINY_HEAD_DIM}
TINY_CLIP_VISION_CONFIG: dict[str, Any] = {
    "model_type": "clip_vision_model", **TINY_VISION_CONFIG, "projection_dim": 32
}
# llava-hf/llava-1.5-7b-hf (USER: <image>\n... ASSISTANT:)
LLAVA_15_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}{% endif %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' ' }}"
    "{% endfor %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)
LLAVA_CLIP = {"vision_feature_select_strategy": "default", "vision_feature_layer": -2}

# 44 px processed images, patch 8: the conv sees 5 x 5 patches over 40 x 40 pixels (the last 4 rows and columns
# reach no token: the remainder rule the real 336 / 14 grid never hits). The crop configuration of the llava-hf
# checkpoints (do_pad=True gives the original LLaVA-1.5 pad configuration); NEAREST resampling.
LLAVA_TINY = TinyRecipe(
    model="LlavaForConditionalGeneration", config=call("LlavaConfig", image_seq_length=25, **LLAVA_CLIP),
    text_config=TINY_LLAMA_CONFIG, vision_config={**TINY_CLIP_VISION_CONFIG, "image_size": 44, "patch_size": 8},
    tokenizer=replace(LLAVA_TOKENIZER, chat_template=LLAVA_15_CHAT_TEMPLATE),
    image_processor=call("LlavaImageProcessorPil", size={"shortest_edge": 44},
                         crop_size={"height": 44, "width": 44}, do_center_crop=True, do_pad=False,
                         resample=Resampling.NEAREST),
    processor=call("LlavaProcessor", patch_size=8, vision_feature_select_strategy="default",
                   num_additional_image_tokens=1),
    token_ids={"image_token_index": "<image>"}, vision_attention=CLIP_ATTENTION,
)

LLAVA = FamilyRow(
    name="llava", display_name="LLaVA-1.5",
    box_format='[x1, y1, x2, y2], floats 0-1 (2 decimals) relative to the square the model sees',
    model_types=("llava",), model_classes=("LlavaForConditionalGeneration",),
    adapter="LlavaAdapter", transformer_lens=True,
    layout="one row-major (S/14)^2 grid over the processed view: pad-to-square (pad mode) or shortest-edge "
           "resize + centre crop (crop mode, the llava-hf processors), read from the processor's settings",
    caveats=("Crop mode: parts of a non-square image outside the central square reach no token, so a box "
             "there selects nothing (the sample is skipped by scoring).",
             "LLaVA issue threads (#606, #623, #822) report mixed box frames in the training data (padded "
             "square for Visual Genome, unpadded image for RefCOCO)."),
    tiny=LLAVA_TINY,
)

# Tiles of 32 px, patch 8 (4 x 4 tokens per tile, gap-free like the real 336 / 14); pinpoints scaled from
# llava-v1.6 (1x2, 2x1, 2x2, 3x1, 1x3 tiles); NEAREST resampling.
LLAVA_NEXT_PINPOINTS: list[list[int]] = [
    [32 * rows, 32 * cols] for rows, cols in ((1, 2), (2, 1), (2, 2), (3, 1), (1, 3))
]
# llava-hf/llava-v1.6-mistral-7b-hf ([INST] <image>\n... [/INST])
LLAVA_NEXT_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' }}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{{ ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'][0]['text'] + '</s>' }}"
    "{% endif %}{% endfor %}"
)
# llava-hf/llama3-llava-next-8b-hf's format
LLAMA3_LLAVA_NEXT_CHAT_TEMPLATE = (
    "<|begin_of_text|>{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
LLAVA_NEXT_TINY = TinyRecipe(
    model="LlavaNextForConditionalGeneration",
    config=call("LlavaNextConfig", image_grid_pinpoints=LLAVA_NEXT_PINPOINTS, image_seq_length=16, **LLAVA_CLIP),
    text_config=TINY_LLAMA_CONFIG, vision_config={**TINY_CLIP_VISION_CONFIG, "image_size": 32, "patch_size": 8},
    tokenizer=replace(LLAVA_TOKENIZER, chat_template=LLAVA_NEXT_CHAT_TEMPLATE),
    image_processor=call("LlavaNextImageProcessorPil", size={"shortest_edge": 32},
                         crop_size={"height": 32, "width": 32},
                         image_grid_pinpoints=LLAVA_NEXT_PINPOINTS, resample=Resampling.NEAREST),
    processor=call("LlavaNextProcessor", patch_size=8, vision_feature_select_strategy="default",
                   num_additional_image_tokens=1),
    token_ids={"image_token_index": "<image>"}, vision_attention=CLIP_ATTENTION,
)

LLAVA_NEXT = FamilyRow(
    name="llava_next", display_name="LLaVA-NeXT",
    box_format='[x1, y1, x2, y2], floats 0-1 (2 decimals) relative to the image',
    model_types=("llava_next",),
    model_classes=("LlavaNextForConditionalGeneration",), adapter="LlavaNextAdapter",
    transformer_lens=True,
    layout="base view (whole image stretched to the tile size) FIRST, then best-resolution tiles "
           "(aspect-fit, centred pad) reassembled into one grid, padded rows/cols removed on the token "
           "grid, one newline token after each row; one block per tile",
    caveats=("Newline tokens are visual positions but cover no pixels.",),
    tiny=LLAVA_NEXT_TINY,
    # LLaVA-NeXT-Llama3-8B's language model: Llama 3 (GQA with four query heads per KV head as in 32 / 8,
    # rope_theta 500000) and its header tokens
    tiny_variants={"llava_next_llama3": replace(
        LLAVA_NEXT_TINY,
        text_config={**TINY_LLAMA_CONFIG, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 8,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
        tokenizer=TinyTokenizer(
            ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
             "<pad>", "<image>"),
            {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": "<pad>"},
            {"image_token": "<image>"}, LLAMA3_LLAVA_NEXT_CHAT_TEMPLATE))},
)

# Tiles of 36 px, patch 8: each tile's 4 x 4 tokens cover its first 32 x 32 pixels and leave a 4-pixel gap, like
# the released 384 / 14 checkpoints; pinpoints are all 1..6 x 1..6 tile grids as released, so images above ~9
# tiles are downsampled (anyres_max_9). SigLIP has no CLS token ("full"). NEAREST resampling.
ONEVISION_PINPOINTS: list[list[int]] = [[36 * rows, 36 * cols] for rows in range(1, 7) for cols in range(1, 7)]
# llava-hf/llava-onevision-qwen2-0.5b-ov-hf
LLAVA_ONEVISION_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + ' ' }}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ '\n' + content['text'] }}"
    "{% endfor %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

ONEVISION_TINY = TinyRecipe(
    model="LlavaOnevisionForConditionalGeneration",
    config=call("LlavaOnevisionConfig", image_grid_pinpoints=ONEVISION_PINPOINTS,
                vision_feature_select_strategy="full", vision_feature_layer=-1, vision_aspect_ratio="anyres_max_9"),
    text_config={"model_type": "qwen2", **TINY_TEXT_CONFIG, "head_dim": TINY_HEAD_DIM},
    text_token_ids=QWEN_TEXT_TOKEN_IDS,
    vision_config={"model_type": "siglip_vision_model", **TINY_VISION_CONFIG, "image_size": 36, "patch_size": 8,
                   "vision_use_head": False},
    tokenizer=TinyTokenizer(("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"),
                            QWEN2_NAMED_TOKENS, {"image_token": "<image>", "video_token": "<video>"},
                            LLAVA_ONEVISION_CHAT_TEMPLATE),
    image_processor=call("LlavaOnevisionImageProcessorPil", size={"height": 36, "width": 36},
                         image_grid_pinpoints=ONEVISION_PINPOINTS, resample=Resampling.NEAREST),
    processor=call("LlavaOnevisionProcessor", num_image_tokens=16, vision_feature_select_strategy="full",
                   vision_aspect_ratio="anyres_max_9"), image_only_processor=True,
    token_ids={"image_token_index": "<image>", "video_token_index": "<video>"}, vision_attention=CLIP_ATTENTION,
)

LLAVA_ONEVISION = FamilyRow(
    name="llava_onevision", display_name="LLaVA-OneVision",
    box_format='[x1, y1, x2, y2], floats 0-1 (2 decimals) relative to the image',
    model_types=("llava_onevision",),
    model_classes=("LlavaOnevisionForConditionalGeneration",),
    adapter="LlavaOnevisionAdapter", transformer_lens=True,
    layout="LLaVA-NeXT's rule, plus bilinear downsampling of large grids (a downsampled token "
           "covers its source tokens' pixels)",
    caveats=("SigLIP 384 / 14 leaves 6-pixel gaps per tile; downsampled tokens' rectangles overlap.",),
    tiny=ONEVISION_TINY,
)

# ----------------------------------------------------------------------------------- Gemma

# Images stretched to 56 x 56 (SigLIP patch 7 -> 8 x 8 = 64 tokens). The processor adds <loc....> and <seg...>
# tokens to the tokenizer, so the vocabulary is sized after it is built. No chat template: prompts are prefixes.
PALIGEMMA_TINY = TinyRecipe(
    model="PaliGemmaForConditionalGeneration",
    config=call("PaliGemmaConfig", projection_dim=TINY_HIDDEN, hidden_size=TINY_HIDDEN),
    text_config=call("GemmaConfig", **TINY_TEXT_CONFIG, head_dim=TINY_HEAD_DIM),
    vision_config=call("SiglipVisionConfig", **TINY_VISION_CONFIG, image_size=56, patch_size=7),
    tokenizer=TinyTokenizer(("<pad>", "<eos>", "<bos>", "<image>"), GEMMA_NAMED_TOKENS, {"image_token": "<image>"}),
    image_processor=call("SiglipImageProcessorPil", size={"height": 56, "width": 56}, image_seq_length=64),
    processor=call("PaliGemmaProcessor"), token_ids={"image_token_index": "<image>"}, set_vocab_size=True,
    vision_attention=CLIP_ATTENTION,
)

PALIGEMMA = FamilyRow(
    name="paligemma", display_name="PaliGemma",
    box_format='<locY1><locX1><locY2><locX2> label, 1024 bins (0-1023) of the original image, y first',
    model_types=("paligemma",),
    model_classes=("PaliGemmaForConditionalGeneration",), adapter="PaliGemmaAdapter",
    transformer_lens=False,
    layout="image stretched to S x S, (S/14)^2 tokens row-major, FIRST in the sequence",
    caveats=("No chat template: the prompt is `<image>detect EXPR` (the model card's detection prefix).",
             "Attention is non-causal over the whole prefix (image, `<bos>`, prompt).",
             "PaliGemma 2 (Gemma 2) interleaves sliding-window layers and soft-caps logits (the readout applies "
             "both; Gemma 2 runs eager attention, sdpa cannot soft-cap): during generation a readout of a "
             "sliding layer raises `ReadoutUnavailableError` once prompt + answer fill the window.",
             "The processor's `labels` output is dropped by `encode`."),
    tiny=PALIGEMMA_TINY,
    # PaliGemma 2: Gemma 2's attention extras at tiny scale (PaliGemma2-10B: soft-cap 50.0, window 4096,
    # query_pre_attn_scalar 256 = head_dim), chosen so each matters on random weights: wider initial weights
    # (0.2) give attention logits of order one, which the cap (1.0) bends; the window (8) is shorter than an answer
    tiny_variants={"paligemma2": replace(
        PALIGEMMA_TINY,
        text_config=call("Gemma2Config", **TINY_TEXT_CONFIG, head_dim=TINY_HEAD_DIM, attn_logit_softcapping=1.0,
                         sliding_window=8, query_pre_attn_scalar=4, initializer_range=0.2))},
)

# Images stretched to 64 x 64 (SigLIP patch 8 -> 8 x 8), average-pooled 2 x 2 to 16 tokens. A sliding-window layer
# then a global one, the window (4096) longer than any test prompt. Gemma3 zero-initialises
# mm_input_projection_weight (a fresh model would ignore the image): it is re-initialised.
GEMMA3_IMAGE_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                       "image_token": "<image_soft_token>"}
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)

GEMMA3_TINY = TinyRecipe(
    model="Gemma3ForConditionalGeneration", config=call("Gemma3Config", mm_tokens_per_image=16),
    text_config=call("Gemma3TextConfig", **TINY_TEXT_CONFIG, head_dim=TINY_HEAD_DIM,
                     query_pre_attn_scalar=TINY_HEAD_DIM, sliding_window=4096,
                     layer_types=["sliding_attention", "full_attention"]),
    vision_config=call("SiglipVisionConfig", **TINY_VISION_CONFIG, image_size=64, patch_size=8,
                       vision_use_head=False),
    tokenizer=TinyTokenizer(("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>",
                             *GEMMA3_IMAGE_TOKENS.values()), GEMMA_NAMED_TOKENS, GEMMA3_IMAGE_TOKENS,
                            GEMMA3_CHAT_TEMPLATE),
    image_processor=call("Gemma3ImageProcessorPil", size={"height": 64, "width": 64}, image_mean=(0.5, 0.5, 0.5),
                         image_std=(0.5, 0.5, 0.5)),
    processor=call("Gemma3Processor", image_seq_length=16),
    token_ids={"boi_token_index": "<start_of_image>", "eoi_token_index": "<end_of_image>",
               "image_token_index": "<image_soft_token>"},
    set_vocab_size=True, reinit={"model.multi_modal_projector.mm_input_projection_weight": 0.1},
    vision_attention=CLIP_ATTENTION,
)

GEMMA3 = FamilyRow(
    name="gemma3", display_name="Gemma 3",
    box_format=('{"box_2d": [y_min, x_min, y_max, x_max]}, integers 0-1000 of the original image (Gemini '
                'convention, not a trained Gemma 3 format)'),
    model_types=("gemma3",), model_classes=("Gemma3ForConditionalGeneration",),
    adapter="Gemma3Adapter", transformer_lens=True,
    layout="image stretched to S x S, patches average-pooled to a 16 x 16 row-major grid; with pan & scan "
           "(opt-in) one more block per crop",
    caveats=("No documented grounding format: the Gemini convention is requested (not a trained format).",
             "Sliding-window layers (5:1 in released checkpoints): the region readout during generation "
             "raises `ReadoutUnavailableError` for prompts longer than the window; the window also bounds the "
             "bidirectional image block.",
             "Scores are scaled by `query_pre_attn_scalar**-0.5` (handled: the readout reads the real scaling)."),
    tiny=GEMMA3_TINY,
)

# ----------------------------------------------------------------------------------- Idefics3 / SmolVLM

# Frames of 32 px (patch 4 -> 8 x 8 patches -> 4 x 4 = 16 tokens after the scale-2 pixel shuffle), longest edge
# resized to 96 px: at most 3 x 3 tiles plus the global image. The Idefics3 chat template.
IDEFICS3_CHAT_TEMPLATE = (
    "<|begin_of_text|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}{{ ': ' + message['content'] }}"
    "{% else %}{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
IDEFICS3_TINY = TinyRecipe(
    model="Idefics3ForConditionalGeneration", config=call("Idefics3Config", scale_factor=2),
    text_config=call("LlamaConfig", **TINY_TEXT_CONFIG, head_dim=TINY_HEAD_DIM),
    vision_config=call("Idefics3VisionConfig", **TINY_VISION_CONFIG, image_size=32, patch_size=4),
    tokenizer=TinyTokenizer(
        ("<|end_of_text|>", "<|begin_of_text|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>",
         "<global-img>", *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))),
        {"pad_token": "<|end_of_text|>", "bos_token": "<|begin_of_text|>", "eos_token": "<end_of_utterance>"},
        chat_template=IDEFICS3_CHAT_TEMPLATE),
    image_processor=call("Idefics3ImageProcessorPil", size={"longest_edge": 96}, max_image_size={"longest_edge": 32},
                         image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5)),
    processor=call("Idefics3Processor", image_seq_len=16), token_ids={"image_token_id": "<image>"},
    set_vocab_size=True, vision_attention="model.vision_model.encoder.layers.*.self_attn",
)

IDEFICS3 = FamilyRow(
    name="idefics3", display_name="Idefics3 / SmolVLM",
    box_format='[x1, y1, x2, y2], floats 0-1 (2 decimals) relative to the image (requested, not trained)',
    model_types=("idefics3", "smolvlm"),
    model_classes=("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration"),
    adapter="Idefics3Adapter", transformer_lens=True,
    layout="longest edge resized to L, each side stretched up to a multiple of M, M x M tiles row-major, "
           "global image LAST; g x g pixel-shuffled tokens per frame",
    caveats=("Released checkpoints were not trained to ground: the requested format is not a trained one.",
             "The backbone lives at `model.text_model`, not `model.language_model`."),
    tiny=IDEFICS3_TINY,
)

# ----------------------------------------------------------------------------------- GLM-4V

GLM4V_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>",
    "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|image|>",
    "<|video|>", "<|begin_of_box|>", "<|end_of_box|>", "<think>", "</think>",
)
# GLM-4.1V's template reduced to text and image turns ([gMASK]<sop>, <|user|>, <|assistant|>)
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
GLM4V_MIN_PIXELS = 2 * 56 * 56
GLM4V_MAX_PIXELS = 2 * 28 * 28 * 48
GLM4V_TEXT_TOKEN_IDS = {"eos_token_id": ("<|endoftext|>", "<|user|>", "<|observation|>"),
                        "pad_token_id": "<|endoftext|>"}
# head_dim = hidden // heads with a partial rotary embedding: mrope_section sums to head_dim * 0.5 / 2
GLM4V_TINY = TinyRecipe(
    model="Glm4vForConditionalGeneration", config=call("Glm4vConfig"),
    text_config={**TINY_TEXT_CONFIG, "rope_parameters": mrope_parameters([2, 1, 1], partial_rotary_factor=0.5)},
    text_token_ids=GLM4V_TEXT_TOKEN_IDS,
    vision_config=merger_vision_config(14, image_size=112),
    tokenizer=TinyTokenizer(GLM4V_TOKENS, {"eos_token": "<|user|>", "pad_token": "<|endoftext|>"},
                            {"image_token": "<|image|>", "video_token": "<|video|>"}, GLM4V_CHAT_TEMPLATE),
    image_processor=call("Glm4vImageProcessorPil", size={"shortest_edge": GLM4V_MIN_PIXELS,
                                                         "longest_edge": GLM4V_MAX_PIXELS}),
    processor=call("Glm4vProcessor"), image_only_processor=True,
    token_ids={"image_token_id": "<|image|>", "video_token_id": "<|video|>",
               "image_start_token_id": "<|begin_of_image|>", "image_end_token_id": "<|end_of_image|>",
               "video_start_token_id": "<|begin_of_video|>", "video_end_token_id": "<|end_of_video|>"},
    vision_attention=MERGER_ATTENTION,
)

GLM4V = FamilyRow(
    name="glm4v", display_name="GLM-4V (GLM-4.1V)",
    box_format='<|begin_of_box|>[x1,y1,x2,y2]<|end_of_box|>, integers 0-1000 relative to the image',
    # glm46v: transformers' GLM-4.6V classes (a Glm4v subclass with the same processor, layout and text attention)
    model_types=("glm4v", "glm46v"),
    model_classes=("Glm4vForConditionalGeneration", "Glm46VForConditionalGeneration"),
    adapter="Glm4vAdapter", transformer_lens=True,
    layout="as Qwen2-VL (GLM's `smart_resize` to multiples of 28, 2 x 2 downsampling, row-major)",
    caveats=("Thinking checkpoints: the box is read after the last `</think>`; the bracket style may vary.",),
    tiny=GLM4V_TINY,
    # GLM-4.6V-Flash through the glm46v classes: one KV head per group of query heads (32 / 2 real, 4 / 1 here),
    # rope_theta 500000; the hub checkpoint itself declares model_type glm4v
    tiny_variants={"glm46v": replace(
        GLM4V_TINY, model="Glm46VForConditionalGeneration", config=call("Glm46VConfig"),
        processor=call("Glm46VProcessor"),
        text_config={**TINY_TEXT_CONFIG, "num_attention_heads": 4, "num_key_value_heads": 1, "model_type": "glm4v_text",
                     "rope_parameters": mrope_parameters([2, 1, 1], partial_rotary_factor=0.5, rope_theta=500000.0)})},
)

# ----------------------------------------------------------------------------------- Mistral3

# Patch 8, spatial merge 2 (16-pixel tokens), longest edge 64; NEAREST resampling. The template follows
# mistralai/Mistral-Small-3.1-24B-Instruct-2503 ([INST]...[/INST], images inline as [IMG]) without its default
# system prompt.
MISTRAL3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}[SYSTEM_PROMPT]{{ message['content'] }}[/SYSTEM_PROMPT]"
    "{% elif message['role'] == 'user' %}[INST]{% for content in message['content'] %}"
    "{% if content['type'] == 'text' %}{{ content['text'] }}{% elif content['type'] == 'image' %}[IMG]{% endif %}"
    "{% endfor %}[/INST]{% elif message['role'] == 'assistant' %}{{ message['content'][0]['text'] }}{{ eos_token }}"
    "{% endif %}{% endfor %}"
)

MISTRAL3_TINY = TinyRecipe(
    model="Mistral3ForConditionalGeneration",
    config=call("Mistral3Config", spatial_merge_size=2, vision_feature_layer=-1),
    text_config={"model_type": "mistral", **TINY_TEXT_CONFIG, "head_dim": TINY_HEAD_DIM, "sliding_window": None},
    vision_config={"model_type": "pixtral", **TINY_VISION_CONFIG, "image_size": 64, "patch_size": 8},
    tokenizer=TinyTokenizer(("<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]",
                             "[IMG_END]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"), LLAMA_NAMED_TOKENS,
                            chat_template=MISTRAL3_CHAT_TEMPLATE),
    image_processor=call("PixtralImageProcessorPil", patch_size={"height": 8, "width": 8},
                         size={"longest_edge": 64}, resample=Resampling.NEAREST),
    # PixtralProcessor imports torchvision at module level: a port of it (vrh_interp.core.description.tiny.pixtral)
    processor=call(".pixtral:PixtralProcessorPort", patch_size=8, spatial_merge_size=2),
    token_ids={"image_token_index": "[IMG]"},
    vision_attention="model.vision_tower.transformer.layers.*.attention",
)

MISTRAL3 = FamilyRow(
    name="mistral3", display_name="Mistral3 (Mistral-Small-3.1)",
    box_format='[x1, y1, x2, y2], floats 0-1 (2 decimals) relative to the image (requested)',
    model_types=("mistral3",),
    model_classes=("Mistral3ForConditionalGeneration",), adapter="Mistral3Adapter",
    transformer_lens=True,
    layout="downscaled to fit `longest_edge`, each side rounded up to a multiple of 28, rows x cols "
           "row-major; `[IMG_BREAK]` / `[IMG_END]` are visual positions in no block",
    caveats=("Mistral documents no grounding format: the LLaVA-style format is requested.",),
    tiny=MISTRAL3_TINY,
)

# ----------------------------------------------------------------------------------- Aya Vision

# Tiles of 56 px (SigLIP patch 7 -> 8 x 8 patches -> 4 x 4 tokens after the downsample-2 pixel shuffle), at most
# 6 tiles plus the global thumbnail; the processor's patch_size 14 (7 x 2) and img_size 56 give the same 16
# <|IMG_PATCH|> tokens per tile. Cohere's turn tokens, <image> expanded by the processor. The Cohere2 LM has a
# sliding-window layer (RoPE) then a full-attention one (no position encoding); the window is longer than any prompt.
AYA_VISION_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|START_OF_TURN_TOKEN|>"
    "{% if message['role'] == 'user' %}<|USER_TOKEN|>{% else %}<|CHATBOT_TOKEN|>{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<image>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|END_OF_TURN_TOKEN|>{% endfor %}"
    "{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}"
)

AYA_VISION_TINY = TinyRecipe(
    model="AyaVisionForConditionalGeneration", config=call("AyaVisionConfig", downsample_factor=2),
    text_config=call("Cohere2Config", **TINY_TEXT_CONFIG, sliding_window=4096,
                     layer_types=["sliding_attention", "full_attention"]),
    vision_config=call("SiglipVisionConfig", **TINY_VISION_CONFIG, image_size=56, patch_size=7,
                       vision_use_head=False),
    tokenizer=TinyTokenizer(
        ("<PAD>", "<BOS_TOKEN>", "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>",
         "<|CHATBOT_TOKEN|>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>", "<|IMG_LINE_BREAK|>", "TILE",
         "TILE_GLOBAL"),
        {"pad_token": "<PAD>", "bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>"},
        chat_template=AYA_VISION_CHAT_TEMPLATE),
    image_processor=call("GotOcr2ImageProcessorPil", size={"height": 56, "width": 56}, crop_to_patches=True,
                         min_patches=1, max_patches=6, image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5)),
    processor=call("AyaVisionProcessor", patch_size=14, img_size=56),
    token_ids={"image_token_index": "<|IMG_PATCH|>"}, set_vocab_size=True, vision_attention=CLIP_ATTENTION,
)

AYA_VISION = FamilyRow(
    name="aya_vision", display_name="Aya Vision",
    box_format='[x1, y1, x2, y2], floats 0-1 (2 decimals) relative to the image (requested, not trained)',
    model_types=("aya_vision",),
    model_classes=("AyaVisionForConditionalGeneration",), adapter="AyaVisionAdapter",
    transformer_lens=False,
    layout="InternVL's tiling rule (GOT-OCR2 processor), 364 px tiles, 13 x 13 tokens per tile, thumbnail LAST",
    caveats=("No documented grounding format: the requested one is not trained.",
             "Cohere2 interleaves sliding-window layers (RoPE) with full-attention layers (no position "
             "encoding): generation-time region readout is limited by the window."),
    tiny=AYA_VISION_TINY,
)

# ----------------------------------------------------------------------------------- the registry

# In the order `vrh families` and docs/families.md list them.
FAMILIES: tuple[FamilyRow, ...] = (
    QWEN2_VL, QWEN2_5_VL, QWEN3_VL, INTERNVL, LLAVA, LLAVA_NEXT, LLAVA_ONEVISION, PALIGEMMA, GEMMA3, IDEFICS3, GLM4V,
    MISTRAL3, AYA_VISION,
)
ROWS: dict[str, FamilyRow] = {row.name: row for row in FAMILIES}
# Every tiny build by name: each family's own, then its variants (the paper models' language backbones).
TINY_RECIPES: dict[str, TinyRecipe] = {
    **{row.name: row.tiny for row in FAMILIES},
    **{name: recipe for row in FAMILIES for name, recipe in row.tiny_variants.items()},
}


def family_row(name: str) -> FamilyRow:
    """The row of registry key ``name``; KeyError naming the keys otherwise."""
    if name not in ROWS:
        raise KeyError(f"no built-in family {name!r}; built-in: {', '.join(ROWS)}")
    return ROWS[name]


def row_for_model_type(model_type: str | None) -> FamilyRow | None:
    """The row whose adapter serves ``config.model_type``, or None."""
    return next((row for row in FAMILIES if model_type in row.model_types), None)
