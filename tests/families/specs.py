"""One row per built-in family: the facts the parametrised tests in ``test_families.py`` check about it.

A row's values are written down from the family's sources (the processor's resize rule, the chat template,
documented model answers), never read back from the adapter under test. The row's name is the family's
registry key (``vrh_interp.core.description.families.registry``) and the name of its tiny fixture (``build_tiny``). A
``None`` field means the family has no such check; checks that only one family has are family-specific tests in
``test_families.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from transformers import (
    AyaVisionForConditionalGeneration,
    Gemma3ForConditionalGeneration,
    Gemma3ImageProcessorPil,
    Glm4vForConditionalGeneration,
    Glm4vImageProcessorPil,
    GotOcr2ImageProcessorPil,
    Idefics3ForConditionalGeneration,
    Idefics3ImageProcessorPil,
    InternVLForConditionalGeneration,
    LlavaForConditionalGeneration,
    LlavaImageProcessorPil,
    LlavaNextForConditionalGeneration,
    LlavaNextImageProcessorPil,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionImageProcessorPil,
    Mistral3ForConditionalGeneration,
    PaliGemmaForConditionalGeneration,
    PixtralImageProcessorPil,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen3VLForConditionalGeneration,
    SiglipImageProcessorPil,
)
from transformers.models.glm4v.image_processing_pil_glm4v import smart_resize as glm_smart_resize
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from tests.families.checks import anyres_sample_spacing
from vrh_interp.core.description.boxes import Box
from vrh_interp.core.description.families.aya_vision import AyaVisionAdapter
from vrh_interp.core.description.families.base import BoxFrame, FamilyAdapter, VisualLayout
from vrh_interp.core.description.families.gemma3 import Gemma3Adapter
from vrh_interp.core.description.families.glm4v import Glm4vAdapter
from vrh_interp.core.description.families.idefics3 import Idefics3Adapter
from vrh_interp.core.description.families.internvl import InternVLAdapter
from vrh_interp.core.description.families.llava import LlavaAdapter, llava_processed_view
from vrh_interp.core.description.families.llava_next import LlavaNextAdapter
from vrh_interp.core.description.families.llava_onevision import LlavaOnevisionAdapter
from vrh_interp.core.description.families.mistral3 import Mistral3Adapter
from vrh_interp.core.description.families.paligemma import PaliGemmaAdapter
from vrh_interp.core.description.families.qwen2_5_vl import Qwen25VLAdapter
from vrh_interp.core.description.families.qwen2_vl import Qwen2VLAdapter
from vrh_interp.core.description.families.qwen3_vl import Qwen3VLAdapter
from vrh_interp.core.description.heads import HeadGeometry
from vrh_interp.core.description.families.registry import (
    FAMILIES,
    GLM4V_MAX_PIXELS,
    GLM4V_MIN_PIXELS,
    LLAVA_NEXT_PINPOINTS,
    ONEVISION_PINPOINTS,
    QWEN2_VL_MAX_PIXELS,
    QWEN3_VL_MAX_PIXELS,
    QWEN_MIN_PIXELS,
)
from vrh_interp.core.description.tiny import TinyVLM

# Sizes of the tiny fixtures, written from their recipes (vrh_interp/core/description/families/registry.py).
INTERNVL_TILE, INTERNVL_TOKENS_PER_TILE = 64, 16  # patch 8, pixel shuffle 0.5: 4 x 4 tokens
LLAVA_NEXT_TILE, ONEVISION_TILE = 32, 36
PALIGEMMA_IMAGE, PALIGEMMA_PATCH = 56, 7
GEMMA3_IMAGE, GEMMA3_TOKENS_PER_IMAGE = 64, 16
IDEFICS3_FRAME, IDEFICS3_LONGEST_EDGE, IDEFICS3_TOKENS_PER_FRAME = 32, 96, 16  # patch 4, scale 2: 4 x 4 tokens
MISTRAL3_PATCH, MISTRAL3_MERGE, MISTRAL3_LONGEST_EDGE = 8, 2, 64

Size = tuple[int, int]
FrameFor = Callable[[FamilyAdapter, Size], BoxFrame]  # (adapter, image size) -> the frame answers are read in


def image_frame(adapter: FamilyAdapter, image_size: Size) -> BoxFrame:
    """Only the image size: boxes relative to (or in pixels of) the whole image."""
    return BoxFrame(image_size=image_size)


def view_frame(adapter: FamilyAdapter, image_size: Size) -> BoxFrame:
    """The adapter's frame without an encoding (LLaVA-1.5: the padded square it was trained on)."""
    return adapter.box_frame(None, image_size)


def resized_frame(input_size: Size) -> FrameFor:
    """Boxes in pixels of a resized model input of ``input_size`` (Qwen2.5-VL)."""
    return lambda adapter, image_size: BoxFrame(image_size=image_size, input_size=input_size)


def merged_grid_tokens(encoding: Any) -> int:
    """Qwen2-VL-style processors: one placeholder per 2 x 2 merged patches of ``image_grid_thw``."""
    frames, grid_h, grid_w = encoding["image_grid_thw"][0].tolist()
    return frames * grid_h * grid_w // 4


def llava_view_spacing(tiny: TinyVLM, layout: VisualLayout, image_size: Size) -> float:
    """LLaVA-1.5: the source-pixel step of the processed (padded or cropped) view."""
    return max(llava_processed_view(image_size, tiny.processor.image_processor).scale)


def input_spacing(tiny: TinyVLM, layout: VisualLayout, image_size: Size) -> float:
    """One resized model input (Pixtral): the source-pixel step between its pixels."""
    input_w, input_h = layout.input_size
    return max(image_size[0] / input_w, image_size[1] / input_h)


def anyres_spacing(grid_pinpoints: list[list[int]], tile_size: int) -> Callable[[TinyVLM, VisualLayout, Size], float]:
    """LLaVA-NeXT-style anyres: the largest step over the base view and the tile canvas."""
    return lambda tiny, layout, image_size: anyres_sample_spacing(image_size, grid_pinpoints, tile_size)


@dataclass(frozen=True)
class Sampling:
    """Images the processor downscales, where painting agrees with the layout only up to the sampling step."""

    sizes: tuple[Size, ...]
    boxes: int  # random boxes per image
    spacing: Callable[[TinyVLM, VisualLayout, Size], float]  # largest source-pixel step of the resampling


@dataclass(frozen=True)
class SmartResize:
    """One stretched grid of ``token_pixels``-pixel tokens, sized by the processor's ``smart_resize``."""

    sizes: tuple[Size, ...]
    token_pixels: int  # patch size x merge size
    resize: Callable[[int, int], Size]  # (height, width) -> resized (height, width), the tiny budget


@dataclass(frozen=True)
class Prompt:
    """The grounding prompt for ``expression`` and its encoding of a noise image of ``image_size``."""

    expression: str
    image_size: Size
    equals: str | None = None
    starts: str = ""
    contains: tuple[str, ...] = ()
    ends: str = ""
    image_tokens: int | Callable[[Any], int] | None = None  # placeholder count (or its rule) in the encoding


@dataclass(frozen=True)
class Outside:
    """Boxes reaching outside an ``image_size`` image: refused by the layout (``None``: not checked) and format."""

    image_size: Size
    layout_box: Box | None
    format_box: Box
    frame: FrameFor = image_frame


@dataclass(frozen=True)
class RoundTrip:
    """``parse_box(format_box(box))`` returns the box within ``tolerance`` quantisation steps per coordinate."""

    steps: int  # quantisation steps per image side in the native format (0-1000 -> 1000, 2 decimals -> 100)
    tolerance: float = 1.0  # 0.5 where the format rounds to the nearest step
    small_boxes: bool = False  # boxes of 2-10 % of the image (``small_boxes_in_images``), else any >= 2 steps
    frames: tuple[FrameFor, ...] = (image_frame,)
    text: str | None = None  # regular expression the written answer matches in full


@dataclass(frozen=True)
class Fuzz:
    """Text ``parse_box`` must never raise on: arbitrary text, joined ``pieces`` and ``near_misses``."""

    pieces: tuple[str, ...]
    near_misses: tuple[str, ...] = ()
    frame: BoxFrame = BoxFrame(image_size=(640, 480))


@dataclass(frozen=True)
class Answers:
    """Answers in the family's native (or, where it has none, requested) format and the box each one means."""

    image_size: Size
    cases: tuple[tuple[str, Box | None], ...]  # None: a BoxParseFailure that keeps the answer
    frame: FrameFor = image_frame


@dataclass(frozen=True)
class FamilySpec:
    """What the parametrised tests check about one family.

    ``nearest``: the layout experiment is exact only where each resized pixel reads one source pixel, so
    families whose processor downscales run it with NEAREST resampling; the LLaVA-1.5/NeXT/OneVision and
    Mistral3 rows keep their processor's own resampling, with exact cases at whole-pixel scale factors and
    downscaled images compared up to the sampling step (``sampling``).
    """

    name: str  # registry key and tiny builder name
    adapter: type[FamilyAdapter]
    model_class: type
    image_processor_class: type
    head_dim: str  # the attention module's head_dim: "config" (text_config.head_dim), "hidden" (hidden // heads,
    # whatever the config says), "module" (not in the config: the module derives it)
    layout_cases: tuple[tuple[Size, Box], ...]  # exact layout experiments: (image size, box to paint)
    prompt: Prompt
    outside: Outside
    fuzz: Fuzz
    answers: Answers
    round_trip: RoundTrip | None  # None: the family's frame needs its own round-trip test
    nearest: bool = True  # NEAREST resampling and a width-seeded noise image for the layout experiments
    tokenless: tuple[tuple[Size, Box], ...] = ()  # the layout cases whose box reaches no visual token
    geometry: HeadGeometry | None = None  # the head grid, where the tiny config pins it
    layers: str = "model.language_model.layers"  # the decoder layers, from the model's root
    non_causal_image_attention: bool = False
    sampling: Sampling | None = None
    smart_resize: SmartResize | None = None
    batch_blocks: tuple[tuple[Size, int], ...] | None = None  # two rows of one batch: (image size, blocks in row)
    formatted: tuple[Box, BoxFrame, str] | None = None  # a box, its frame and the native answer written for it


TINY_GEOMETRY = HeadGeometry(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)

# Image sizes covering smart_resize's three branches (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): downscale to the pixel
# budget (300x170, 640x480), plain rounding to multiples of the factor (97x203), upscale to the minimum (50x40).
SMART_RESIZE_LAYOUT_CASES = (
    ((300, 170), Box(0, 0, 90, 68)),
    ((300, 170), Box(170, 100, 300, 170)),
    ((97, 203), Box(19, 20, 87, 71)),
    ((97, 203), Box(94, 0, 97, 3)),
    ((640, 480), Box(128, 48, 576, 168)),
    ((640, 480), Box(0, 0, 640, 480)),
    ((50, 40), Box(10, 4, 45, 14)),
    ((50, 40), Box(47, 37, 50, 40)),
)
QWEN_USER_IMAGE = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
QWEN_JSON_PIECES = tuple('[]{}"bbox_2d:0123456789,. -')
RELATIVE_LIST_PIECES = ("[", "]", ",", " ", "0", ".", "5", "1", "-")  # [x1, y1, x2, y2] in 0-1
LLAVA_PIECES = tuple("[]()0123456789.,- \n")
LLAVA_INSTRUCTION = "Please provide the bounding box coordinate of the region this sentence describes: "
RELATIVE_ANSWERS = (  # [x1, y1, x2, y2] relative to a 1000x500 image, two decimals asked (Idefics3, Aya Vision)
    ("[0.123, 0.456, 0.789, 1.0]", Box(123, 228, 789, 500)),
    ("[ 0.12 , 0.34 , 0.56 , 0.78 ]", Box(120, 170, 560, 390)),  # word-level decoding
    ("[0.5, 0.5, 0.2, 0.9]", None),  # x2 < x1
    ("[120, 340, 560, 780]", None),  # 0-1000 integers are outside the 0-1 frame, never rescaled
    ("There is no red cube.", None),
)

QWEN2_VL = FamilySpec(
    name="qwen2_vl", adapter=Qwen2VLAdapter, model_class=Qwen2VLForConditionalGeneration,
    image_processor_class=Qwen2VLImageProcessorPil, head_dim="hidden",
    layout_cases=SMART_RESIZE_LAYOUT_CASES,
    smart_resize=SmartResize(
        sizes=((300, 170), (97, 203), (50, 40), (1000, 30)), token_pixels=28,
        resize=lambda h, w: smart_resize(h, w, 28, QWEN_MIN_PIXELS, QWEN2_VL_MAX_PIXELS)),
    outside=Outside((300, 170), layout_box=Box(200, 100, 310, 170), format_box=Box(0, 0, 10, 200)),
    prompt=Prompt("the red cube", (300, 170), contains=(
        QWEN_USER_IMAGE, "Find <|object_ref_start|>the red cube<|object_ref_end|><|im_end|>"),
        ends="<|im_start|>assistant\n", image_tokens=merged_grid_tokens),
    round_trip=RoundTrip(steps=1000),
    fuzz=Fuzz(pieces=tuple("()0123456789,. -<|>"), near_misses=(
        "<|box_start|>(1,2),(3<|box_end|>", "(1,2),(3,4", "(1,2)(3,4)", "((1,2),(3,4))", "(-5,2),(3,4)",
        "(1000,1000),(0,0)", "(5,5),(5,9)", "(1.5e3,2),(3,4)", "(" + "9" * 400 + ",1),(2,3)", "(,),(,)")),
    answers=Answers((2000, 1000), (
        # QwenLM/Qwen2-VL issue #9 (the README's high-five example), special tokens kept.
        ("<|object_ref_start|>击掌<|object_ref_end|><|box_start|>(531,516),(581,596)<|box_end|><|im_end|>",
         Box(1062, 516, 1162, 596)),
        # Same answer decoded with skip_special_tokens=True.
        ("击掌(531,516),(581,596)", Box(1062, 516, 1162, 596)),
        # Spaces between tokens, and only the first of several boxes.
        ("<|box_start|>( 100 , 250 ) , ( 600 , 1000 )<|box_end|>\n<|box_start|>(1,2),(3,4)<|box_end|>",
         Box(200, 250, 1200, 1000)),
        # Absolute pixels (Qwen2.5-VL style training data) are outside Qwen2-VL's 0-1000 frame.
        ("<|box_start|>(1769, 1013), (1778, 1027)<|box_end|>", None),
        ("<|box_start|>(600,500),(100,700)<|box_end|>", None),  # x2 < x1
        ("I cannot find the object in the image.", None),
    )),
)

QWEN2_5_VL = FamilySpec(
    name="qwen2_5_vl", adapter=Qwen25VLAdapter, model_class=Qwen2_5_VLForConditionalGeneration,
    image_processor_class=Qwen2VLImageProcessorPil, head_dim="hidden",
    layout_cases=SMART_RESIZE_LAYOUT_CASES,
    outside=Outside((300, 170), layout_box=None, format_box=Box(250, 0, 301, 10), frame=resized_frame((252, 140))),
    prompt=Prompt("the red cube", (300, 170), contains=(
        QWEN_USER_IMAGE + "Locate the red cube, output its bbox coordinates using JSON format.<|im_end|>",),
        ends="<|im_start|>assistant\n", image_tokens=merged_grid_tokens),
    formatted=(Box(100, 50, 500, 250), BoxFrame(image_size=(1000, 500), input_size=(504, 252)),
               '```json\n[\n\t{"bbox_2d": [50, 25, 252, 126]}\n]\n```'),
    round_trip=None,  # the frame is the resized input: test_qwen2_5_vl_format_then_parse_round_trips_...
    fuzz=Fuzz(pieces=QWEN_JSON_PIECES, frame=BoxFrame(image_size=(640, 480), input_size=(644, 476)), near_misses=(
        '{"bbox_2d": [1, 2, 3]}', '{"bbox_2d": [1, 2, 3, 4', '{"bbox_2d": 1, 2, 3, 4}', '"bbox_2d": [-1, 2, 3, 4]',
        '"bbox_2d": [9, 9, 3, 4]', '"bbox_2d": [1, 2, 3, 4000]', '[{"bbox_2d": ["1", "2", "3", "4"]}]',
        '"bbox_2d": [' + "9" * 400 + ', 1, 2, 3]', "```json\n[\n]\n```", '{"point_2d": [10, 20]}')),
    answers=Answers((2576, 1456), frame=resized_frame((1288, 728)), cases=(
        # Qwen2.5-VL cookbook (spatial understanding) answer shape; input 1288x728 is half the original size.
        ('```json\n[\n\t{"bbox_2d": [1030, 65, 1265, 300], "label": "top right brown cake"}\n]\n```',
         Box(2060, 130, 2530, 600)),
        ('[{"bbox_2d": [0, 0, 1288, 728], "label": "the whole image"}]', Box(0, 0, 2576, 1456)),
        # First box of several; key order and spacing vary.
        ('[{"label": "a", "bbox_2d":[10,20,30,40]}, {"label": "b", "bbox_2d": [50, 60, 70, 80]}]',
         Box(20, 40, 60, 80)),
        # A bare list (no key) and word-level decoding with spaces.
        ("[ 100 , 200 , 300 , 400 ]", Box(200, 400, 600, 800)),
        # Values beyond the resized input (1288x728) are not rescaled by guessing: they fail.
        ('{"bbox_2d": [1030, 65, 1265, 900]}', None),
        ('{"bbox_2d": [1030, 65, 1030, 300]}', None),  # zero width
        ("The cake is on the top right.", None),
    )),
)

QWEN3_VL = FamilySpec(
    name="qwen3_vl", adapter=Qwen3VLAdapter, model_class=Qwen3VLForConditionalGeneration,
    image_processor_class=Qwen2VLImageProcessorPil, head_dim="config",
    layout_cases=SMART_RESIZE_LAYOUT_CASES,
    smart_resize=SmartResize(
        sizes=((300, 170), (97, 203), (50, 40)), token_pixels=32,
        resize=lambda h, w: smart_resize(h, w, 32, QWEN_MIN_PIXELS, QWEN3_VL_MAX_PIXELS)),
    outside=Outside((300, 170), layout_box=None, format_box=Box(-5, 0, 10, 10)),
    prompt=Prompt("the red cube", (300, 170), equals=(
        QWEN_USER_IMAGE + "Locate the red cube, output its bbox coordinates using JSON format.<|im_end|>\n"
        "<|im_start|>assistant\n"), image_tokens=merged_grid_tokens),
    formatted=(Box(100, 50, 2000, 250), BoxFrame(image_size=(2000, 500)),
               '```json\n[\n\t{"bbox_2d": [50, 100, 1000, 500]}\n]\n```'),
    round_trip=RoundTrip(steps=1000),
    fuzz=Fuzz(pieces=QWEN_JSON_PIECES, near_misses=(
        '{"bbox_2d": [1, 2, 3]}', '{"bbox_2d": [1, 2, 3, 4', '"bbox_2d": [1, 2, 3, 1001]', '"bbox_2d": [9, 9, 3, 4]',
        '"bbox_2d": [-1, 2, 3, 4]', '"bbox_2d": [' + "9" * 400 + ', 1, 2, 3]', '{"point_2d": [10, 20]}')),
    answers=Answers((2000, 1000), (
        # Qwen3-VL cookbook answer shape, 0-1000 relative to the original 2000x1000 image.
        ('```json\n[\n\t{"bbox_2d": [515, 65, 632, 300], "label": "top right brown cake"}\n]\n```',
         Box(1030, 65, 1264, 300)),
        ('[{"bbox_2d": [0, 0, 1000, 1000], "label": "image"}]', Box(0, 0, 2000, 1000)),
        ('[{"label": "a", "bbox_2d":[10,20,30,40]}, {"label": "b", "bbox_2d": [50, 60, 70, 80]}]',
         Box(20, 20, 60, 40)),
        ("[ 100 , 200 , 300 , 400 ]", Box(200, 200, 600, 400)),
        # Pixel values beyond 1000 are not rescaled by guessing: they fail.
        ('{"bbox_2d": [1030, 65, 1265, 300]}', None),
        ("There is no cake.", None),
    )),
)

INTERNVL = FamilySpec(
    name="internvl", adapter=InternVLAdapter, model_class=InternVLForConditionalGeneration,
    image_processor_class=GotOcr2ImageProcessorPil, head_dim="config",
    # Tiles are 64 px with 4 x 4 tokens. 150x70 -> 2x1 tiles + thumbnail, 200x130 -> 3x2 + thumbnail,
    # 70x150 -> 1x2 + thumbnail, 500x90 -> 6x1 + thumbnail, 40x40 -> one tile (upscaled, no thumbnail).
    # Box edges sit a few pixels away from token edges: the thumbnail DOWNSCALES the image, and NEAREST
    # sampling can miss a sliver of a box narrower than one resized pixel.
    layout_cases=(
        ((150, 70), Box(10, 5, 40, 30)),
        ((150, 70), Box(60, 20, 100, 60)),  # spans both tiles
        ((200, 130), Box(58, 55, 92, 76)),  # spans the four tiles around an inner tile corner
        ((200, 130), Box(190, 120, 200, 130)),  # bottom-right image corner
        ((200, 130), Box(0, 0, 200, 130)),  # whole image
        ((70, 150), Box(0, 60, 30, 90)),  # spans the two stacked tiles, at the left edge
        ((500, 90), Box(240, 28, 262, 70)),  # spans the tile edge at x = 250
        ((40, 40), Box(5, 5, 25, 25)),
    ),
    batch_blocks=(((150, 70), 3), ((40, 40), 1)),  # 2x1 tiles + thumbnail; one tile, no thumbnail
    outside=Outside((150, 70), layout_box=Box(100, 10, 151, 60), format_box=Box(0, 0, 10, 90)),
    prompt=Prompt("the red cube", (150, 70), image_tokens=3 * 16, equals=(  # 2x1 tiles + thumbnail
        f"<|im_start|>user\n<IMG_CONTEXT>\n{LLAVA_INSTRUCTION}<ref>the red cube</ref><|im_end|>\n"
        "<|im_start|>assistant\n")),
    round_trip=RoundTrip(steps=1000, tolerance=0.5, text=r"<box>\[\[.*\]\]</box>"),
    fuzz=Fuzz(pieces=("[", "]", "<box>", "</box>", ",", " ", "0", "7", "1000", ".", "-", "<ref>"), near_misses=(
        "<box>[[1, 2, 3</box>", "[[1, 2, 3, 4", "[1, 2, 3, 4]", "<box>[[1,2],[3,4]]</box>", "[[-5, 2, 30, 40]]",
        "[[1000, 1000, 0, 0]]", "[[5, 5, 5, 9]]", "[[1.5e3, 2, 3, 4]]", "[[" + "9" * 400 + ", 1, 2, 3]]", "[[,,,]]",
        "<ref>x</ref><box>", "[[1001, 0, 1002, 10]]")),
    answers=Answers((1000, 500), (
        # InternVL's RefCOCO answer layout (evaluate_grounding in the InternVL repo), image 1000x500.
        ("<ref>the man on the left</ref><box>[[123, 456, 789, 1000]]</box>", Box(123, 228, 789, 500)),
        # Decoded without the special tokens.
        ("the man on the left[[123, 456, 789, 1000]]", Box(123, 228, 789, 500)),
        # The shipped toy model B's word-level tokenizer decodes with spaces between tokens.
        ("<ref> the man on the left </ref> <box> [ [ 120 , 340 , 560 , 780 ] ] </box>", Box(120, 170, 560, 390)),
        # Several boxes for one expression: the first is read.
        ("<box>[[0, 0, 500, 500], [500, 500, 1000, 1000]]</box>", Box(0, 0, 500, 250)),
        ("<box>[[600, 500, 100, 700]]</box>", None),  # x2 < x1
        ("<box>[[1200, 500, 1300, 700]]</box>", None),  # outside the 0-1000 frame
        ("I cannot find the man in the image.", None),
    )),
)

LLAVA = FamilySpec(
    name="llava", adapter=LlavaAdapter, model_class=LlavaForConditionalGeneration,
    image_processor_class=LlavaImageProcessorPil, head_dim="config", geometry=TINY_GEOMETRY, nearest=False,
    # Crop mode (the fixture's processor; pad mode: test_llava_pad_mode_*). Sizes the processor maps by
    # whole-pixel factors (x1: 70x44; x2: 35x22; x4: 11x33), so the experiment is exact for any box. Crop mode
    # keeps the central square; boxes outside it have no tokens.
    layout_cases=(
        ((70, 44), Box(0, 0, 10, 44)),  # left of the central square: no visual token at all
        ((70, 44), Box(13, 0, 21, 8)),  # exactly the first token
        ((70, 44), Box(50, 30, 70, 44)),  # straddles the crop edge and the 4 uncovered rows at the bottom
        ((70, 44), Box(20, 10, 45, 35)),
        ((35, 22), Box(0, 0, 7, 22)),  # overlaps the crop, which starts at x = 6.5, by half a pixel
        ((11, 33), Box(0, 0, 11, 11)),  # above the central square
        ((11, 33), Box(2, 12, 9, 20)),
    ),
    tokenless=(((70, 44), Box(0, 0, 10, 44)), ((11, 33), Box(0, 0, 11, 11))),
    sampling=Sampling(sizes=((300, 200),), boxes=3, spacing=llava_view_spacing),
    outside=Outside((70, 44), layout_box=Box(60, 0, 90, 10), format_box=Box(0, 0, 10, 60)),
    prompt=Prompt("the red circle", (50, 40), image_tokens=25,
                  equals=f"USER: <image>\n{LLAVA_INSTRUCTION}the red circle ASSISTANT:"),
    round_trip=None,  # the frame is the padded square or the central crop: test_llava_format_then_parse_*
    fuzz=Fuzz(pieces=LLAVA_PIECES),
    # Answers in LLaVA-1.5's format (REC answers of llava_v1_5_mix665k, e.g. "[0.61, 0.36, 0.92, 0.83]" quoted in
    # haotian-liu/LLaVA#623; the toy model's word-level decode), read in the padded square of a 640x480 image.
    answers=Answers((640, 480), frame=view_frame, cases=(
        ("[0.61, 0.36, 0.92, 0.83]", Box(390.4, 150.4, 588.8, 451.2)),
        ("[ 0.12 , 0.34 , 0.56 , 0.78 ]", Box(76.8, 137.6, 358.4, 419.2)),
        ("The bounding box is [0.1, 0.2, 0.3, 0.4].", Box(64.0, 48.0, 192.0, 176.0)),
        ("[0.25,0.5,0.75,1]", Box(160.0, 240.0, 480.0, 560.0)),  # reaches into the bottom padding
        ("[0.1, 0.2, 0.3, 0.4] and [0.5, 0.5, 0.6, 0.6]", Box(64.0, 48.0, 192.0, 176.0)),  # first box
        ("I cannot locate it.", None),
        ("[0.1, 0.2, 0.3]", None),
        ("0.1, 0.2, 0.3, 0.4", None),  # no brackets
        ("[1.5, 0.2, 1.7, 0.4]", None),  # outside the 0-1 frame
        ("[0.5, 0.5, 0.4, 0.6]", None),  # x2 < x1
    )),
)

LLAVA_NEXT = FamilySpec(
    name="llava_next", adapter=LlavaNextAdapter, model_class=LlavaNextForConditionalGeneration,
    image_processor_class=LlavaNextImageProcessorPil, head_dim="config", geometry=TINY_GEOMETRY, nearest=False,
    # Whole-pixel scale factors on the base view and the canvas (16x16: 1x2 tiles, image x2 and pasted at x = 16,
    # two token columns kept per tile; 32x16: 2 tiles side by side, no padding; 32x32: padded canvas), so the
    # experiment is exact for any box.
    layout_cases=(
        ((16, 16), Box(0, 0, 16, 16)),
        ((16, 16), Box(7, 3, 9, 12)),  # spans the two tiles
        ((16, 16), Box(15, 15, 16, 16)),  # bottom-right pixel
        ((32, 16), Box(10, 5, 20, 9)),
        ((16, 32), Box(0, 30, 16, 32)),
        ((32, 32), Box(14, 0, 18, 32)),
    ),
    sampling=Sampling(sizes=((50, 37), (90, 25), (25, 90), (77, 60)), boxes=3,  # 2x2, 1x3, 3x1, 2x2 tiles
                      spacing=anyres_spacing(LLAVA_NEXT_PINPOINTS, LLAVA_NEXT_TILE)),
    outside=Outside((50, 37), layout_box=Box(40, 30, 60, 37), format_box=Box(-5, 0, 10, 10), frame=view_frame),
    prompt=Prompt("the red circle", (50, 37), equals=f"[INST] <image>\n{LLAVA_INSTRUCTION}the red circle [/INST]"),
    round_trip=RoundTrip(steps=100, small_boxes=True, frames=(view_frame, image_frame)),
    fuzz=Fuzz(pieces=LLAVA_PIECES),
    answers=Answers((640, 480), frame=view_frame, cases=(  # relative to the whole 640x480 image
        ("[0.61, 0.36, 0.92, 0.83]", Box(390.4, 172.8, 588.8, 398.4)),
        ("[ 0.12 , 0.34 , 0.56 , 0.78 ]", Box(76.8, 163.2, 358.4, 374.4)),
        ("The bounding box coordinates are [0.0, 0.5, 1.0, 1.0].", Box(0.0, 240.0, 640.0, 480.0)),
        ("There is no such object.", None),
        ("[0.2, 0.3, 0.1, 0.4]", None),
        ("[12, 30, 200, 300]", None),  # pixels are not LLaVA's format
    )),
)

LLAVA_ONEVISION = FamilySpec(
    name="llava_onevision", adapter=LlavaOnevisionAdapter, model_class=LlavaOnevisionForConditionalGeneration,
    image_processor_class=LlavaOnevisionImageProcessorPil, head_dim="config", geometry=TINY_GEOMETRY,
    nearest=False,
    # Each 36-pixel tile's 4 x 4 tokens cover its first 32 pixels. 72x36: two tiles at scale 1 (the base view
    # halves the image); 36x18, 12x36: one padded tile at scale 1 or 3.
    layout_cases=(
        ((72, 36), Box(32, 0, 36, 36)),  # tile 0's uncovered 4-pixel strip: base-view tokens only
        ((72, 36), Box(30, 10, 40, 20)),  # spans the gap into tile 1
        ((72, 36), Box(0, 0, 72, 36)),
        ((72, 36), Box(68, 32, 72, 36)),  # the corner no token covers (base and tile grids stop short)
        ((36, 18), Box(5, 0, 20, 3)),
        ((12, 36), Box(0, 20, 12, 36)),
    ),
    tokenless=(((72, 36), Box(68, 32, 72, 36)),),
    sampling=Sampling(sizes=((40, 100), (150, 200)), boxes=2,  # 3x2 tiles; 6x5 tiles, downsampled
                      spacing=anyres_spacing(ONEVISION_PINPOINTS, ONEVISION_TILE)),
    outside=Outside((72, 36), layout_box=Box(60, 0, 80, 10), format_box=Box(0, 0, 10, 40), frame=view_frame),
    prompt=Prompt("the red circle", (72, 36), equals=(
        f"<|im_start|>user <image>\n{LLAVA_INSTRUCTION}the red circle<|im_end|>\n<|im_start|>assistant\n")),
    round_trip=RoundTrip(steps=100, small_boxes=True, frames=(view_frame,)),
    fuzz=Fuzz(pieces=LLAVA_PIECES),
    answers=Answers((640, 480), frame=view_frame, cases=(
        ("[0.214, 0.365, 0.642, 0.907]", Box(136.96, 175.2, 410.88, 435.36)),  # OneVision answers with 3 decimals
        ("[ 0.12 , 0.34 , 0.56 , 0.78 ]", Box(76.8, 163.2, 358.4, 374.4)),
        ("The person on the left.", None),
    )),
)

PALIGEMMA = FamilySpec(
    name="paligemma", adapter=PaliGemmaAdapter, model_class=PaliGemmaForConditionalGeneration,
    image_processor_class=SiglipImageProcessorPil, head_dim="config", non_causal_image_attention=True,
    # The image is stretched to 56 x 56 whatever its aspect: downscaled (150x70, 400x300), mixed (37x101),
    # identity (56x56). Box edges sit near token centres so NEAREST sampling cannot miss a sliver.
    layout_cases=(
        ((150, 70), Box(28, 13, 104, 48)),
        ((150, 70), Box(141, 0, 150, 5)),  # top-right corner
        ((37, 101), Box(7, 19, 30, 82)),
        ((56, 56), Box(0, 0, 56, 56)),
        ((56, 56), Box(10, 10, 20, 50)),
        ((400, 300), Box(25, 19, 375, 131)),
    ),
    outside=Outside((150, 70), layout_box=Box(0, 60, 20, 75), format_box=Box(140, 0, 152, 10)),
    prompt=Prompt("the red cube", (150, 70), equals="<image>detect the red cube", image_tokens=8 * 8),
    round_trip=RoundTrip(steps=1023, tolerance=0.5),
    fuzz=Fuzz(pieces=("<loc", ">", "0000", "1023", "1024", "0512", "<loc0100>", " ", "12", "<seg001>", "cat", ";")),
    answers=Answers((2046, 1023), (
        # "detect cat" answer layout from the PaliGemma model card / big_vision (y1, x1, y2, x2), image 2046x1023.
        ("<loc0256><loc0128><loc0768><loc0896> cat", Box(256, 256, 1792, 768)),
        # "detect cat ; dog": several detections separated by " ; ", the first is read.
        ("<loc0256><loc0128><loc0768><loc0896> cat ; <loc0000><loc0000><loc0100><loc0100> dog",
         Box(256, 256, 1792, 768)),
        # Whitespace between location tokens (word-level decoders).
        ("<loc0000> <loc0000> <loc1023> <loc1023> cat", Box(0, 0, 2046, 1023)),
        ("<loc0256><loc0128><loc0768> cat", None),  # three coordinates
        ("<loc0768><loc0128><loc0256><loc0896> cat", None),  # y2 < y1
        ("<loc1024><loc0000><loc1030><loc0010> cat", None),  # outside the 1024 bins
        ("no cat here", None),
    )),
)

GEMMA3 = FamilySpec(
    name="gemma3", adapter=Gemma3Adapter, model_class=Gemma3ForConditionalGeneration,
    image_processor_class=Gemma3ImageProcessorPil, head_dim="config", non_causal_image_attention=True,
    # The image is stretched to 64 x 64 and pooled to 4 x 4 tokens. Box edges sit near token centres so
    # NEAREST sampling of the downscaled image cannot miss a sliver of the box. (Pan & scan: test_gemma3_*.)
    layout_cases=(
        ((150, 70), Box(19, 9, 94, 44)),
        ((150, 70), Box(131, 61, 150, 70)),  # bottom-right corner
        ((37, 101), Box(5, 13, 23, 88)),
        ((64, 64), Box(0, 0, 64, 64)),
    ),
    outside=Outside((150, 70), layout_box=Box(100, 10, 160, 60), format_box=Box(0, -5, 10, 20)),
    prompt=Prompt("the red cube", (150, 70), starts="<bos><start_of_turn>user\n<start_of_image>Detect the red cube.",
                  contains=('{"box_2d": [y_min, x_min, y_max, x_max]}',), ends="<end_of_turn>\n<start_of_turn>model\n"),
    round_trip=RoundTrip(steps=1000, tolerance=0.5),
    fuzz=Fuzz(pieces=('"box_2d"', "box_2d", ":", "[", "]", ",", " ", "0", "1000", "12", "-", ".", "{", "}")),
    answers=Answers((1000, 500), (
        # Gemini-convention JSON, y first, image 1000x500.
        ('{"box_2d": [456, 123, 1000, 789]}', Box(123, 228, 789, 500)),
        ('```json\n[\n  {"box_2d": [456, 123, 1000, 789], "label": "the red cube"}\n]\n```', Box(123, 228, 789, 500)),
        ('[{"box_2d": [0, 0, 500, 500], "label": "a"}, {"box_2d": [500, 500, 1000, 1000], "label": "b"}]',
         Box(0, 0, 500, 250)),
        ('{ "box_2d" : [ 340 , 120 , 780 , 560 ] }', Box(120, 170, 560, 390)),  # word-level decoding
        ('{"box_2d": [780, 120, 340, 560]}', None),  # y2 < y1
        ('{"box_2d": [0.1, 0.2, 0.3, 0.4]}', Box(0.2, 0.05, 0.4, 0.15)),  # read in the 0-1000 frame, never rescaled
        ("[123, 456, 789, 1000]", None),  # no box_2d key
        ("I cannot see a red cube.", None),
    )),
)

IDEFICS3 = FamilySpec(
    name="idefics3", adapter=Idefics3Adapter, model_class=Idefics3ForConditionalGeneration,
    image_processor_class=Idefics3ImageProcessorPil, head_dim="config", layers="model.text_model.layers",
    # Longest edge -> 96 px, sides up to multiples of 32, 32 px frames of 4 x 4 tokens:
    # 100x60 -> canvas 96x64 (2x3 tiles), 37x101 -> 64x96 (3x2), 20x20 -> 96x96 (3x3, upscaled),
    # 500x90 -> 96x32 (1x3), 150x70 -> 96x64 (2x3); the global image comes last. Box edges sit near token
    # centres: NEAREST sampling after two resizes can miss a sliver narrower than one resized pixel.
    layout_cases=(
        ((100, 60), Box(21, 19, 46, 41)),  # spans the four tiles around an inner tile corner
        ((100, 60), Box(88, 49, 100, 60)),  # bottom-right corner
        ((37, 101), Box(7, 21, 30, 46)),  # spans four tiles of a portrait image
        ((20, 20), Box(2, 3, 18, 12)),
        ((500, 90), Box(146, 34, 188, 56)),  # spans the tile edge at x = 166.7
        ((150, 70), Box(0, 0, 150, 70)),  # whole image
    ),
    batch_blocks=(((100, 60), 7), ((500, 90), 4)),  # 2x3 tiles + global; 1x3 tiles + global
    outside=Outside((100, 60), layout_box=Box(50, 30, 120, 60), format_box=Box(0, 0, 10, 61)),
    prompt=Prompt("the red cube", (100, 60), starts="<|begin_of_text|>User:<image>Locate the red cube in the image.",
                  contains=("[x1, y1, x2, y2]",), ends="<end_of_utterance>\nAssistant:",
                  image_tokens=7 * IDEFICS3_TOKENS_PER_FRAME),  # 2x3 tiles + global
    round_trip=RoundTrip(steps=100, tolerance=0.5, text=r"\[[01]\.\d\d, [01]\.\d\d, [01]\.\d\d, [01]\.\d\d\]"),
    fuzz=Fuzz(pieces=RELATIVE_LIST_PIECES),
    answers=Answers((1000, 500), (
        *RELATIVE_ANSWERS,
        ("The red cube is at [0.1, 0.2, 0.3, 0.4].<end_of_utterance>", Box(100, 100, 300, 200)),
        ("[0.1, 0.2, 0.3, 0.4] and [0.5, 0.5, 0.9, 0.9]", Box(100, 100, 300, 200)),  # first box
    )),
)

GLM4V = FamilySpec(
    name="glm4v", adapter=Glm4vAdapter, model_class=Glm4vForConditionalGeneration,
    image_processor_class=Glm4vImageProcessorPil, head_dim="hidden",
    # Sizes cover GLM's smart_resize branches: downscale (300x170, 640x480), rounding (97x203), minimum
    # budget (50x40), and the upscale of images under 28 pixels on a side (20x90).
    layout_cases=(
        ((300, 170), Box(0, 0, 90, 68)),
        ((300, 170), Box(170, 100, 300, 170)),
        ((97, 203), Box(19, 20, 87, 71)),
        ((640, 480), Box(128, 48, 576, 168)),
        ((640, 480), Box(637, 0, 640, 3)),
        ((50, 40), Box(10, 4, 45, 14)),
        ((20, 90), Box(4, 9, 18, 31)),
        ((20, 90), Box(0, 0, 20, 90)),
    ),
    smart_resize=SmartResize(
        sizes=((300, 170), (97, 203), (20, 90)), token_pixels=28,
        resize=lambda h, w: glm_smart_resize(2, h, w, temporal_factor=2, factor=28, min_pixels=GLM4V_MIN_PIXELS,
                                             max_pixels=GLM4V_MAX_PIXELS)),
    outside=Outside((300, 170), layout_box=None, format_box=Box(0, 0, 10, 171)),
    prompt=Prompt("the red cube", (300, 170), image_tokens=merged_grid_tokens, equals=(
        "[gMASK]<sop><|user|>\n<|begin_of_image|><|image|><|end_of_image|>"
        "Help me to locate the red cube in the image and give me its bounding boxes.<|assistant|>\n")),
    formatted=(Box(100, 50, 2000, 250), BoxFrame(image_size=(2000, 500)),
               "<|begin_of_box|>[50,100,1000,500]<|end_of_box|>"),
    round_trip=RoundTrip(steps=1000),
    fuzz=Fuzz(pieces=("<|begin_of_box|>", "<|end_of_box|>", "</think>", *"[]()<>0123456789,. -"), near_misses=(
        "<|begin_of_box|>[1,2,3]<|end_of_box|>", "<|begin_of_box|>[1,2,3,<|end_of_box|>", "<|begin_of_box|>",
        "[[1,2,3,1001]]", "[[-1,2,3,4]]", "[[9,9,3,4]]", "</think><|begin_of_box|>", "[[" + "9" * 400 + ",1,2,3]]")),
    answers=Answers((2000, 1000), (
        # GLM-V README: box marked by <|begin_of_box|>/<|end_of_box|>, 0-1000 relative, bracket style varies.
        ("<answer><|begin_of_box|>[[97,595,179,988]]<|end_of_box|></answer>", Box(194, 595, 358, 988)),
        ("<|begin_of_box|>[97, 595, 179, 988]<|end_of_box|>", Box(194, 595, 358, 988)),
        ("<|begin_of_box|>(97,595),(179,988)<|end_of_box|>", Box(194, 595, 358, 988)),
        ("<|begin_of_box|><97,595,179,988><|end_of_box|>", Box(194, 595, 358, 988)),
        # GLM-4.5V API answer (markers stripped by decoding), after its reasoning.
        ("The coordinates of the second bottle of beer from the right on the table are [[97,595,179,988]].",
         Box(194, 595, 358, 988)),
        # Numbers in the reasoning are skipped: the box marker, else the text after </think>, is read.
        ("<think>Left bottle near [10,20,30,40].</think><answer><|begin_of_box|>[[97,595,179,988]]<|end_of_box|>",
         Box(194, 595, 358, 988)),
        ("<think>Left bottle near [10,20,30,40].</think>[[97,595,179,988]]", Box(194, 595, 358, 988)),
        ("<|begin_of_box|>[[97,595,1790,988]]<|end_of_box|>", None),  # outside 0-1000
        ("<think>It is at [10,20,30,40].</think>I cannot see any bottle.", None),
    )),
)

MISTRAL3 = FamilySpec(
    name="mistral3", adapter=Mistral3Adapter, model_class=Mistral3ForConditionalGeneration,
    image_processor_class=PixtralImageProcessorPil, head_dim="config", geometry=TINY_GEOMETRY, nearest=False,
    # Sizes the processor keeps (48x32, 64x16) or stretches by whole factors (32x8 -> 32x16, 8x32 -> 16x32): exact.
    # (A one-token image, e.g. 8x8, crashes Mistral3Model.get_image_features in transformers 5.24: squeeze(0).)
    layout_cases=(
        ((48, 32), Box(0, 0, 48, 32)),
        ((48, 32), Box(15, 15, 17, 17)),  # four tokens around one corner
        ((48, 32), Box(47, 31, 48, 32)),
        ((64, 16), Box(20, 3, 40, 9)),
        ((32, 8), Box(16, 0, 32, 8)),
        ((8, 32), Box(0, 15, 8, 17)),
    ),
    sampling=Sampling(sizes=((50, 37), (200, 150), (100, 30)), boxes=3, spacing=input_spacing),  # up; down; both
    outside=Outside((48, 32), layout_box=Box(0, 0, 49, 10), format_box=Box(0, 0, 10, 40)),
    prompt=Prompt("the red circle", (50, 37), equals=(
        "<s>[INST][IMG]Locate the red circle in the image. Answer with its bounding box as [x1, y1, x2, y2]: "
        "coordinates between 0 and 1, relative to the image width and height, with two decimals.[/INST]")),
    round_trip=RoundTrip(steps=100, small_boxes=True),
    fuzz=Fuzz(pieces=LLAVA_PIECES),
    answers=Answers((640, 480), (  # answers in the format the prompt asks for
        ("[0.25, 0.5, 0.75, 1.0]", Box(160.0, 240.0, 480.0, 480.0)),
        ("The bounding box of the red circle is [0.12, 0.34, 0.56, 0.78].", Box(76.8, 163.2, 358.4, 374.4)),
        ("```\n[ 0.1 , 0.2 , 0.3 , 0.4 ]\n```", Box(64.0, 96.0, 192.0, 192.0)),
        ("[120, 80, 300, 240]", None),  # pixels: not the requested format
        ("I can't see a red circle.", None),
    )),
)

AYA_VISION = FamilySpec(
    name="aya_vision", adapter=AyaVisionAdapter, model_class=AyaVisionForConditionalGeneration,
    image_processor_class=GotOcr2ImageProcessorPil, head_dim="module",  # Cohere2's config has no head_dim
    # Tiles are 56 px with 4 x 4 tokens: 150x70 -> 2x1 tiles + global, 200x130 -> 3x2 + global, 70x150 -> 1x2 +
    # global, 40x40 -> one tile. Box edges sit a few pixels away from token edges (the global thumbnail
    # downscales, and NEAREST sampling can miss a sliver narrower than one resized pixel).
    layout_cases=(
        ((150, 70), Box(60, 20, 100, 60)),  # spans both tiles
        ((200, 130), Box(58, 55, 92, 76)),  # spans the four tiles around an inner tile corner
        ((200, 130), Box(190, 120, 200, 130)),  # bottom-right image corner
        ((70, 150), Box(0, 60, 30, 90)),  # spans the two stacked tiles, at the left edge
        ((40, 40), Box(5, 5, 25, 25)),
    ),
    outside=Outside((150, 70), layout_box=Box(-3, 10, 60, 60), format_box=Box(0, 0, 160, 10)),
    prompt=Prompt("the red cube", (150, 70), image_tokens=3 * 16,  # 2x1 tiles + global, 4 x 4 tokens each
                  starts="<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|><image>Locate the red cube in the image.",
                  contains=("[x1, y1, x2, y2]",), ends="<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
    round_trip=RoundTrip(steps=100, tolerance=0.5),
    fuzz=Fuzz(pieces=RELATIVE_LIST_PIECES),
    answers=Answers((1000, 500), (
        *RELATIVE_ANSWERS,
        ("The red cube is at [0.1, 0.2, 0.3, 0.4].", Box(100, 100, 300, 200)),
        ("(0.1, 0.2, 0.3, 0.4)", None),  # not a bracketed list
    )),
)

# One row per registry row, in the registry's order (tests/families/test_registry.py checks the names agree).
_ROWS: dict[str, FamilySpec] = {spec.name: spec for spec in (
    QWEN2_VL, QWEN2_5_VL, QWEN3_VL, INTERNVL, LLAVA, LLAVA_NEXT, LLAVA_ONEVISION, PALIGEMMA, GEMMA3, IDEFICS3, GLM4V,
    MISTRAL3, AYA_VISION,
)}
SPECS: dict[str, FamilySpec] = {row.name: _ROWS[row.name] for row in FAMILIES if row.name in _ROWS}
