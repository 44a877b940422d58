"""PaliGemma adapter: fixture, head geometry, layout experiment, prefix prompt, <loc> box format."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from transformers import PaliGemmaForConditionalGeneration, SiglipImageProcessorPil

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
from vrh_interp.families.paligemma import PaliGemmaAdapter
from vrh_interp.testing.layout_probe import check_layout_by_painting, nearest_resampling
from vrh_interp.testing.tiny import TinyVLM
from vrh_interp.testing.tiny.paligemma import IMAGE_SIZE, build

GRID = 8  # 56 px / patch 7
# The image is stretched to 56 x 56 whatever its aspect: downscaled (150x70, 400x300), mixed (37x101),
# identity (56x56). Box edges sit near token centres so NEAREST sampling cannot miss a sliver.
LAYOUT_CASES = [
    ((150, 70), Box(28, 13, 104, 48)),
    ((150, 70), Box(141, 0, 150, 5)),  # top-right corner
    ((37, 101), Box(7, 19, 30, 82)),
    ((56, 56), Box(0, 0, 56, 56)),
    ((56, 56), Box(10, 10, 20, 50)),
    ((400, 300), Box(25, 19, 375, 131)),
]


@pytest.fixture(scope="module")
def tiny() -> TinyVLM:
    return nearest_resampling(build(seed=0))


@pytest.fixture(scope="module")
def adapter(tiny: TinyVLM) -> PaliGemmaAdapter:
    return PaliGemmaAdapter(tiny.model.config)


def test_fixture_is_the_real_family_and_registry_picks_the_adapter(tiny: TinyVLM) -> None:
    assert_fixture_is_registered(tiny, PaliGemmaForConditionalGeneration, SiglipImageProcessorPil, PaliGemmaAdapter)
    tokenizer = tiny.processor.tokenizer
    assert tokenizer.convert_tokens_to_ids("<loc1023>") < len(tokenizer)


def test_geometry_and_attention_path_match_the_model(tiny: TinyVLM, adapter: PaliGemmaAdapter) -> None:
    text_config = tiny.model.config.get_text_config()
    assert adapter.geometry() == text_config_geometry(text_config, text_config.head_dim)
    attention = adapter.attention_module(tiny.model, 1)
    assert attention is tiny.model.model.language_model.layers[1].self_attn
    assert adapter.output_projection(tiny.model, 1).in_features == text_config.num_attention_heads * attention.head_dim
    assert adapter.non_causal_image_attention
    assert text_config.use_bidirectional_attention


@pytest.mark.parametrize(("image_size", "box"), LAYOUT_CASES)
def test_layout_equals_tokens_changed_by_painting_the_box(tiny: TinyVLM, adapter: PaliGemmaAdapter,
                                                          image_size: tuple[int, int], box: Box) -> None:
    assert check_layout_by_painting(tiny, adapter, noise_image(*image_size, seed=image_size[0]), box)


def test_image_tokens_come_first_as_one_stretched_grid(tiny: TinyVLM, adapter: PaliGemmaAdapter) -> None:
    encoding = encode_noise_image(tiny, adapter, (150, 70))
    layout = adapter.visual_layout(encoding, (150, 70), tiny.processor)
    assert layout.visual_positions == tuple(range(GRID * GRID))
    (block,) = layout.blocks
    assert (block.rows, block.cols, block.region) == (GRID, GRID, (0.0, 0.0, 150.0, 70.0))
    assert layout.input_size == (IMAGE_SIZE, IMAGE_SIZE)
    assert block.token_rect(1, 2) == (2 * 150 / GRID, 70 / GRID, 3 * 150 / GRID, 2 * 70 / GRID)


def test_boxes_outside_the_image_are_refused(tiny: TinyVLM, adapter: PaliGemmaAdapter) -> None:
    encoding = encode_noise_image(tiny, adapter, (150, 70))
    layout = adapter.visual_layout(encoding, (150, 70), tiny.processor)
    with pytest.raises(InvalidBoxError, match="outside"):
        layout.positions_for_box(Box(0, 60, 20, 75))
    with pytest.raises(InvalidBoxError, match="outside"):
        adapter.format_box(Box(140, 0, 152, 10), BoxFrame(image_size=(150, 70)))


def test_grounding_prompt_is_the_detect_prefix_and_generates(tiny: TinyVLM, adapter: PaliGemmaAdapter) -> None:
    prompt = adapter.grounding_prompt(tiny.processor, "the red cube")
    assert prompt == "<image>detect the red cube"
    encoding = adapter.encode(tiny.processor, [noise_image(150, 70)], [prompt])
    tokenizer = tiny.processor.tokenizer
    ids = encoding["input_ids"][0]
    assert (ids[:GRID * GRID] == adapter.image_token_id(tiny.processor)).all()
    assert int(ids[GRID * GRID]) == tokenizer.bos_token_id  # the processor inserts <bos> after the image
    assert tokenizer.decode(ids[GRID * GRID + 1:]) == "detect the red cube\n"
    assert not encoding["token_type_ids"].any()  # the whole prompt is the bidirectional prefix
    assert "labels" not in encoding
    assert_generates(tiny, encoding)


@settings(max_examples=200, deadline=None)
@given(boxes_in_images(1023))
def test_format_then_parse_round_trips_within_one_step(adapter: PaliGemmaAdapter,
                                                       case: tuple[Box, tuple[int, int]]) -> None:
    box, (width, height) = case
    text = assert_round_trip(adapter, box, BoxFrame(image_size=(width, height)), (width / 1023 / 2, height / 1023 / 2))
    assert text == "".join(f"<loc{round(v / side * 1023):04d}>"
                           for v, side in ((box.y1, height), (box.x1, width), (box.y2, height), (box.x2, width)))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.builds("".join, st.lists(st.sampled_from(
    ["<loc", ">", "0000", "1023", "1024", "0512", "<loc0100>", " ", "12", "<seg001>", "cat", ";"])))))
def test_parse_never_raises(adapter: PaliGemmaAdapter, text: str) -> None:
    assert isinstance(adapter.parse_box(text, BoxFrame(image_size=(640, 480))), (Box, BoxParseFailure))


@pytest.mark.parametrize(("answer", "expected"), [
    # "detect cat" answer layout from the PaliGemma model card / big_vision (y1, x1, y2, x2), image 2046x1023.
    ("<loc0256><loc0128><loc0768><loc0896> cat", Box(256, 256, 1792, 768)),
    # "detect cat ; dog": several detections separated by " ; ", the first is read.
    ("<loc0256><loc0128><loc0768><loc0896> cat ; <loc0000><loc0000><loc0100><loc0100> dog", Box(256, 256, 1792, 768)),
    # Whitespace between location tokens (word-level decoders).
    ("<loc0000> <loc0000> <loc1023> <loc1023> cat", Box(0, 0, 2046, 1023)),
    ("<loc0256><loc0128><loc0768> cat", None),  # three coordinates
    ("<loc0768><loc0128><loc0256><loc0896> cat", None),  # y2 < y1
    ("<loc1024><loc0000><loc1030><loc0010> cat", None),  # outside the 1024 bins
    ("no cat here", None),
])
def test_parse_documented_answers(adapter: PaliGemmaAdapter, answer: str, expected: Box | None) -> None:
    assert_parses_to(adapter, answer, BoxFrame(image_size=(2046, 1023)), expected)
