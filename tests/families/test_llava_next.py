"""LLaVA-NeXT adapter: fixture, head geometry, anyres layout experiment, newlines, prompt, native box format."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st
from transformers import LlavaNextForConditionalGeneration, LlavaNextImageProcessorPil

from tests.conftest import noise_image
from tests.families.checks import (
    anyres_sample_spacing,
    assert_fixture_is_registered,
    assert_generates,
    assert_parses_to,
    assert_round_trip,
    encode_noise_image,
    noise_image_layout,
    small_boxes_in_images,
)
from vrh_interp.boxes import Box, BoxParseFailure, InvalidBoxError
from vrh_interp.families.base import BoxFrame
from vrh_interp.families.llava_next import LlavaNextAdapter
from vrh_interp.heads import HeadGeometry
from vrh_interp.testing.layout_probe import (
    assert_changed_within_sampling,
    changed_positions,
    check_layout_by_painting,
    language_model_input,
    random_boxes,
)
from vrh_interp.testing.tiny import TinyVLM
from vrh_interp.testing.tiny.llava_next import GRID_PINPOINTS, TILE_SIZE, build


@pytest.fixture(scope="module")
def tiny() -> TinyVLM:
    return build(seed=0)


@pytest.fixture(scope="module")
def adapter(tiny: TinyVLM) -> LlavaNextAdapter:
    return LlavaNextAdapter(tiny.model.config)


def test_fixture_is_the_real_family_and_registry_picks_the_adapter(tiny: TinyVLM) -> None:
    assert_fixture_is_registered(tiny, LlavaNextForConditionalGeneration, LlavaNextImageProcessorPil, LlavaNextAdapter)


def test_geometry_and_attention_path_match_the_model(tiny: TinyVLM, adapter: LlavaNextAdapter) -> None:
    assert adapter.geometry() == HeadGeometry(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
    attention = adapter.attention_module(tiny.model, 0)
    assert attention is tiny.model.model.language_model.layers[0].self_attn
    assert adapter.output_projection(tiny.model, 0) is attention.o_proj


# Whole-pixel scale factors on the base view and the canvas (16x16: 1x2 tiles, image x2 and pasted at x = 16,
# two token columns kept per tile; 32x16: 2 tiles side by side, no padding; 32x32: padded canvas), so the
# experiment is exact for any box.
EXACT_CASES = [
    ((16, 16), Box(0, 0, 16, 16)),
    ((16, 16), Box(7, 3, 9, 12)),  # spans the two tiles
    ((16, 16), Box(15, 15, 16, 16)),  # bottom-right pixel
    ((32, 16), Box(10, 5, 20, 9)),
    ((16, 32), Box(0, 30, 16, 32)),
    ((32, 32), Box(14, 0, 18, 32)),
]


@pytest.mark.parametrize(("image_size", "box"), EXACT_CASES)
def test_layout_equals_tokens_changed_by_painting_the_box(tiny: TinyVLM, adapter: LlavaNextAdapter,
                                                          image_size: tuple[int, int], box: Box) -> None:
    check_layout_by_painting(tiny, adapter, noise_image(*image_size), box)


@pytest.mark.parametrize("image_size", [(50, 37), (90, 25), (25, 90), (77, 60)])  # 2x2, 1x3, 3x1, 2x2 tiles
def test_downscaled_layouts_agree_with_painting_up_to_sampling(tiny: TinyVLM, adapter: LlavaNextAdapter,
                                                               image_size: tuple[int, int]) -> None:
    layout = noise_image_layout(tiny, adapter, image_size)
    spacing = anyres_sample_spacing(image_size, GRID_PINPOINTS, TILE_SIZE)
    for box in random_boxes(image_size, count=3, seed=image_size[0]):
        changed = changed_positions(tiny, adapter, noise_image(*image_size), box)
        assert_changed_within_sampling(layout, box, changed, spacing)


@pytest.mark.parametrize("image_size", [(50, 37), (90, 25), (25, 90), (77, 60), (30, 20), (16, 16)])
def test_token_count_base_first_and_newlines(tiny: TinyVLM, adapter: LlavaNextAdapter,
                                             image_size: tuple[int, int]) -> None:
    width, height = image_size
    encoding = encode_noise_image(tiny, adapter, image_size)
    layout = adapter.visual_layout(encoding, image_size, tiny.processor)
    expected_count = tiny.processor._get_number_of_features(height, width, TILE_SIZE, TILE_SIZE) - 1  # CLS
    assert len(layout.visual_positions) == expected_count
    base = layout.blocks[0]
    assert base.name == "base" and base.positions == layout.visual_positions[:16]
    assert base.region == (0.0, 0.0, float(width), float(height))
    in_blocks = {p for block in layout.blocks for p in block.positions}
    newlines = [p for p in layout.visual_positions if p not in in_blocks]
    hidden = language_model_input(tiny, adapter, encoding)[0]  # after layer 0's RMSNorm (unit weight)
    newline = tiny.model.model.image_newline.detach()
    normalised = newline * torch.rsqrt(newline.pow(2).mean() + tiny.model.config.text_config.rms_norm_eps)
    assert torch.allclose(hidden[newlines], normalised.expand(len(newlines), -1), atol=1e-5)
    assert newlines[-1] == layout.visual_positions[-1]
    rows = {}
    for block in layout.blocks[1:]:  # tiles, row-major over the tile grid
        rows.setdefault(block.name.split()[1].split(",")[0], set()).add(block.rows)
    assert len(newlines) == sum(next(iter(heights)) for heights in rows.values())


def test_batched_rows_have_the_layout_of_their_own_image(tiny: TinyVLM, adapter: LlavaNextAdapter) -> None:
    sizes = [(50, 37), (90, 25)]
    prompt = adapter.grounding_prompt(tiny.processor, "x")
    batch = adapter.encode(tiny.processor, [noise_image(*size) for size in sizes], [prompt, prompt])
    for row, size in enumerate(sizes):
        batched = adapter.visual_layout(batch, size, tiny.processor, batch_index=row)
        single = noise_image_layout(tiny, adapter, size)
        shift = batched.visual_positions[0] - single.visual_positions[0]  # left padding of the shorter row
        assert [p - shift for p in batched.visual_positions] == list(single.visual_positions)
        assert [b.region for b in batched.blocks] == [b.region for b in single.blocks]


def test_unpadding_keeps_the_extra_row_of_an_odd_remainder(tiny: TinyVLM, adapter: LlavaNextAdapter) -> None:
    # 90x25 -> 1x3 tiles: resized to 96x27 and pasted 2 rows down in 96x32; unpad_image keeps
    # round(25 * 12 / 90) = 3 rows plus the odd remainder, i.e. all 4 token rows.
    tiles = noise_image_layout(tiny, adapter, (90, 25)).blocks[1:]
    assert [(b.name, b.rows, b.cols) for b in tiles] == [("tile 0,0", 4, 4), ("tile 0,1", 4, 4), ("tile 0,2", 4, 4)]
    assert tiles[0].region == pytest.approx((0.0, -2 * 25 / 27, 30.0, 30 * 25 / 27))


def test_boxes_outside_the_image_are_refused(tiny: TinyVLM, adapter: LlavaNextAdapter) -> None:
    with pytest.raises(InvalidBoxError):
        noise_image_layout(tiny, adapter, (50, 37)).positions_for_box(Box(40, 30, 60, 37))
    with pytest.raises(InvalidBoxError):
        adapter.format_box(Box(-5, 0, 10, 10), adapter.box_frame(None, (50, 37)))


def test_grounding_prompt_uses_the_chat_template_and_generates(tiny: TinyVLM, adapter: LlavaNextAdapter) -> None:
    prompt = adapter.grounding_prompt(tiny.processor, "the red circle")
    assert prompt == ("[INST] <image>\nPlease provide the bounding box coordinate of the region this sentence "
                      "describes: the red circle [/INST]")
    encoding = adapter.encode(tiny.processor, [noise_image(50, 37)], [prompt])
    assert_generates(tiny, encoding)


@settings(max_examples=200, deadline=None)
@given(small_boxes_in_images())
def test_format_then_parse_round_trips_within_one_step(adapter: LlavaNextAdapter,
                                                       case: tuple[Box, tuple[int, int]]) -> None:
    box, (width, height) = case
    for frame in (adapter.box_frame(None, (width, height)), BoxFrame(image_size=(width, height))):
        assert_round_trip(adapter, box, frame, (0.01 * width, 0.01 * height))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet="[]()0123456789.,- \n", max_size=40)))
def test_parse_never_raises(adapter: LlavaNextAdapter, text: str) -> None:
    assert isinstance(adapter.parse_box(text, BoxFrame(image_size=(640, 480))), (Box, BoxParseFailure))


DOCUMENTED_ANSWERS = [  # relative to the whole 640x480 image
    ("[0.61, 0.36, 0.92, 0.83]", Box(390.4, 172.8, 588.8, 398.4)),
    ("[ 0.12 , 0.34 , 0.56 , 0.78 ]", Box(76.8, 163.2, 358.4, 374.4)),
    ("The bounding box coordinates are [0.0, 0.5, 1.0, 1.0].", Box(0.0, 240.0, 640.0, 480.0)),
    ("There is no such object.", None),
    ("[0.2, 0.3, 0.1, 0.4]", None),
    ("[12, 30, 200, 300]", None),  # pixels are not LLaVA's format
]


@pytest.mark.parametrize(("answer", "expected"), DOCUMENTED_ANSWERS)
def test_parse_documented_answers(adapter: LlavaNextAdapter, answer: str, expected: Box | None) -> None:
    assert_parses_to(adapter, answer, adapter.box_frame(None, (640, 480)), expected)
