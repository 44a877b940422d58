"""GLM-4V adapter: fixture, head geometry, layout experiment, prompt, <|begin_of_box|> boxes 0-1000."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from transformers import Glm4vForConditionalGeneration, Glm4vImageProcessorPil
from transformers.models.glm4v.image_processing_pil_glm4v import smart_resize

from tests.conftest import noise_image
from tests.families.checks import (
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
from vrh_interp.families.glm4v import Glm4vAdapter
from vrh_interp.testing.layout_probe import check_layout_by_painting, nearest_resampling
from vrh_interp.testing.tiny import TinyVLM
from vrh_interp.testing.tiny.glm4v import TINY_MAX_PIXELS, TINY_MIN_PIXELS, build

# Sizes cover GLM's smart_resize branches: downscale (300x170, 640x480), rounding (97x203), minimum
# budget (50x40), and the upscale of images under 28 pixels on a side (20x90).
LAYOUT_CASES = [
    ((300, 170), Box(0, 0, 90, 68)),
    ((300, 170), Box(170, 100, 300, 170)),
    ((97, 203), Box(19, 20, 87, 71)),
    ((640, 480), Box(128, 48, 576, 168)),
    ((640, 480), Box(637, 0, 640, 3)),
    ((50, 40), Box(10, 4, 45, 14)),
    ((20, 90), Box(4, 9, 18, 31)),
    ((20, 90), Box(0, 0, 20, 90)),
]


@pytest.fixture(scope="module")
def tiny() -> TinyVLM:
    return nearest_resampling(build(seed=0))


@pytest.fixture(scope="module")
def adapter(tiny: TinyVLM) -> Glm4vAdapter:
    return Glm4vAdapter(tiny.model.config)


def test_fixture_is_the_real_family_and_registry_picks_the_adapter(tiny: TinyVLM) -> None:
    assert_fixture_is_registered(tiny, Glm4vForConditionalGeneration, Glm4vImageProcessorPil, Glm4vAdapter)


def test_geometry_and_attention_path_match_the_model(tiny: TinyVLM, adapter: Glm4vAdapter) -> None:
    assert_hidden_split_head_geometry(tiny, adapter)


@pytest.mark.parametrize(("image_size", "box"), LAYOUT_CASES)
def test_layout_equals_tokens_changed_by_painting_the_box(tiny: TinyVLM, adapter: Glm4vAdapter,
                                                          image_size: tuple[int, int], box: Box) -> None:
    assert check_layout_by_painting(tiny, adapter, noise_image(*image_size, seed=image_size[0]), box)


@pytest.mark.parametrize("image_size", [(300, 170), (97, 203), (20, 90)])
def test_layout_grid_follows_glm_smart_resize(tiny: TinyVLM, adapter: Glm4vAdapter, image_size: tuple[int, int]) -> None:
    width, height = image_size
    encoding = encode_noise_image(tiny, adapter, (width, height))
    layout = adapter.visual_layout(encoding, image_size, tiny.processor)
    resized_h, resized_w = smart_resize(2, height, width, temporal_factor=2, factor=28,
                                        min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS)
    (block,) = layout.blocks
    assert (block.rows, block.cols) == (resized_h // 28, resized_w // 28)
    assert layout.input_size == (resized_w, resized_h)


def test_boxes_outside_the_image_are_refused(adapter: Glm4vAdapter) -> None:
    with pytest.raises(InvalidBoxError, match="outside"):
        adapter.format_box(Box(0, 0, 10, 171), BoxFrame(image_size=(300, 170)))


def test_grounding_prompt_uses_the_chat_template_and_generates(tiny: TinyVLM, adapter: Glm4vAdapter) -> None:
    prompt = adapter.grounding_prompt(tiny.processor, "the red cube")
    assert prompt == (
        "[gMASK]<sop><|user|>\n<|begin_of_image|><|image|><|end_of_image|>"
        "Help me to locate the red cube in the image and give me its bounding boxes.<|assistant|>\n"
    )
    assert_image_grid_prompt_generates(tiny, adapter, prompt)


def test_format_box_writes_marked_relative_box(adapter: Glm4vAdapter) -> None:
    assert adapter.format_box(Box(100, 50, 2000, 250), BoxFrame(image_size=(2000, 500))) == (
        "<|begin_of_box|>[50,100,1000,500]<|end_of_box|>"
    )


@settings(max_examples=200, deadline=None)
@given(boxes_in_images(1000))
def test_format_then_parse_round_trips_within_one_step(adapter: Glm4vAdapter, case: tuple[Box, tuple[int, int]]) -> None:
    box, (width, height) = case
    assert_round_trip(adapter, box, BoxFrame(image_size=(width, height)), (width / 1000, height / 1000))


NEAR_MISSES = st.sampled_from([
    "<|begin_of_box|>[1,2,3]<|end_of_box|>", "<|begin_of_box|>[1,2,3,<|end_of_box|>", "<|begin_of_box|>",
    "[[1,2,3,1001]]", "[[-1,2,3,4]]", "[[9,9,3,4]]", "</think><|begin_of_box|>", "[[" + "9" * 400 + ",1,2,3]]",
])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), NEAR_MISSES, st.builds("".join, st.lists(st.sampled_from(
    ["<|begin_of_box|>", "<|end_of_box|>", "</think>", *"[]()<>0123456789,. -"])))))
def test_parse_never_raises(adapter: Glm4vAdapter, text: str) -> None:
    assert isinstance(adapter.parse_box(text, BoxFrame(image_size=(640, 480))), (Box, BoxParseFailure))


@pytest.mark.parametrize(("answer", "expected"), [
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
])
def test_parse_documented_answers(adapter: Glm4vAdapter, answer: str, expected: Box | None) -> None:
    assert_parses_to(adapter, answer, BoxFrame(image_size=(2000, 1000)), expected)
