"""InternVL (HF-native) adapter: fixture, head geometry, tiled layout experiment, prompt, native box format."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from transformers import GotOcr2ImageProcessorPil, InternVLForConditionalGeneration

from tests.conftest import noise_image
from tests.families.checks import (
    assert_fixture_is_registered,
    assert_generates,
    assert_parses_to,
    assert_round_trip,
    boxes_in_images,
    text_config_geometry,
)
from vrh_interp.boxes import Box, BoxParseFailure, InvalidBoxError
from vrh_interp.families.base import BoxFrame
from vrh_interp.families.internvl import InternVLAdapter
from vrh_interp.testing.layout_probe import check_layout_by_painting, nearest_resampling
from vrh_interp.testing.tiny import TinyVLM
from vrh_interp.testing.tiny.internvl import TILE_SIZE, TOKENS_PER_TILE, build

# Tiles are 64 px with 4 x 4 tokens. 150x70 -> 2x1 tiles + thumbnail, 200x130 -> 3x2 + thumbnail,
# 70x150 -> 1x2 + thumbnail, 500x90 -> 6x1 + thumbnail, 40x40 -> one tile (upscaled, no thumbnail).
# Box edges sit a few pixels away from token edges: the thumbnail DOWNSCALES the image, and NEAREST
# sampling can miss a sliver of a box narrower than one resized pixel.
LAYOUT_CASES = [
    ((150, 70), Box(10, 5, 40, 30)),
    ((150, 70), Box(60, 20, 100, 60)),  # spans both tiles
    ((200, 130), Box(58, 55, 92, 76)),  # spans the four tiles around an inner tile corner
    ((200, 130), Box(190, 120, 200, 130)),  # bottom-right image corner
    ((200, 130), Box(0, 0, 200, 130)),  # whole image
    ((70, 150), Box(0, 60, 30, 90)),  # spans the two stacked tiles, at the left edge
    ((500, 90), Box(240, 28, 262, 70)),  # spans the tile edge at x = 250
    ((40, 40), Box(5, 5, 25, 25)),
]


@pytest.fixture(scope="module")
def tiny() -> TinyVLM:
    return nearest_resampling(build(seed=0))


@pytest.fixture(scope="module")
def adapter(tiny: TinyVLM) -> InternVLAdapter:
    return InternVLAdapter(tiny.model.config)


def encode_image(tiny: TinyVLM, adapter: InternVLAdapter, image_size: tuple[int, int], **processor_kwargs):
    prompt = adapter.grounding_prompt(tiny.processor, "the object")
    return tiny.processor(images=[noise_image(*image_size)], text=[prompt], return_tensors="pt", padding=True,
                          **processor_kwargs)


def test_fixture_is_the_real_family_and_registry_picks_the_adapter(tiny: TinyVLM) -> None:
    assert_fixture_is_registered(tiny, InternVLForConditionalGeneration, GotOcr2ImageProcessorPil, InternVLAdapter)


def test_geometry_and_attention_path_match_the_model(tiny: TinyVLM, adapter: InternVLAdapter) -> None:
    text_config = tiny.model.config.get_text_config()
    assert adapter.geometry() == text_config_geometry(text_config, text_config.head_dim)
    attention = adapter.attention_module(tiny.model, 1)
    assert attention is tiny.model.model.language_model.layers[1].self_attn
    assert adapter.output_projection(tiny.model, 1).in_features == text_config.num_attention_heads * attention.head_dim
    assert attention.head_dim == adapter.geometry().head_dim
    assert adapter.tokens_per_tile() == (4, 4)


@pytest.mark.parametrize(("image_size", "box"), LAYOUT_CASES)
def test_layout_equals_tokens_changed_by_painting_the_box(tiny: TinyVLM, adapter: InternVLAdapter,
                                                          image_size: tuple[int, int], box: Box) -> None:
    assert check_layout_by_painting(tiny, adapter, noise_image(*image_size, seed=image_size[0]), box)


@pytest.mark.parametrize(("image_size", "grid"), [((150, 70), (2, 1)), ((200, 130), (3, 2)), ((70, 150), (1, 2)),
                                                  ((500, 90), (6, 1))])
def test_tiles_are_row_major_with_the_thumbnail_last(tiny: TinyVLM, adapter: InternVLAdapter,
                                                     image_size: tuple[int, int], grid: tuple[int, int]) -> None:
    width, height = image_size
    cols, rows = grid
    encoding = encode_image(tiny, adapter, image_size)
    assert encoding["pixel_values"].shape[0] == cols * rows + 1
    layout = adapter.visual_layout(encoding, image_size, tiny.processor)
    context_id = adapter.image_token_id(tiny.processor)
    assert list(layout.visual_positions) == (encoding["input_ids"][0] == context_id).nonzero().flatten().tolist()
    assert len(layout.visual_positions) == (cols * rows + 1) * TOKENS_PER_TILE
    expected_regions = [(c * width / cols, r * height / rows, (c + 1) * width / cols, (r + 1) * height / rows)
                        for r in range(rows) for c in range(cols)] + [(0.0, 0.0, float(width), float(height))]
    assert [block.region for block in layout.blocks] == expected_regions
    assert layout.blocks[-1].name == "thumbnail"
    assert [block.positions[0] for block in layout.blocks] == list(layout.visual_positions[::TOKENS_PER_TILE])


def test_batched_rows_with_different_tile_counts(tiny: TinyVLM, adapter: InternVLAdapter) -> None:
    sizes = [(150, 70), (40, 40)]
    prompt = adapter.grounding_prompt(tiny.processor, "x")
    encoding = adapter.encode(tiny.processor, [noise_image(*size) for size in sizes], [prompt, prompt])
    context_id = adapter.image_token_id(tiny.processor)
    for row, (size, tiles) in enumerate(zip(sizes, (3, 1))):
        layout = adapter.visual_layout(encoding, size, tiny.processor, batch_index=row)
        positions = (encoding["input_ids"][row] == context_id).nonzero().flatten().tolist()
        assert list(layout.visual_positions) == positions and len(layout.blocks) == tiles
        assert [p for block in layout.blocks for p in block.positions] == positions


def test_square_image_is_one_stretched_tile_without_thumbnail(tiny: TinyVLM, adapter: InternVLAdapter) -> None:
    encoding = encode_image(tiny, adapter, (40, 40))
    layout = adapter.visual_layout(encoding, (40, 40), tiny.processor)
    assert encoding["pixel_values"].shape[-2:] == (TILE_SIZE, TILE_SIZE)
    assert [(b.name, b.rows, b.cols, b.region) for b in layout.blocks] == [("image", 4, 4, (0.0, 0.0, 40.0, 40.0))]


def test_tile_count_that_disagrees_with_the_rule_is_refused(tiny: TinyVLM, adapter: InternVLAdapter) -> None:
    encoding = encode_image(tiny, adapter, (200, 130), max_patches=2)
    assert encoding["pixel_values"].shape[0] == 3  # 2x1 tiles + thumbnail, not the image processor's 3x2
    with pytest.raises(ValueError, match="min_patches/max_patches"):
        adapter.visual_layout(encoding, (200, 130), tiny.processor)


def test_boxes_outside_the_image_are_refused(tiny: TinyVLM, adapter: InternVLAdapter) -> None:
    layout = adapter.visual_layout(encode_image(tiny, adapter, (150, 70)), (150, 70), tiny.processor)
    with pytest.raises(InvalidBoxError, match="outside"):
        layout.positions_for_box(Box(100, 10, 151, 60))
    with pytest.raises(InvalidBoxError, match="outside"):
        adapter.format_box(Box(0, 0, 10, 90), BoxFrame(image_size=(150, 70)))
    with pytest.raises(InvalidBoxError, match="zero or negative area"):
        Box(10, 10, 20, 10)


def test_grounding_prompt_uses_the_chat_template_and_generates(tiny: TinyVLM, adapter: InternVLAdapter) -> None:
    prompt = adapter.grounding_prompt(tiny.processor, "the red cube")
    assert prompt == (
        "<|im_start|>user\n<IMG_CONTEXT>\nPlease provide the bounding box coordinate of the region this sentence "
        "describes: <ref>the red cube</ref><|im_end|>\n<|im_start|>assistant\n"
    )
    encoding = adapter.encode(tiny.processor, [noise_image(150, 70)], [prompt])
    tokenizer = tiny.processor.tokenizer
    ids = encoding["input_ids"][0].tolist()
    first, last = ids.index(tokenizer.start_image_token_id), ids.index(tokenizer.end_image_token_id)
    assert set(ids[first + 1:last]) == {adapter.image_token_id(tiny.processor)}
    assert last - first - 1 == 3 * TOKENS_PER_TILE
    assert_generates(tiny, encoding)


@settings(max_examples=200, deadline=None)
@given(boxes_in_images(1000))
def test_format_then_parse_round_trips_within_one_step(adapter: InternVLAdapter,
                                                       case: tuple[Box, tuple[int, int]]) -> None:
    box, (width, height) = case
    text = assert_round_trip(adapter, box, BoxFrame(image_size=(width, height)), (width / 1000 / 2, height / 1000 / 2))
    assert text.startswith("<box>[[") and text.endswith("]]</box>")


NEAR_MISSES = st.sampled_from([
    "<box>[[1, 2, 3</box>", "[[1, 2, 3, 4", "[1, 2, 3, 4]", "<box>[[1,2],[3,4]]</box>", "[[-5, 2, 30, 40]]",
    "[[1000, 1000, 0, 0]]", "[[5, 5, 5, 9]]", "[[1.5e3, 2, 3, 4]]", "[[" + "9" * 400 + ", 1, 2, 3]]", "[[,,,]]",
    "<ref>x</ref><box>", "[[1001, 0, 1002, 10]]",
])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), NEAR_MISSES,
                 st.builds("".join, st.lists(st.sampled_from(["[", "]", "<box>", "</box>", ",", " ", "0", "7", "1000",
                                                              ".", "-", "<ref>"])))))
def test_parse_never_raises(adapter: InternVLAdapter, text: str) -> None:
    assert isinstance(adapter.parse_box(text, BoxFrame(image_size=(640, 480))), (Box, BoxParseFailure))


@pytest.mark.parametrize(("answer", "expected"), [
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
])
def test_parse_documented_answers(adapter: InternVLAdapter, answer: str, expected: Box | None) -> None:
    assert_parses_to(adapter, answer, BoxFrame(image_size=(1000, 500)), expected)
