"""Qwen3-VL adapter: fixture, head geometry, layout experiment (factor 32), prompt, JSON boxes 0-1000."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from transformers import Qwen2VLImageProcessorPil, Qwen3VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from tests.conftest import noise_image
from tests.families.checks import (
    SMART_RESIZE_LAYOUT_CASES,
    assert_fixture_is_registered,
    assert_image_grid_prompt_generates,
    assert_parses_to,
    assert_round_trip,
    boxes_in_images,
    encode_noise_image,
    text_config_geometry,
)
from vrh_interp.boxes import Box, BoxParseFailure, InvalidBoxError
from vrh_interp.families.base import BoxFrame
from vrh_interp.families.qwen3_vl import Qwen3VLAdapter
from vrh_interp.testing.layout_probe import check_layout_by_painting, nearest_resampling
from vrh_interp.testing.tiny import TinyVLM
from vrh_interp.testing.tiny.qwen2_vl import TINY_MIN_PIXELS
from vrh_interp.testing.tiny.qwen3_vl import TINY_MAX_PIXELS, build


@pytest.fixture(scope="module")
def tiny() -> TinyVLM:
    return nearest_resampling(build(seed=0))


@pytest.fixture(scope="module")
def adapter(tiny: TinyVLM) -> Qwen3VLAdapter:
    return Qwen3VLAdapter(tiny.model.config)


def test_fixture_is_the_real_family_and_registry_picks_the_adapter(tiny: TinyVLM) -> None:
    assert_fixture_is_registered(tiny, Qwen3VLForConditionalGeneration, Qwen2VLImageProcessorPil, Qwen3VLAdapter)
    assert tiny.processor.image_processor.patch_size == 16


def test_geometry_reads_head_dim_from_the_config(tiny: TinyVLM, adapter: Qwen3VLAdapter) -> None:
    text_config = tiny.model.config.get_text_config()
    assert adapter.geometry() == text_config_geometry(text_config, text_config.head_dim)
    attention = adapter.attention_module(tiny.model, 1)
    assert attention is tiny.model.model.language_model.layers[1].self_attn
    assert attention.head_dim == text_config.head_dim
    assert adapter.output_projection(tiny.model, 1).in_features == text_config.num_attention_heads * text_config.head_dim


@pytest.mark.parametrize(("image_size", "box"), SMART_RESIZE_LAYOUT_CASES)
def test_layout_equals_tokens_changed_by_painting_the_box(tiny: TinyVLM, adapter: Qwen3VLAdapter,
                                                          image_size: tuple[int, int], box: Box) -> None:
    assert check_layout_by_painting(tiny, adapter, noise_image(*image_size, seed=image_size[0]), box)


@pytest.mark.parametrize("image_size", [(300, 170), (97, 203), (50, 40)])
def test_layout_grid_follows_smart_resize_with_factor_32(tiny: TinyVLM, adapter: Qwen3VLAdapter,
                                                        image_size: tuple[int, int]) -> None:
    width, height = image_size
    encoding = encode_noise_image(tiny, adapter, (width, height))
    layout = adapter.visual_layout(encoding, image_size, tiny.processor)
    resized_h, resized_w = smart_resize(height, width, 32, TINY_MIN_PIXELS, TINY_MAX_PIXELS)
    (block,) = layout.blocks
    assert (block.rows, block.cols) == (resized_h // 32, resized_w // 32)
    assert layout.input_size == (resized_w, resized_h)


def test_boxes_outside_the_image_are_refused(adapter: Qwen3VLAdapter) -> None:
    with pytest.raises(InvalidBoxError, match="outside"):
        adapter.format_box(Box(-5, 0, 10, 10), BoxFrame(image_size=(300, 170)))


def test_grounding_prompt_uses_the_chat_template_and_generates(tiny: TinyVLM, adapter: Qwen3VLAdapter) -> None:
    prompt = adapter.grounding_prompt(tiny.processor, "the red cube")
    assert prompt == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
        "Locate the red cube, output its bbox coordinates using JSON format.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert_image_grid_prompt_generates(tiny, adapter, prompt)


def test_format_box_writes_relative_json(adapter: Qwen3VLAdapter) -> None:
    frame = BoxFrame(image_size=(2000, 500))
    assert adapter.format_box(Box(100, 50, 2000, 250), frame) == (
        '```json\n[\n\t{"bbox_2d": [50, 100, 1000, 500]}\n]\n```'
    )


@settings(max_examples=200, deadline=None)
@given(boxes_in_images(1000))
def test_format_then_parse_round_trips_within_one_step(adapter: Qwen3VLAdapter,
                                                       case: tuple[Box, tuple[int, int]]) -> None:
    box, (width, height) = case
    assert_round_trip(adapter, box, BoxFrame(image_size=(width, height)), (width / 1000, height / 1000))


NEAR_MISSES = st.sampled_from([
    '{"bbox_2d": [1, 2, 3]}', '{"bbox_2d": [1, 2, 3, 4', '"bbox_2d": [1, 2, 3, 1001]', '"bbox_2d": [9, 9, 3, 4]',
    '"bbox_2d": [-1, 2, 3, 4]', '"bbox_2d": [' + "9" * 400 + ', 1, 2, 3]', '{"point_2d": [10, 20]}',
])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), NEAR_MISSES, st.builds("".join, st.lists(st.sampled_from(list('[]{}"bbox_2d:0123456789,. -'))))))
def test_parse_never_raises(adapter: Qwen3VLAdapter, text: str) -> None:
    assert isinstance(adapter.parse_box(text, BoxFrame(image_size=(640, 480))), (Box, BoxParseFailure))


@pytest.mark.parametrize(("answer", "expected"), [
    # Qwen3-VL cookbook answer shape, 0-1000 relative to the original 2000x1000 image.
    ('```json\n[\n\t{"bbox_2d": [515, 65, 632, 300], "label": "top right brown cake"}\n]\n```',
     Box(1030, 65, 1264, 300)),
    ('[{"bbox_2d": [0, 0, 1000, 1000], "label": "image"}]', Box(0, 0, 2000, 1000)),
    ('[{"label": "a", "bbox_2d":[10,20,30,40]}, {"label": "b", "bbox_2d": [50, 60, 70, 80]}]', Box(20, 20, 60, 40)),
    ("[ 100 , 200 , 300 , 400 ]", Box(200, 200, 600, 400)),
    # Pixel values beyond 1000 are not rescaled by guessing: they fail.
    ('{"bbox_2d": [1030, 65, 1265, 300]}', None),
    ("There is no cake.", None),
])
def test_parse_documented_answers(adapter: Qwen3VLAdapter, answer: str, expected: Box | None) -> None:
    assert_parses_to(adapter, answer, BoxFrame(image_size=(2000, 1000)), expected)
