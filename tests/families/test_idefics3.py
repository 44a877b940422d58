"""Idefics3 / SmolVLM adapter: fixtures, head geometry, split-image layout experiment, prompt, box format."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings, strategies as st
from transformers import (
    Idefics3ForConditionalGeneration,
    Idefics3ImageProcessorPil,
    SmolVLMForConditionalGeneration,
    SmolVLMImageProcessorPil,
)

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
from vrh_interp.families.idefics3 import Idefics3Adapter, split_canvas_size
from vrh_interp.testing.layout_probe import check_layout_by_painting, nearest_resampling
from vrh_interp.testing.tiny import TinyVLM
from vrh_interp.testing.tiny.idefics3 import FRAME_SIZE, LONGEST_EDGE, TOKENS_PER_FRAME, build, build_smolvlm

# Longest edge -> 96 px, sides up to multiples of 32, 32 px frames of 4 x 4 tokens:
# 100x60 -> canvas 96x64 (2x3 tiles), 37x101 -> 64x96 (3x2), 20x20 -> 96x96 (3x3, upscaled),
# 500x90 -> 96x32 (1x3), 150x70 -> 96x64 (2x3); the global image comes last. Box edges sit near token
# centres: NEAREST sampling after two resizes can miss a sliver narrower than one resized pixel.
LAYOUT_CASES = [
    ((100, 60), Box(21, 19, 46, 41)),  # spans the four tiles around an inner tile corner
    ((100, 60), Box(88, 49, 100, 60)),  # bottom-right corner
    ((37, 101), Box(7, 21, 30, 46)),  # spans four tiles of a portrait image
    ((20, 20), Box(2, 3, 18, 12)),
    ((500, 90), Box(146, 34, 188, 56)),  # spans the tile edge at x = 166.7
    ((150, 70), Box(0, 0, 150, 70)),  # whole image
]
GRID_CASES = [((100, 60), (2, 3)), ((37, 101), (3, 2)), ((20, 20), (3, 3)), ((500, 90), (1, 3)), ((150, 70), (2, 3))]


@pytest.fixture(scope="module")
def tiny() -> TinyVLM:
    return nearest_resampling(build(seed=0))


@pytest.fixture(scope="module")
def adapter(tiny: TinyVLM) -> Idefics3Adapter:
    return Idefics3Adapter(tiny.model.config)


def test_fixture_is_the_real_family_and_registry_picks_the_adapter(tiny: TinyVLM) -> None:
    assert_fixture_is_registered(tiny, Idefics3ForConditionalGeneration, Idefics3ImageProcessorPil, Idefics3Adapter)


def test_geometry_and_attention_path_match_the_model(tiny: TinyVLM, adapter: Idefics3Adapter) -> None:
    text_config = tiny.model.config.get_text_config()
    assert adapter.geometry() == text_config_geometry(text_config, text_config.head_dim)
    attention = adapter.attention_module(tiny.model, 1)
    assert attention is tiny.model.model.text_model.layers[1].self_attn
    assert adapter.output_projection(tiny.model, 1).in_features == text_config.num_attention_heads * attention.head_dim
    assert adapter.tokens_per_side() ** 2 == TOKENS_PER_FRAME == tiny.processor.image_seq_len


@pytest.mark.parametrize(("image_size", "box"), LAYOUT_CASES)
def test_layout_equals_tokens_changed_by_painting_the_box(tiny: TinyVLM, adapter: Idefics3Adapter,
                                                          image_size: tuple[int, int], box: Box) -> None:
    assert check_layout_by_painting(tiny, adapter, noise_image(*image_size, seed=image_size[0]), box)


@pytest.mark.parametrize(("image_size", "grid"), GRID_CASES)
def test_tiles_are_row_major_with_the_global_image_last(tiny: TinyVLM, adapter: Idefics3Adapter,
                                                        image_size: tuple[int, int], grid: tuple[int, int]) -> None:
    width, height = image_size
    rows, cols = grid
    assert split_canvas_size(image_size, LONGEST_EDGE, FRAME_SIZE) == (cols * FRAME_SIZE, rows * FRAME_SIZE)
    encoding = encode_noise_image(tiny, adapter, image_size)
    assert encoding["pixel_values"].shape[1] == rows * cols + 1
    layout = adapter.visual_layout(encoding, image_size, tiny.processor)
    image_id = adapter.image_token_id(tiny.processor)
    assert list(layout.visual_positions) == (encoding["input_ids"][0] == image_id).nonzero().flatten().tolist()
    assert [block.region for block in layout.blocks] == [
        (c * FRAME_SIZE * width / (cols * FRAME_SIZE), r * FRAME_SIZE * height / (rows * FRAME_SIZE),
         (c + 1) * FRAME_SIZE * width / (cols * FRAME_SIZE), (r + 1) * FRAME_SIZE * height / (rows * FRAME_SIZE))
        for r in range(rows) for c in range(cols)
    ] + [(0.0, 0.0, float(width), float(height))]
    assert [block.name for block in layout.blocks][-1] == "global"


def test_batched_rows_with_different_frame_counts(tiny: TinyVLM, adapter: Idefics3Adapter) -> None:
    sizes = [(100, 60), (500, 90)]
    prompt = adapter.grounding_prompt(tiny.processor, "x")
    encoding = adapter.encode(tiny.processor, [noise_image(*size) for size in sizes], [prompt, prompt])
    image_id = adapter.image_token_id(tiny.processor)
    for row, (size, frames) in enumerate(zip(sizes, (7, 4))):
        layout = adapter.visual_layout(encoding, size, tiny.processor, batch_index=row)
        positions = (encoding["input_ids"][row] == image_id).nonzero().flatten().tolist()
        assert list(layout.visual_positions) == positions and len(layout.blocks) == frames
        assert [p for block in layout.blocks for p in block.positions] == positions


def test_frame_markers_sit_between_blocks_and_are_not_visual(tiny: TinyVLM, adapter: Idefics3Adapter) -> None:
    encoding = encode_noise_image(tiny, adapter, (100, 60))
    layout = adapter.visual_layout(encoding, (100, 60), tiny.processor)
    tokenizer = tiny.processor.tokenizer
    ids = encoding["input_ids"][0]
    before = [tokenizer.decode(ids[block.positions[0] - 2:block.positions[0]]) for block in layout.blocks]
    assert before == [f"<fake_token_around_image><row_{r}_col_{c}>" for r in (1, 2) for c in (1, 2, 3)] + [
        "<fake_token_around_image><global-img>"]
    assert all(len(block.positions) == TOKENS_PER_FRAME for block in layout.blocks)


def test_without_splitting_the_image_is_one_global_frame(tiny: TinyVLM, adapter: Idefics3Adapter) -> None:
    prompt = adapter.grounding_prompt(tiny.processor, "x")
    encoding = tiny.processor(images=[noise_image(100, 60)], text=[prompt], return_tensors="pt",
                              do_image_splitting=False)
    layout = adapter.visual_layout(encoding, (100, 60), tiny.processor)
    assert [(b.name, b.rows, b.cols, b.region) for b in layout.blocks] == [("global", 4, 4, (0.0, 0.0, 100.0, 60.0))]


def test_boxes_outside_the_image_are_refused(tiny: TinyVLM, adapter: Idefics3Adapter) -> None:
    layout = adapter.visual_layout(encode_noise_image(tiny, adapter, (100, 60)), (100, 60), tiny.processor)
    with pytest.raises(InvalidBoxError, match="outside"):
        layout.positions_for_box(Box(50, 30, 120, 60))
    with pytest.raises(InvalidBoxError, match="outside"):
        adapter.format_box(Box(0, 0, 10, 61), BoxFrame(image_size=(100, 60)))


def test_grounding_prompt_uses_the_chat_template_and_generates(tiny: TinyVLM, adapter: Idefics3Adapter) -> None:
    prompt = adapter.grounding_prompt(tiny.processor, "the red cube")
    assert prompt.startswith("<|begin_of_text|>User:<image>Locate the red cube in the image.")
    assert "[x1, y1, x2, y2]" in prompt
    assert prompt.endswith("<end_of_utterance>\nAssistant:")
    encoding = adapter.encode(tiny.processor, [noise_image(100, 60)], [prompt])
    assert int((encoding["input_ids"] == adapter.image_token_id(tiny.processor)).sum()) == 7 * TOKENS_PER_FRAME
    assert_generates(tiny, encoding)


def test_smolvlm_variant_uses_the_same_adapter_and_layout() -> None:
    smolvlm = nearest_resampling(build_smolvlm(seed=0))
    adapter = assert_fixture_is_registered(smolvlm, SmolVLMForConditionalGeneration, SmolVLMImageProcessorPil,
                                           Idefics3Adapter)
    assert smolvlm.model.config.model_type == "smolvlm"
    assert adapter.attention_module(smolvlm.model, 0) is smolvlm.model.model.text_model.layers[0].self_attn
    positions = check_layout_by_painting(smolvlm, adapter, noise_image(100, 60, seed=100), Box(21, 19, 46, 41))
    assert len(positions) == 4 * 4 + 2 * 2  # 2x2 tokens in each of the four tiles around the corner, 2x2 global


@settings(max_examples=200, deadline=None)
@given(boxes_in_images(100))
def test_format_then_parse_round_trips_within_one_step(adapter: Idefics3Adapter,
                                                       case: tuple[Box, tuple[int, int]]) -> None:
    box, (width, height) = case
    text = assert_round_trip(adapter, box, BoxFrame(image_size=(width, height)), (width / 100 / 2, height / 100 / 2))
    assert re.fullmatch(r"\[[01]\.\d\d, [01]\.\d\d, [01]\.\d\d, [01]\.\d\d\]", text)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(),
                 st.builds("".join, st.lists(st.sampled_from(["[", "]", ",", " ", "0", ".", "5", "1", "-"])))))
def test_parse_never_raises(adapter: Idefics3Adapter, text: str) -> None:
    assert isinstance(adapter.parse_box(text, BoxFrame(image_size=(640, 480))), (Box, BoxParseFailure))


@pytest.mark.parametrize(("answer", "expected"), [
    ("[0.123, 0.456, 0.789, 1.0]", Box(123, 228, 789, 500)),
    ("The red cube is at [0.1, 0.2, 0.3, 0.4].<end_of_utterance>", Box(100, 100, 300, 200)),
    ("[ 0.12 , 0.34 , 0.56 , 0.78 ]", Box(120, 170, 560, 390)),  # word-level decoding
    ("[0.1, 0.2, 0.3, 0.4] and [0.5, 0.5, 0.9, 0.9]", Box(100, 100, 300, 200)),  # first box
    ("[0.5, 0.5, 0.2, 0.9]", None),  # x2 < x1
    ("[120, 340, 560, 780]", None),  # 0-1000 integers are outside the 0-1 frame, never rescaled
    ("There is no red cube.", None),
])
def test_parse_chosen_format_answers(adapter: Idefics3Adapter, answer: str, expected: Box | None) -> None:
    assert_parses_to(adapter, answer, BoxFrame(image_size=(1000, 500)), expected)
