"""Aya Vision adapter: fixture, head geometry, tiled layout experiment, prompt, plain 0-1 box format."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from transformers import AyaVisionForConditionalGeneration, GotOcr2ImageProcessorPil

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
from vrh_interp.families.aya_vision import AyaVisionAdapter
from vrh_interp.families.base import BoxFrame
from vrh_interp.testing.layout_probe import check_layout_by_painting, nearest_resampling
from vrh_interp.testing.tiny import TinyVLM
from vrh_interp.testing.tiny.aya_vision import build

TOKENS_PER_TILE = 16
# Tiles are 56 px with 4 x 4 tokens: 150x70 -> 2x1 tiles + global, 200x130 -> 3x2 + global, 70x150 -> 1x2 +
# global, 40x40 -> one tile. Box edges sit a few pixels away from token edges (the global thumbnail
# downscales, and NEAREST sampling can miss a sliver narrower than one resized pixel).
LAYOUT_CASES = [
    ((150, 70), Box(60, 20, 100, 60)),  # spans both tiles
    ((200, 130), Box(58, 55, 92, 76)),  # spans the four tiles around an inner tile corner
    ((200, 130), Box(190, 120, 200, 130)),  # bottom-right image corner
    ((70, 150), Box(0, 60, 30, 90)),  # spans the two stacked tiles, at the left edge
    ((40, 40), Box(5, 5, 25, 25)),
]


@pytest.fixture(scope="module")
def tiny() -> TinyVLM:
    return nearest_resampling(build(seed=0))


@pytest.fixture(scope="module")
def adapter(tiny: TinyVLM) -> AyaVisionAdapter:
    return AyaVisionAdapter(tiny.model.config)


def test_fixture_is_the_real_family_and_registry_picks_the_adapter(tiny: TinyVLM) -> None:
    assert_fixture_is_registered(tiny, AyaVisionForConditionalGeneration, GotOcr2ImageProcessorPil, AyaVisionAdapter)


def test_geometry_and_attention_path_match_the_model(tiny: TinyVLM, adapter: AyaVisionAdapter) -> None:
    text_config = tiny.model.config.get_text_config()
    attention = adapter.attention_module(tiny.model, 1)
    assert attention is tiny.model.model.language_model.layers[1].self_attn
    # Cohere2's config has no head_dim: the attention module derives it from hidden_size.
    assert adapter.geometry() == text_config_geometry(text_config, attention.head_dim)
    assert adapter.output_projection(tiny.model, 1).in_features == text_config.num_attention_heads * attention.head_dim
    assert adapter.tokens_per_tile() == (4, 4)
    assert adapter.image_token_id(tiny.processor) == tiny.model.config.image_token_id


@pytest.mark.parametrize(("image_size", "box"), LAYOUT_CASES)
def test_layout_equals_tokens_changed_by_painting_the_box(tiny: TinyVLM, adapter: AyaVisionAdapter,
                                                          image_size: tuple[int, int], box: Box) -> None:
    assert check_layout_by_painting(tiny, adapter, noise_image(*image_size, seed=image_size[0]), box)


def test_tiles_are_row_major_with_the_global_image_last(tiny: TinyVLM, adapter: AyaVisionAdapter) -> None:
    encoding = encode_noise_image(tiny, adapter, (200, 130))
    assert encoding["pixel_values"].shape[0] == 7
    layout = adapter.visual_layout(encoding, (200, 130), tiny.processor)
    patch_id = adapter.image_token_id(tiny.processor)
    assert list(layout.visual_positions) == (encoding["input_ids"][0] == patch_id).nonzero().flatten().tolist()
    assert [block.region for block in layout.blocks] == [
        (c * 200 / 3, r * 130 / 2, (c + 1) * 200 / 3, (r + 1) * 130 / 2) for r in range(2) for c in range(3)
    ] + [(0.0, 0.0, 200.0, 130.0)]
    # A TILE_k / TILE_GLOBAL text marker separates consecutive blocks: positions jump between blocks.
    starts = [block.positions[0] for block in layout.blocks]
    ends = [block.positions[-1] for block in layout.blocks]
    assert all(start > end + 1 for start, end in zip(starts[1:], ends[:-1]))
    assert all(len(block.positions) == TOKENS_PER_TILE for block in layout.blocks)


def test_boxes_outside_the_image_are_refused(tiny: TinyVLM, adapter: AyaVisionAdapter) -> None:
    encoding = encode_noise_image(tiny, adapter, (150, 70))
    layout = adapter.visual_layout(encoding, (150, 70), tiny.processor)
    with pytest.raises(InvalidBoxError, match="outside"):
        layout.positions_for_box(Box(-3, 10, 60, 60))
    with pytest.raises(InvalidBoxError, match="outside"):
        adapter.format_box(Box(0, 0, 160, 10), BoxFrame(image_size=(150, 70)))


def test_grounding_prompt_uses_the_chat_template_and_generates(tiny: TinyVLM, adapter: AyaVisionAdapter) -> None:
    prompt = adapter.grounding_prompt(tiny.processor, "the red cube")
    assert prompt.startswith("<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|><image>Locate the red cube in the image.")
    assert "[x1, y1, x2, y2]" in prompt
    assert prompt.endswith("<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")
    encoding = adapter.encode(tiny.processor, [noise_image(150, 70)], [prompt])
    text = tiny.processor.tokenizer.decode(encoding["input_ids"][0])
    assert "<|START_OF_IMG|>TILE_1" in text and "TILE_2" in text and "TILE_GLOBAL<|IMG_PATCH|>" in text
    assert int((encoding["input_ids"] == adapter.image_token_id(tiny.processor)).sum()) == 3 * TOKENS_PER_TILE
    assert_generates(tiny, encoding)


@settings(max_examples=200, deadline=None)
@given(boxes_in_images(100))
def test_format_then_parse_round_trips_within_one_step(adapter: AyaVisionAdapter,
                                                       case: tuple[Box, tuple[int, int]]) -> None:
    box, (width, height) = case
    assert_round_trip(adapter, box, BoxFrame(image_size=(width, height)), (width / 100 / 2, height / 100 / 2))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(),
                 st.builds("".join, st.lists(st.sampled_from(["[", "]", ",", " ", "0", ".", "5", "1", "-"])))))
def test_parse_never_raises(adapter: AyaVisionAdapter, text: str) -> None:
    assert isinstance(adapter.parse_box(text, BoxFrame(image_size=(640, 480))), (Box, BoxParseFailure))


@pytest.mark.parametrize(("answer", "expected"), [
    ("[0.123, 0.456, 0.789, 1.0]", Box(123, 228, 789, 500)),
    ("The red cube is at [0.1, 0.2, 0.3, 0.4].", Box(100, 100, 300, 200)),
    ("[ 0.12 , 0.34 , 0.56 , 0.78 ]", Box(120, 170, 560, 390)),  # word-level decoding
    ("[0.5, 0.5, 0.2, 0.9]", None),  # x2 < x1
    ("[120, 340, 560, 780]", None),  # 0-1000 integers are outside the 0-1 frame
    ("(0.1, 0.2, 0.3, 0.4)", None),  # not a bracketed list
    ("There is no red cube.", None),
])
def test_parse_chosen_format_answers(adapter: AyaVisionAdapter, answer: str, expected: Box | None) -> None:
    assert_parses_to(adapter, answer, BoxFrame(image_size=(1000, 500)), expected)
