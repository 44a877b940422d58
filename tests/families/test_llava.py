"""LLaVA-1.5 adapter: fixture, head geometry, crop- and pad-mode layout experiments, prompt, native box format."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings, strategies as st
from transformers import CLIPImageProcessorPil, LlavaForConditionalGeneration, LlavaImageProcessorPil

from tests.conftest import noise_image
from tests.families.checks import (
    assert_fixture_is_registered,
    assert_generates,
    assert_parses_to,
    assert_round_trip,
    noise_image_layout,
)
from vrh_interp.boxes import Box, BoxParseFailure, InvalidBoxError
from vrh_interp.families.base import BoxFrame
from vrh_interp.families.llava import LlavaAdapter, llava_processed_view
from vrh_interp.heads import HeadGeometry
from vrh_interp.testing.layout_probe import (
    assert_changed_within_sampling,
    changed_positions,
    check_layout_by_painting,
    random_boxes,
)
from vrh_interp.testing.tiny import TinyVLM
from vrh_interp.testing.tiny.llava import build, build_processor


@pytest.fixture(scope="module")
def crop_tiny() -> TinyVLM:
    return build(seed=0)


@pytest.fixture(scope="module")
def pad_tiny(crop_tiny: TinyVLM) -> TinyVLM:
    """The same model behind a pad-to-square processor."""
    return TinyVLM(family="llava", model=crop_tiny.model, processor=build_processor(pad_to_square=True),
                   vision_attention_modules=crop_tiny.vision_attention_modules)


@pytest.fixture(scope="module")
def adapter(crop_tiny: TinyVLM) -> LlavaAdapter:
    return LlavaAdapter(crop_tiny.model.config)


def test_fixture_is_the_real_family_and_registry_picks_the_adapter(crop_tiny: TinyVLM) -> None:
    assert_fixture_is_registered(crop_tiny, LlavaForConditionalGeneration, LlavaImageProcessorPil, LlavaAdapter)


def test_geometry_and_attention_path_match_the_model(crop_tiny: TinyVLM, adapter: LlavaAdapter) -> None:
    text_config = crop_tiny.model.config.get_text_config()
    assert adapter.geometry() == HeadGeometry(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
    assert adapter.geometry().head_dim == text_config.head_dim
    attention = adapter.attention_module(crop_tiny.model, 1)
    assert attention is crop_tiny.model.model.language_model.layers[1].self_attn
    assert adapter.output_projection(crop_tiny.model, 1).in_features == 4 * 16


# Sizes the processor maps by whole-pixel factors (x1: 70x44, 44x30; x2: 35x22, 22x11; x4: 11x33), so the
# experiment is exact for any box. Crop mode keeps the central square; boxes outside it have no tokens.
CROP_CASES = [
    ((70, 44), Box(0, 0, 10, 44)),  # left of the central square: no visual token at all
    ((70, 44), Box(13, 0, 21, 8)),  # exactly the first token
    ((70, 44), Box(50, 30, 70, 44)),  # straddles the crop edge and the 4 uncovered rows at the bottom
    ((70, 44), Box(20, 10, 45, 35)),
    ((35, 22), Box(0, 0, 7, 22)),  # overlaps the crop, which starts at x = 6.5, by half a pixel
    ((11, 33), Box(0, 0, 11, 11)),  # above the central square
    ((11, 33), Box(2, 12, 9, 20)),
]
PAD_CASES = [
    ((44, 30), Box(0, 0, 44, 30)),  # whole image: every token whose patch holds image pixels
    ((44, 30), Box(40, 0, 44, 30)),  # the 4 columns past the 5 x 8-pixel patch grid: no token
    ((22, 11), Box(3, 2, 19, 9)),
    ((11, 22), Box(0, 21, 11, 22)),  # last image row
]


@pytest.mark.parametrize(("image_size", "box"), CROP_CASES)
def test_crop_mode_layout_equals_tokens_changed_by_painting_the_box(crop_tiny: TinyVLM, adapter: LlavaAdapter,
                                                                    image_size: tuple[int, int], box: Box) -> None:
    check_layout_by_painting(crop_tiny, adapter, noise_image(*image_size), box)


@pytest.mark.parametrize(("image_size", "box"), PAD_CASES)
def test_pad_mode_layout_equals_tokens_changed_by_painting_the_box(pad_tiny: TinyVLM, adapter: LlavaAdapter,
                                                                   image_size: tuple[int, int], box: Box) -> None:
    check_layout_by_painting(pad_tiny, adapter, noise_image(*image_size), box)


@pytest.mark.parametrize(("mode", "image_size"), [("crop", (300, 200)), ("pad", (97, 203))])
def test_downscaled_layouts_agree_with_painting_up_to_sampling(crop_tiny: TinyVLM, pad_tiny: TinyVLM,
                                                               adapter: LlavaAdapter, mode: str,
                                                               image_size: tuple[int, int]) -> None:
    tiny = crop_tiny if mode == "crop" else pad_tiny
    layout = noise_image_layout(tiny, adapter, image_size)
    spacing = max(llava_processed_view(image_size, tiny.processor.image_processor).scale)
    for box in random_boxes(image_size, count=3, seed=image_size[0]):
        changed = changed_positions(tiny, adapter, noise_image(*image_size), box)
        assert_changed_within_sampling(layout, box, changed, spacing)


def test_crop_and_pad_layouts_follow_the_processor_settings(crop_tiny: TinyVLM, pad_tiny: TinyVLM,
                                                            adapter: LlavaAdapter) -> None:
    crop = noise_image_layout(crop_tiny, adapter, (70, 44))
    (block,) = crop.blocks
    assert (block.rows, block.cols, block.region) == (5, 5, (13.0, 0.0, 53.0, 40.0))
    assert len(crop.visual_positions) == 25 and crop.input_size == (44, 44)
    (padded,) = noise_image_layout(pad_tiny, adapter, (44, 30)).blocks
    assert padded.region == (0.0, -7.0, 40.0, 33.0)
    # llava-hf's real configuration: shortest edge 336, centre crop 336 -> the central square.
    hub = CLIPImageProcessorPil(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})
    assert llava_processed_view((640, 480), hub).full_region == (80.0, 0.0, 560.0, 480.0)


def test_box_frames_are_the_square_the_model_sees(crop_tiny: TinyVLM, pad_tiny: TinyVLM,
                                                 adapter: LlavaAdapter) -> None:
    assert adapter.box_frame(None, (640, 480), processor=pad_tiny.processor).view_region == (0.0, -80.0, 640.0, 560.0)
    assert adapter.box_frame(None, (640, 480)).view_region == (0.0, -80.0, 640.0, 560.0)
    crop = adapter.box_frame(None, (640, 480), processor=crop_tiny.processor)
    assert crop.view_region == pytest.approx((7 * 640 / 58, 0.0, 51 * 640 / 58, 480.0))  # 640x480 -> 58x44 -> crop
    assert adapter.format_box(Box(0, 0, 640, 480), crop) == "[0.00, 0.00, 1.00, 1.00]"  # clamped to the view
    assert adapter.format_box(Box(0, 0, 640, 480), adapter.box_frame(None, (640, 480))) == "[0.00, 0.12, 1.00, 0.88]"


def test_boxes_outside_the_image_are_refused(crop_tiny: TinyVLM, adapter: LlavaAdapter) -> None:
    layout = noise_image_layout(crop_tiny, adapter, (70, 44))
    with pytest.raises(InvalidBoxError):
        layout.positions_for_box(Box(60, 0, 90, 10))
    with pytest.raises(InvalidBoxError):
        adapter.format_box(Box(0, 0, 10, 60), BoxFrame(image_size=(70, 44)))
    with pytest.raises(InvalidBoxError):
        Box(5, 5, 5, 10)


def test_grounding_prompt_uses_the_chat_template_and_generates(crop_tiny: TinyVLM, adapter: LlavaAdapter) -> None:
    prompt = adapter.grounding_prompt(crop_tiny.processor, "the red circle")
    assert prompt == ("USER: <image>\nPlease provide the bounding box coordinate of the region this sentence "
                      "describes: the red circle ASSISTANT:")
    encoding = adapter.encode(crop_tiny.processor, [noise_image(50, 40)], [prompt])
    assert int((encoding["input_ids"][0] == adapter.image_token_id(crop_tiny.processor)).sum()) == 25
    assert_generates(crop_tiny, encoding)


@st.composite
def image_and_box(draw: st.DrawFn) -> tuple[tuple[int, int], Box]:
    width, height = draw(st.integers(8, 4000)), draw(st.integers(8, 4000))
    fx1, fy1 = draw(st.floats(0, 0.9)), draw(st.floats(0, 0.9))
    fx2, fy2 = draw(st.floats(fx1 + 0.05, 1.0)), draw(st.floats(fy1 + 0.05, 1.0))
    return (width, height), Box(fx1 * width, fy1 * height, fx2 * width, fy2 * height)


def assert_round_trip_in_view(adapter: LlavaAdapter, box: Box, frame: BoxFrame, side: tuple[float, float]) -> None:
    assume(box.width >= 0.02 * side[0] and box.height >= 0.02 * side[1])  # survives 0.01 quantisation
    assert_round_trip(adapter, box, frame, (0.01 * side[0], 0.01 * side[1]))


@settings(max_examples=200, deadline=None)
@given(image_and_box())
def test_format_then_parse_round_trips_in_the_padded_square(adapter: LlavaAdapter,
                                                            case: tuple[tuple[int, int], Box]) -> None:
    image_size, box = case
    side = float(max(image_size))
    assert_round_trip_in_view(adapter, box, adapter.box_frame(None, image_size), (side, side))
    assert_round_trip_in_view(adapter, box, BoxFrame(image_size=image_size), (side, side))


@settings(max_examples=100, deadline=None)
@given(image_and_box())
def test_format_then_parse_round_trips_in_the_central_crop(crop_tiny: TinyVLM, adapter: LlavaAdapter,
                                                           case: tuple[tuple[int, int], Box]) -> None:
    image_size, box = case
    frame = adapter.box_frame(None, image_size, processor=crop_tiny.processor)
    x0, y0, x1, y1 = frame.view_region
    inside = Box(x0 + box.x1 / image_size[0] * (x1 - x0), y0 + box.y1 / image_size[1] * (y1 - y0),
                 x0 + box.x2 / image_size[0] * (x1 - x0), y0 + box.y2 / image_size[1] * (y1 - y0))
    assert_round_trip_in_view(adapter, inside, frame, (x1 - x0, y1 - y0))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet="[]()0123456789.,- \n", max_size=40)))
def test_parse_never_raises(adapter: LlavaAdapter, text: str) -> None:
    assert isinstance(adapter.parse_box(text, BoxFrame(image_size=(640, 480))), (Box, BoxParseFailure))


# Answers in LLaVA-1.5's format (REC answers of llava_v1_5_mix665k, e.g. "[0.61, 0.36, 0.92, 0.83]" quoted in
# haotian-liu/LLaVA#623; the toy model's word-level decode), read in the padded square of a 640x480 image.
DOCUMENTED_ANSWERS = [
    ("[0.61, 0.36, 0.92, 0.83]", Box(390.4, 150.4, 588.8, 451.2)),
    ("[ 0.12 , 0.34 , 0.56 , 0.78 ]", Box(76.8, 137.6, 358.4, 419.2)),
    ("The bounding box is [0.1, 0.2, 0.3, 0.4].", Box(64.0, 48.0, 192.0, 176.0)),
    ("[0.25,0.5,0.75,1]", Box(160.0, 240.0, 480.0, 560.0)),  # reaches into the bottom padding
    ("[0.1, 0.2, 0.3, 0.4] and [0.5, 0.5, 0.6, 0.6]", Box(64.0, 48.0, 192.0, 176.0)),  # first box
    ("I cannot locate it.", None),
    ("[0.1, 0.2, 0.3]", None),
    ("0.1, 0.2, 0.3, 0.4", None),  # no brackets
    ("[1.5, 0.2, 1.7, 0.4]", None),  # outside the 0-1 frame
    ("[0.5, 0.5, 0.4, 0.6]", None),  # x2 < x1
]


@pytest.mark.parametrize(("answer", "expected"), DOCUMENTED_ANSWERS)
def test_parse_documented_answers(adapter: LlavaAdapter, answer: str, expected: Box | None) -> None:
    assert_parses_to(adapter, answer, adapter.box_frame(None, (640, 480)), expected)

