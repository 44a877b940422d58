"""Gemma 3 adapter: fixture, head geometry, pooled and pan & scan layout experiments, prompt, box_2d format."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from transformers import Gemma3ForConditionalGeneration, Gemma3ImageProcessorPil

from tests.conftest import noise_image
from tests.families.checks import (
    assert_fixture_is_registered,
    assert_generates,
    assert_parses_to,
    assert_round_trip,
    boxes_in_images,
    encode_noise_image,
    text_config_geometry,
)
from vrh_interp.boxes import Box, BoxParseFailure, InvalidBoxError
from vrh_interp.families.base import BoxFrame
from vrh_interp.families.gemma3 import Gemma3Adapter
from vrh_interp.testing.layout_probe import check_layout_by_painting, nearest_resampling
from vrh_interp.testing.tiny import TinyVLM
from vrh_interp.testing.tiny.gemma3 import IMAGE_SIZE, TOKENS_PER_IMAGE, build

# The image is stretched to 64 x 64 and pooled to 4 x 4 tokens. Box edges sit near token centres so
# NEAREST sampling of the downscaled image cannot miss a sliver of the box.
LAYOUT_CASES = [
    ((150, 70), Box(19, 9, 94, 44)),
    ((150, 70), Box(131, 61, 150, 70)),  # bottom-right corner
    ((37, 101), Box(5, 13, 23, 88)),
    ((64, 64), Box(0, 0, 64, 64)),
]
# Pan & scan (default processor settings: crops >= 256 px, at most 4, aspect >= 1.2): 900x300 -> 3 strips
# of 300 px, 300x1000 -> 3 strips of 334 px (the last 332), 1100x280 -> 4 strips of 275 px.
PAN_AND_SCAN_CASES = [
    ((900, 300), Box(337, 37, 712, 262), 3),  # spans crops 1 and 2
    ((300, 1000), Box(112, 300, 188, 700), 3),  # spans all three stacked crops
    ((1100, 280), Box(0, 0, 240, 100), 4),  # top-left corner, inside crop 0
]


@pytest.fixture(scope="module")
def tiny() -> TinyVLM:
    return nearest_resampling(build(seed=0))


@pytest.fixture(scope="module")
def adapter(tiny: TinyVLM) -> Gemma3Adapter:
    return Gemma3Adapter(tiny.model.config)


@pytest.fixture(scope="module")
def pan_and_scan_adapter(tiny: TinyVLM) -> Gemma3Adapter:
    return Gemma3Adapter(tiny.model.config, do_pan_and_scan=True)


def test_fixture_is_the_real_family_and_registry_picks_the_adapter(tiny: TinyVLM) -> None:
    registered = assert_fixture_is_registered(tiny, Gemma3ForConditionalGeneration, Gemma3ImageProcessorPil,
                                              Gemma3Adapter)
    assert not registered.do_pan_and_scan
    assert tiny.model.model.multi_modal_projector.mm_input_projection_weight.abs().sum() > 0


def test_geometry_and_attention_path_match_the_model(tiny: TinyVLM, adapter: Gemma3Adapter) -> None:
    text_config = tiny.model.config.get_text_config()
    assert adapter.geometry() == text_config_geometry(text_config, text_config.head_dim)
    attention = adapter.attention_module(tiny.model, 1)
    assert attention is tiny.model.model.language_model.layers[1].self_attn
    assert adapter.output_projection(tiny.model, 1).in_features == text_config.num_attention_heads * attention.head_dim
    assert attention.scaling == text_config.query_pre_attn_scalar ** -0.5
    assert [layer.self_attn.sliding_window for layer in tiny.model.model.language_model.layers] == [
        text_config.sliding_window, None]
    assert adapter.non_causal_image_attention
    assert adapter.tokens_per_side() ** 2 == tiny.model.config.mm_tokens_per_image


@pytest.mark.parametrize(("image_size", "box"), LAYOUT_CASES)
def test_layout_equals_tokens_changed_by_painting_the_box(tiny: TinyVLM, adapter: Gemma3Adapter,
                                                          image_size: tuple[int, int], box: Box) -> None:
    assert check_layout_by_painting(tiny, adapter, noise_image(*image_size, seed=image_size[0]), box)


@pytest.mark.parametrize(("image_size", "box", "num_crops"), PAN_AND_SCAN_CASES)
def test_pan_and_scan_layout_equals_tokens_changed_by_painting_the_box(
        tiny: TinyVLM, pan_and_scan_adapter: Gemma3Adapter, image_size: tuple[int, int], box: Box,
        num_crops: int) -> None:
    image = noise_image(*image_size, seed=image_size[0])
    encoding = pan_and_scan_adapter.encode(tiny.processor, [image],
                                           [pan_and_scan_adapter.grounding_prompt(tiny.processor, "the object")])
    assert encoding["pixel_values"].shape[0] == 1 + num_crops
    layout = pan_and_scan_adapter.visual_layout(encoding, image_size, tiny.processor)
    assert [block.name for block in layout.blocks] == ["image"] + [f"crop_{i}" for i in range(num_crops)]
    check_layout_by_painting(tiny, pan_and_scan_adapter, image, box)


def test_pan_and_scan_crops_split_the_long_side(tiny: TinyVLM, pan_and_scan_adapter: Gemma3Adapter) -> None:
    encoding = pan_and_scan_adapter.encode(tiny.processor, [noise_image(300, 1000)],
                                           [pan_and_scan_adapter.grounding_prompt(tiny.processor, "x")])
    layout = pan_and_scan_adapter.visual_layout(encoding, (300, 1000), tiny.processor)
    assert [block.region for block in layout.blocks] == [
        (0.0, 0.0, 300.0, 1000.0), (0.0, 0.0, 300.0, 334.0), (0.0, 334.0, 300.0, 668.0), (0.0, 668.0, 300.0, 1000.0)]
    assert len(layout.visual_positions) == 4 * TOKENS_PER_IMAGE


def test_one_pooled_block_between_boi_and_eoi(tiny: TinyVLM, adapter: Gemma3Adapter) -> None:
    encoding = encode_noise_image(tiny, adapter, (150, 70))
    layout = adapter.visual_layout(encoding, (150, 70), tiny.processor)
    ids = encoding["input_ids"][0].tolist()
    tokenizer = tiny.processor.tokenizer
    first = ids.index(tokenizer.boi_token_id) + 1
    assert layout.visual_positions == tuple(range(first, first + TOKENS_PER_IMAGE))
    assert ids[first + TOKENS_PER_IMAGE] == tokenizer.eoi_token_id
    # token_type_ids mark exactly the image block attended bidirectionally.
    assert encoding["token_type_ids"][0].nonzero().flatten().tolist() == list(layout.visual_positions)
    (block,) = layout.blocks
    assert (block.rows, block.cols, block.region) == (4, 4, (0.0, 0.0, 150.0, 70.0))
    assert layout.input_size == (IMAGE_SIZE, IMAGE_SIZE)


def test_batch_encodes_one_image_per_prompt(tiny: TinyVLM, adapter: Gemma3Adapter) -> None:
    sizes = [(150, 70), (37, 101)]
    prompts = [adapter.grounding_prompt(tiny.processor, "x"), adapter.grounding_prompt(tiny.processor, "a longer x")]
    encoding = adapter.encode(tiny.processor, [noise_image(*size) for size in sizes], prompts)
    assert encoding["pixel_values"].shape[0] == 2
    image_id = adapter.image_token_id(tiny.processor)
    for row, size in enumerate(sizes):
        layout = adapter.visual_layout(encoding, size, tiny.processor, batch_index=row)
        assert list(layout.visual_positions) == (encoding["input_ids"][row] == image_id).nonzero().flatten().tolist()
        assert [block.region for block in layout.blocks] == [(0.0, 0.0, float(size[0]), float(size[1]))]


def test_boxes_outside_the_image_are_refused(tiny: TinyVLM, adapter: Gemma3Adapter) -> None:
    encoding = encode_noise_image(tiny, adapter, (150, 70))
    layout = adapter.visual_layout(encoding, (150, 70), tiny.processor)
    with pytest.raises(InvalidBoxError, match="outside"):
        layout.positions_for_box(Box(100, 10, 160, 60))
    with pytest.raises(InvalidBoxError, match="outside"):
        adapter.format_box(Box(0, -5, 10, 20), BoxFrame(image_size=(150, 70)))


def test_grounding_prompt_uses_the_chat_template_and_generates(tiny: TinyVLM, adapter: Gemma3Adapter) -> None:
    prompt = adapter.grounding_prompt(tiny.processor, "the red cube")
    assert prompt.startswith("<bos><start_of_turn>user\n<start_of_image>Detect the red cube.")
    assert '{"box_2d": [y_min, x_min, y_max, x_max]}' in prompt
    assert prompt.endswith("<end_of_turn>\n<start_of_turn>model\n")
    encoding = adapter.encode(tiny.processor, [noise_image(150, 70)], [prompt])
    assert_generates(tiny, encoding)


@settings(max_examples=200, deadline=None)
@given(boxes_in_images(1000))
def test_format_then_parse_round_trips_within_one_step(adapter: Gemma3Adapter,
                                                       case: tuple[Box, tuple[int, int]]) -> None:
    box, (width, height) = case
    assert_round_trip(adapter, box, BoxFrame(image_size=(width, height)), (width / 1000 / 2, height / 1000 / 2))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.builds("".join, st.lists(st.sampled_from(
    ['"box_2d"', "box_2d", ":", "[", "]", ",", " ", "0", "1000", "12", "-", ".", "{", "}"])))))
def test_parse_never_raises(adapter: Gemma3Adapter, text: str) -> None:
    assert isinstance(adapter.parse_box(text, BoxFrame(image_size=(640, 480))), (Box, BoxParseFailure))


@pytest.mark.parametrize(("answer", "expected"), [
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
])
def test_parse_chosen_format_answers(adapter: Gemma3Adapter, answer: str, expected: Box | None) -> None:
    assert_parses_to(adapter, answer, BoxFrame(image_size=(1000, 500)), expected)
