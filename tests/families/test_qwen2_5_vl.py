"""Qwen2.5-VL adapter: fixture, head geometry, layout experiment, prompt, JSON boxes in resized-input pixels."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from tests.conftest import noise_image
from tests.families.checks import (
    SMART_RESIZE_LAYOUT_CASES,
    assert_fixture_is_registered,
    assert_hidden_split_head_geometry,
    assert_image_grid_prompt_generates,
    assert_parses_to,
    assert_round_trip,
)
from vrh_interp.boxes import Box, BoxParseFailure, InvalidBoxError
from vrh_interp.families.base import BoxFrame
from vrh_interp.families.qwen2_5_vl import Qwen25VLAdapter
from vrh_interp.testing.layout_probe import check_layout_by_painting, nearest_resampling
from vrh_interp.testing.tiny import TinyVLM
from vrh_interp.testing.tiny.qwen2_5_vl import build

# Pixel budget of Qwen/Qwen2.5-VL-7B-Instruct's preprocessor_config.json.
HUB_MIN_PIXELS, HUB_MAX_PIXELS = 3136, 12845056


@pytest.fixture(scope="module")
def tiny() -> TinyVLM:
    return nearest_resampling(build(seed=0))


@pytest.fixture(scope="module")
def adapter(tiny: TinyVLM) -> Qwen25VLAdapter:
    return Qwen25VLAdapter(tiny.model.config)


def test_fixture_is_the_real_family_and_registry_picks_the_adapter(tiny: TinyVLM) -> None:
    assert_fixture_is_registered(tiny, Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessorPil, Qwen25VLAdapter)


def test_geometry_and_attention_path_match_the_model(tiny: TinyVLM, adapter: Qwen25VLAdapter) -> None:
    assert_hidden_split_head_geometry(tiny, adapter)


@pytest.mark.parametrize(("image_size", "box"), SMART_RESIZE_LAYOUT_CASES)
def test_layout_equals_tokens_changed_by_painting_the_box(tiny: TinyVLM, adapter: Qwen25VLAdapter,
                                                          image_size: tuple[int, int], box: Box) -> None:
    assert check_layout_by_painting(tiny, adapter, noise_image(*image_size, seed=image_size[0]), box)


def test_box_frame_is_the_resized_input_of_each_row(tiny: TinyVLM, adapter: Qwen25VLAdapter) -> None:
    sizes = [(300, 170), (97, 203)]
    prompt = adapter.grounding_prompt(tiny.processor, "x")
    encoding = adapter.encode(tiny.processor, [noise_image(*size) for size in sizes], [prompt, prompt])
    for row, size in enumerate(sizes):
        frame = adapter.box_frame(encoding, size, batch_index=row)
        layout = adapter.visual_layout(encoding, size, tiny.processor, batch_index=row)
        _frames, grid_h, grid_w = encoding["image_grid_thw"][row].tolist()
        assert frame.input_size == layout.input_size == (grid_w * 14, grid_h * 14)
        assert frame.image_size == size
    with pytest.raises(ValueError, match="resized model input"):
        adapter.box_frame(None, (300, 170))
    with pytest.raises(ValueError, match="input_size"):
        adapter.parse_box('{"bbox_2d": [1, 2, 3, 4]}', BoxFrame(image_size=(300, 170)))


def test_boxes_outside_the_image_are_refused(adapter: Qwen25VLAdapter) -> None:
    frame = BoxFrame(image_size=(300, 170), input_size=(252, 140))
    with pytest.raises(InvalidBoxError, match="outside"):
        adapter.format_box(Box(250, 0, 301, 10), frame)


def test_grounding_prompt_uses_the_chat_template_and_generates(tiny: TinyVLM, adapter: Qwen25VLAdapter) -> None:
    prompt = adapter.grounding_prompt(tiny.processor, "the red cube")
    assert ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
            "Locate the red cube, output its bbox coordinates using JSON format.<|im_end|>") in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    assert_image_grid_prompt_generates(tiny, adapter, prompt)


def test_format_box_writes_resized_input_pixels(adapter: Qwen25VLAdapter) -> None:
    frame = BoxFrame(image_size=(1000, 500), input_size=(504, 252))
    assert adapter.format_box(Box(100, 50, 500, 250), frame) == (
        '```json\n[\n\t{"bbox_2d": [50, 25, 252, 126]}\n]\n```'
    )


@st.composite
def boxes_in_resized_frames(draw: st.DrawFn) -> tuple[Box, BoxFrame]:
    """A box at least two resized-pixel steps wide and high, in a frame sized by the hub processor's policy."""
    width, height = draw(st.integers(28, 4000)), draw(st.integers(28, 4000))  # aspect ratio < 200
    resized_h, resized_w = smart_resize(height, width, 28, HUB_MIN_PIXELS, HUB_MAX_PIXELS)
    min_w, min_h = 2 * width / resized_w, 2 * height / resized_h
    x1 = draw(st.floats(0, width - min_w))
    y1 = draw(st.floats(0, height - min_h))
    x2 = draw(st.floats(x1 + min_w, width))
    y2 = draw(st.floats(y1 + min_h, height))
    return Box(x1, y1, x2, y2), BoxFrame(image_size=(width, height), input_size=(resized_w, resized_h))


@settings(max_examples=200, deadline=None)
@given(boxes_in_resized_frames())
def test_format_then_parse_round_trips_within_one_step(adapter: Qwen25VLAdapter, case: tuple[Box, BoxFrame]) -> None:
    box, frame = case
    (width, height), (resized_w, resized_h) = frame.image_size, frame.input_size
    assert_round_trip(adapter, box, frame, (width / resized_w, height / resized_h))


NEAR_MISSES = st.sampled_from([
    '{"bbox_2d": [1, 2, 3]}', '{"bbox_2d": [1, 2, 3, 4', '{"bbox_2d": 1, 2, 3, 4}', '"bbox_2d": [-1, 2, 3, 4]',
    '"bbox_2d": [9, 9, 3, 4]', '"bbox_2d": [1, 2, 3, 4000]', '[{"bbox_2d": ["1", "2", "3", "4"]}]',
    '"bbox_2d": [' + "9" * 400 + ', 1, 2, 3]', "```json\n[\n]\n```", '{"point_2d": [10, 20]}',
])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), NEAR_MISSES, st.builds("".join, st.lists(st.sampled_from(list('[]{}"bbox_2d:0123456789,. -'))))))
def test_parse_never_raises(adapter: Qwen25VLAdapter, text: str) -> None:
    frame = BoxFrame(image_size=(640, 480), input_size=(644, 476))
    assert isinstance(adapter.parse_box(text, frame), (Box, BoxParseFailure))


@pytest.mark.parametrize(("answer", "expected"), [
    # Qwen2.5-VL cookbook (spatial understanding) answer shape; input 1288x728 is half the original size.
    ('```json\n[\n\t{"bbox_2d": [1030, 65, 1265, 300], "label": "top right brown cake"}\n]\n```',
     Box(2060, 130, 2530, 600)),
    ('[{"bbox_2d": [0, 0, 1288, 728], "label": "the whole image"}]', Box(0, 0, 2576, 1456)),
    # First box of several; key order and spacing vary.
    ('[{"label": "a", "bbox_2d":[10,20,30,40]}, {"label": "b", "bbox_2d": [50, 60, 70, 80]}]', Box(20, 40, 60, 80)),
    # A bare list (no key) and word-level decoding with spaces.
    ("[ 100 , 200 , 300 , 400 ]", Box(200, 400, 600, 800)),
    # Values beyond the resized input (1288x728) are not rescaled by guessing: they fail.
    ('{"bbox_2d": [1030, 65, 1265, 900]}', None),
    ('{"bbox_2d": [1030, 65, 1030, 300]}', None),  # zero width
    ("The cake is on the top right.", None),
])
def test_parse_documented_answers(adapter: Qwen25VLAdapter, answer: str, expected: Box | None) -> None:
    assert_parses_to(adapter, answer, BoxFrame(image_size=(2576, 1456), input_size=(1288, 728)), expected)
