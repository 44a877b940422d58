"""Qwen2-VL adapter: fixture, head geometry, layout experiment, prompt, native box format."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from transformers import Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from tests.conftest import noise_image
from tests.families.checks import (
    SMART_RESIZE_LAYOUT_CASES,
    assert_fixture_is_registered,
    assert_hidden_split_head_geometry,
    assert_image_grid_prompt_generates,
    assert_parses_to,
    assert_round_trip,
    boxes_in_images,
    encode_noise_image,
)
from vrh_interp.boxes import Box, BoxParseFailure, InvalidBoxError
from vrh_interp.families.base import BoxFrame
from vrh_interp.families.qwen2_vl import Qwen2VLAdapter
from vrh_interp.testing.layout_probe import check_layout_by_painting, nearest_resampling
from vrh_interp.testing.tiny import TinyVLM
from vrh_interp.testing.tiny.qwen2_vl import TINY_MAX_PIXELS, TINY_MIN_PIXELS, build


@pytest.fixture(scope="module")
def tiny() -> TinyVLM:
    return nearest_resampling(build(seed=0))


@pytest.fixture(scope="module")
def adapter(tiny: TinyVLM) -> Qwen2VLAdapter:
    return Qwen2VLAdapter(tiny.model.config)


def test_fixture_is_the_real_family_and_registry_picks_the_adapter(tiny: TinyVLM) -> None:
    assert_fixture_is_registered(tiny, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil, Qwen2VLAdapter)


def test_geometry_and_attention_path_match_the_model(tiny: TinyVLM, adapter: Qwen2VLAdapter) -> None:
    assert_hidden_split_head_geometry(tiny, adapter)


@pytest.mark.parametrize(("image_size", "box"), SMART_RESIZE_LAYOUT_CASES)
def test_layout_equals_tokens_changed_by_painting_the_box(tiny: TinyVLM, adapter: Qwen2VLAdapter,
                                                          image_size: tuple[int, int], box: Box) -> None:
    assert check_layout_by_painting(tiny, adapter, noise_image(*image_size, seed=image_size[0]), box)


@pytest.mark.parametrize("image_size", [(300, 170), (97, 203), (50, 40), (1000, 30)])
def test_layout_grid_follows_smart_resize(tiny: TinyVLM, adapter: Qwen2VLAdapter, image_size: tuple[int, int]) -> None:
    width, height = image_size
    encoding = adapter.encode(tiny.processor, [noise_image(width, height)],
                              [adapter.grounding_prompt(tiny.processor, "x")])
    layout = adapter.visual_layout(encoding, image_size, tiny.processor)
    resized_h, resized_w = smart_resize(height, width, 28, TINY_MIN_PIXELS, TINY_MAX_PIXELS)
    (block,) = layout.blocks
    assert (block.rows, block.cols) == (resized_h // 28, resized_w // 28)
    assert layout.input_size == (resized_w, resized_h)
    assert block.region == (0.0, 0.0, float(width), float(height))
    image_token_id = adapter.image_token_id(tiny.processor)
    assert list(layout.visual_positions) == (encoding["input_ids"][0] == image_token_id).nonzero().flatten().tolist()


def test_boxes_outside_the_image_are_refused(tiny: TinyVLM, adapter: Qwen2VLAdapter) -> None:
    encoding = encode_noise_image(tiny, adapter, (300, 170))
    layout = adapter.visual_layout(encoding, (300, 170), tiny.processor)
    with pytest.raises(InvalidBoxError, match="outside"):
        layout.positions_for_box(Box(200, 100, 310, 170))
    with pytest.raises(InvalidBoxError, match="outside"):
        adapter.format_box(Box(0, 0, 10, 200), BoxFrame(image_size=(300, 170)))
    with pytest.raises(InvalidBoxError, match="zero or negative area"):
        Box(10, 10, 10, 20)


def test_grounding_prompt_uses_the_chat_template_and_generates(tiny: TinyVLM, adapter: Qwen2VLAdapter) -> None:
    prompt = adapter.grounding_prompt(tiny.processor, "the red cube")
    assert "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>" in prompt
    assert "Find <|object_ref_start|>the red cube<|object_ref_end|><|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    assert_image_grid_prompt_generates(tiny, adapter, prompt)


@settings(max_examples=200, deadline=None)
@given(boxes_in_images(1000))
def test_format_then_parse_round_trips_within_one_step(adapter: Qwen2VLAdapter,
                                                       case: tuple[Box, tuple[int, int]]) -> None:
    box, (width, height) = case
    assert_round_trip(adapter, box, BoxFrame(image_size=(width, height)), (width / 1000, height / 1000))


NEAR_MISSES = st.sampled_from([
    "<|box_start|>(1,2),(3<|box_end|>", "(1,2),(3,4", "(1,2)(3,4)", "((1,2),(3,4))", "(-5,2),(3,4)",
    "(1000,1000),(0,0)", "(5,5),(5,9)", "(1.5e3,2),(3,4)", "(" + "9" * 400 + ",1),(2,3)", "(,),(,)",
])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), NEAR_MISSES, st.builds("".join, st.lists(st.sampled_from(list("()0123456789,. -<|>"))))))
def test_parse_never_raises(adapter: Qwen2VLAdapter, text: str) -> None:
    assert isinstance(adapter.parse_box(text, BoxFrame(image_size=(640, 480))), (Box, BoxParseFailure))


@pytest.mark.parametrize(("answer", "expected"), [
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
])
def test_parse_documented_answers(adapter: Qwen2VLAdapter, answer: str, expected: Box | None) -> None:
    assert_parses_to(adapter, answer, BoxFrame(image_size=(2000, 1000)), expected)
