"""Mistral3 adapter: fixture, geometry, Pixtral layout experiment with [IMG_BREAK]/[IMG_END], prompt, box format."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from transformers import Mistral3ForConditionalGeneration, PixtralImageProcessorPil
from transformers.models.pixtral.image_processing_pil_pixtral import get_resize_output_image_size

from tests.conftest import noise_image
from tests.families.checks import (
    assert_fixture_is_registered,
    assert_generates,
    assert_parses_to,
    assert_round_trip,
    encode_noise_image,
    noise_image_layout,
    small_boxes_in_images,
)
from vrh_interp.boxes import Box, BoxParseFailure, InvalidBoxError
from vrh_interp.families.base import BoxFrame
from vrh_interp.families.mistral3 import Mistral3Adapter
from vrh_interp.heads import HeadGeometry
from vrh_interp.testing.layout_probe import (
    assert_changed_within_sampling,
    changed_positions,
    check_layout_by_painting,
    random_boxes,
)
from vrh_interp.testing.tiny import TinyVLM
from vrh_interp.testing.tiny.mistral3 import LONGEST_EDGE, PATCH_SIZE, SPATIAL_MERGE_SIZE, build

TOKEN_PIXELS = PATCH_SIZE * SPATIAL_MERGE_SIZE


@pytest.fixture(scope="module")
def tiny() -> TinyVLM:
    return build(seed=0)


@pytest.fixture(scope="module")
def adapter(tiny: TinyVLM) -> Mistral3Adapter:
    return Mistral3Adapter(tiny.model.config)


def resized_hw(image_size: tuple[int, int]) -> tuple[int, int]:
    width, height = image_size
    return get_resize_output_image_size(noise_image(width, height), size=(LONGEST_EDGE, LONGEST_EDGE),
                                        patch_size=(TOKEN_PIXELS, TOKEN_PIXELS))


def test_fixture_is_the_real_family_and_registry_picks_the_adapter(tiny: TinyVLM) -> None:
    assert_fixture_is_registered(tiny, Mistral3ForConditionalGeneration, PixtralImageProcessorPil, Mistral3Adapter)


def test_port_matches_the_real_pixtral_processor(tiny: TinyVLM) -> None:
    processing_pixtral = pytest.importorskip("transformers.models.pixtral.processing_pixtral")  # needs torchvision
    real = processing_pixtral.PixtralProcessor(
        image_processor=tiny.processor.image_processor, tokenizer=tiny.processor.tokenizer, patch_size=PATCH_SIZE,
        spatial_merge_size=SPATIAL_MERGE_SIZE, chat_template=tiny.processor.chat_template,
    )
    for image_size in [(50, 37), (200, 150), (16, 64)]:
        ported = tiny.processor(images=[noise_image(*image_size)], text=["a [IMG] b"], return_tensors="pt")
        expected = real(images=[noise_image(*image_size)], text=["a [IMG] b"], return_tensors="pt")
        assert ported["input_ids"].tolist() == expected["input_ids"].tolist()
        assert ported["image_sizes"].tolist() == expected["image_sizes"].tolist()


def test_geometry_and_attention_path_match_the_model(tiny: TinyVLM, adapter: Mistral3Adapter) -> None:
    assert adapter.geometry() == HeadGeometry(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
    attention = adapter.attention_module(tiny.model, 1)
    assert attention is tiny.model.model.language_model.layers[1].self_attn
    assert adapter.output_projection(tiny.model, 1) is attention.o_proj


# Sizes the processor keeps (48x32, 64x16) or stretches by whole factors (32x8 -> 32x16, 8x32 -> 16x32): exact.
# (A one-token image, e.g. 8x8, crashes Mistral3Model.get_image_features in transformers 5.24: squeeze(0).)
EXACT_CASES = [
    ((48, 32), Box(0, 0, 48, 32)),
    ((48, 32), Box(15, 15, 17, 17)),  # four tokens around one corner
    ((48, 32), Box(47, 31, 48, 32)),
    ((64, 16), Box(20, 3, 40, 9)),
    ((32, 8), Box(16, 0, 32, 8)),
    ((8, 32), Box(0, 15, 8, 17)),
]


@pytest.mark.parametrize(("image_size", "box"), EXACT_CASES)
def test_layout_equals_tokens_changed_by_painting_the_box(tiny: TinyVLM, adapter: Mistral3Adapter,
                                                          image_size: tuple[int, int], box: Box) -> None:
    check_layout_by_painting(tiny, adapter, noise_image(*image_size), box)


@pytest.mark.parametrize("image_size", [(50, 37), (200, 150), (100, 30)])  # round up; downscale; both
def test_resized_layouts_agree_with_painting_up_to_sampling(tiny: TinyVLM, adapter: Mistral3Adapter,
                                                            image_size: tuple[int, int]) -> None:
    layout = noise_image_layout(tiny, adapter, image_size)
    input_w, input_h = layout.input_size
    spacing = max(image_size[0] / input_w, image_size[1] / input_h)
    for box in random_boxes(image_size, count=3, seed=image_size[0]):
        changed = changed_positions(tiny, adapter, noise_image(*image_size), box)
        assert_changed_within_sampling(layout, box, changed, spacing)


@pytest.mark.parametrize("image_size", [(50, 37), (200, 150), (100, 30), (16, 64), (48, 32)])
def test_grid_breaks_and_end_follow_the_processor(tiny: TinyVLM, adapter: Mistral3Adapter,
                                                  image_size: tuple[int, int]) -> None:
    encoding = encode_noise_image(tiny, adapter, image_size)
    layout = adapter.visual_layout(encoding, image_size, tiny.processor)
    resized_h, resized_w = resized_hw(image_size)
    rows, cols = resized_h // TOKEN_PIXELS, resized_w // TOKEN_PIXELS
    (block,) = layout.blocks
    assert (block.rows, block.cols, layout.input_size) == (rows, cols, (resized_w, resized_h))
    assert len(layout.visual_positions) == rows * (cols + 1)  # PixtralProcessor._get_num_multimodal_tokens
    tokens = tiny.processor.tokenizer.convert_ids_to_tokens(encoding["input_ids"][0, list(layout.visual_positions)])
    expected = (["[IMG]"] * cols + ["[IMG_BREAK]"]) * rows
    expected[-1] = "[IMG_END]"
    assert tokens == expected
    assert list(layout.visual_positions) == list(range(layout.visual_positions[0], layout.visual_positions[-1] + 1))


def test_boxes_outside_the_image_are_refused(tiny: TinyVLM, adapter: Mistral3Adapter) -> None:
    with pytest.raises(InvalidBoxError):
        noise_image_layout(tiny, adapter, (48, 32)).positions_for_box(Box(0, 0, 49, 10))
    with pytest.raises(InvalidBoxError):
        adapter.format_box(Box(0, 0, 10, 40), BoxFrame(image_size=(48, 32)))


def test_grounding_prompt_uses_the_chat_template_and_generates(tiny: TinyVLM, adapter: Mistral3Adapter) -> None:
    prompt = adapter.grounding_prompt(tiny.processor, "the red circle")
    assert prompt == ("<s>[INST][IMG]Locate the red circle in the image. Answer with its bounding box as "
                      "[x1, y1, x2, y2]: coordinates between 0 and 1, relative to the image width and height, "
                      "with two decimals.[/INST]")
    encoding = adapter.encode(tiny.processor, [noise_image(50, 37)], [prompt])
    assert_generates(tiny, encoding)


@settings(max_examples=200, deadline=None)
@given(small_boxes_in_images())
def test_format_then_parse_round_trips_within_one_step(adapter: Mistral3Adapter,
                                                       case: tuple[Box, tuple[int, int]]) -> None:
    box, (width, height) = case
    assert_round_trip(adapter, box, BoxFrame(image_size=(width, height)), (0.01 * width, 0.01 * height))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet="[]()0123456789.,- \n", max_size=40)))
def test_parse_never_raises(adapter: Mistral3Adapter, text: str) -> None:
    assert isinstance(adapter.parse_box(text, BoxFrame(image_size=(640, 480))), (Box, BoxParseFailure))


@pytest.mark.parametrize(("answer", "expected"), [
    ("[0.25, 0.5, 0.75, 1.0]", Box(160.0, 240.0, 480.0, 480.0)),
    ("The bounding box of the red circle is [0.12, 0.34, 0.56, 0.78].", Box(76.8, 163.2, 358.4, 374.4)),
    ("```\n[ 0.1 , 0.2 , 0.3 , 0.4 ]\n```", Box(64.0, 96.0, 192.0, 192.0)),
    ("[120, 80, 300, 240]", None),  # pixels: not the requested format
    ("I can't see a red circle.", None),
])
def test_parse_answers_in_the_requested_format(adapter: Mistral3Adapter, answer: str, expected: Box | None) -> None:
    assert_parses_to(adapter, answer, BoxFrame(image_size=(640, 480)), expected)
