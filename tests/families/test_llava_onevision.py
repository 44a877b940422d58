"""LLaVA-OneVision adapter: fixture, geometry, anyres layout with tile gaps and downsampling, prompt, box format."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st
from transformers import LlavaOnevisionForConditionalGeneration, LlavaOnevisionImageProcessorPil

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
from vrh_interp.boxes import Box, BoxParseFailure
from vrh_interp.families.base import BoxFrame
from vrh_interp.families.llava_onevision import LlavaOnevisionAdapter, bilinear_sources
from vrh_interp.heads import HeadGeometry
from vrh_interp.testing.layout_probe import (
    assert_changed_within_sampling,
    changed_positions,
    check_layout_by_painting,
    language_model_input,
    random_boxes,
)
from vrh_interp.testing.tiny import TinyVLM
from vrh_interp.testing.tiny.llava_onevision import GRID_PINPOINTS, TILE_SIZE, build


@pytest.fixture(scope="module")
def tiny() -> TinyVLM:
    return build(seed=0)


@pytest.fixture(scope="module")
def adapter(tiny: TinyVLM) -> LlavaOnevisionAdapter:
    return LlavaOnevisionAdapter(tiny.model.config)


def test_fixture_is_the_real_family_and_registry_picks_the_adapter(tiny: TinyVLM) -> None:
    assert_fixture_is_registered(tiny, LlavaOnevisionForConditionalGeneration, LlavaOnevisionImageProcessorPil,
                                 LlavaOnevisionAdapter)


def test_geometry_and_attention_path_match_the_model(tiny: TinyVLM, adapter: LlavaOnevisionAdapter) -> None:
    assert adapter.geometry() == HeadGeometry(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
    attention = adapter.attention_module(tiny.model, 1)
    assert attention is tiny.model.model.language_model.layers[1].self_attn
    assert adapter.output_projection(tiny.model, 1) is attention.o_proj


# Each 36-pixel tile's 4 x 4 tokens cover its first 32 pixels. 72x36: two tiles at scale 1 (the base view
# halves the image); 36x18, 12x36: one padded tile at scale 1 or 3.
EXACT_CASES = [
    ((72, 36), Box(32, 0, 36, 36)),  # tile 0's uncovered 4-pixel strip: base-view tokens only
    ((72, 36), Box(30, 10, 40, 20)),  # spans the gap into tile 1
    ((72, 36), Box(0, 0, 72, 36)),
    ((72, 36), Box(68, 32, 72, 36)),  # the corner no token covers (base and tile grids stop short)
    ((36, 18), Box(5, 0, 20, 3)),
    ((12, 36), Box(0, 20, 12, 36)),
]


@pytest.mark.parametrize(("image_size", "box"), EXACT_CASES)
def test_layout_equals_tokens_changed_by_painting_the_box(tiny: TinyVLM, adapter: LlavaOnevisionAdapter,
                                                          image_size: tuple[int, int], box: Box) -> None:
    check_layout_by_painting(tiny, adapter, noise_image(*image_size), box)


@pytest.mark.parametrize("image_size", [(40, 100), (150, 200)])  # 3x2 tiles; 6x5 tiles, downsampled
def test_downscaled_layouts_agree_with_painting_up_to_sampling(tiny: TinyVLM, adapter: LlavaOnevisionAdapter,
                                                               image_size: tuple[int, int]) -> None:
    layout = noise_image_layout(tiny, adapter, image_size)
    spacing = anyres_sample_spacing(image_size, GRID_PINPOINTS, TILE_SIZE)
    for box in random_boxes(image_size, count=2, seed=image_size[0]):
        changed = changed_positions(tiny, adapter, noise_image(*image_size), box)
        assert_changed_within_sampling(layout, box, changed, spacing)


@pytest.mark.parametrize("image_size", [(72, 36), (40, 100), (200, 150), (150, 200), (30, 20)])
def test_token_count_and_newlines(tiny: TinyVLM, adapter: LlavaOnevisionAdapter, image_size: tuple[int, int]) -> None:
    width, height = image_size
    encoding = encode_noise_image(tiny, adapter, image_size)
    layout = adapter.visual_layout(encoding, image_size, tiny.processor)
    assert len(layout.visual_positions) == tiny.processor._get_number_of_features(height, width, TILE_SIZE, TILE_SIZE)
    assert layout.blocks[0].positions == layout.visual_positions[:16]
    in_blocks = {p for block in layout.blocks for p in block.positions}
    newlines = [p for p in layout.visual_positions if p not in in_blocks]
    hidden = language_model_input(tiny, adapter, encoding)[0]  # after layer 0's RMSNorm (unit weight)
    newline = tiny.model.model.image_newline.detach()
    normalised = newline * torch.rsqrt(newline.pow(2).mean() + tiny.model.config.text_config.rms_norm_eps)
    assert torch.allclose(hidden[newlines], normalised.expand(len(newlines), -1), atol=1e-5)


def test_large_grids_are_downsampled_like_pack_image_features(tiny: TinyVLM, adapter: LlavaOnevisionAdapter) -> None:
    # 200x150 -> 5x6 tiles of 4x4 tokens; unpadding keeps 18 of 20 rows and all 24 columns;
    # ratio = sqrt(18 * 24 / (9 * 16)) = 1.73 > 1.1 -> int(18 // 1.73) x int(24 // 1.73) = 10 x 13.
    layout = noise_image_layout(tiny, adapter, (200, 150))
    ratio = math.sqrt(18 * 24 / (9 * 16))
    assert adapter.packed_grid_shape(18, 24, 4) == (int(18 // ratio), int(24 // ratio)) == (10, 13)
    downsampled = {p for block in layout.blocks[1:] for p in block.positions}
    assert len(downsampled) == 10 * 13
    assert len(layout.visual_positions) == 16 + 10 * (13 + 1)
    assert adapter.packed_grid_shape(8, 8, 4) == (8, 8)  # 4 tiles: under anyres_max_9


@pytest.mark.parametrize(("index", "source_size", "target_size", "expected"), [
    (0, 18, 10, [0, 1]),  # source 0.4
    (2, 18, 10, [4]),  # source exactly 4.0: the second weight is zero
    (9, 18, 10, [16, 17]),
    (0, 4, 2, [0, 1]),  # source 0.5
    (0, 2, 4, [0]),  # upsampling clamps at 0
    (3, 2, 4, [1]),  # and at the last row
])
def test_bilinear_sources_match_torch_interpolate(index: int, source_size: int, target_size: int,
                                                  expected: list[int]) -> None:
    assert bilinear_sources(index, source_size, target_size) == expected
    for source in range(source_size):
        impulse = torch.zeros(1, 1, source_size, 1)
        impulse[0, 0, source, 0] = 1.0
        out = torch.nn.functional.interpolate(impulse, [target_size, 1], mode="bilinear")[0, 0, index, 0]
        assert (abs(float(out)) > 1e-6) == (source in expected)


def test_grounding_prompt_uses_the_chat_template_and_generates(tiny: TinyVLM, adapter: LlavaOnevisionAdapter) -> None:
    prompt = adapter.grounding_prompt(tiny.processor, "the red circle")
    assert prompt == ("<|im_start|>user <image>\nPlease provide the bounding box coordinate of the region this "
                      "sentence describes: the red circle<|im_end|>\n<|im_start|>assistant\n")
    encoding = adapter.encode(tiny.processor, [noise_image(72, 36)], [prompt])
    assert_generates(tiny, encoding)


@settings(max_examples=100, deadline=None)
@given(small_boxes_in_images())
def test_format_then_parse_round_trips_within_one_step(adapter: LlavaOnevisionAdapter,
                                                       case: tuple[Box, tuple[int, int]]) -> None:
    box, (width, height) = case
    assert_round_trip(adapter, box, adapter.box_frame(None, (width, height)), (0.01 * width, 0.01 * height))


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet="[]()0123456789.,- \n", max_size=40)))
def test_parse_never_raises(adapter: LlavaOnevisionAdapter, text: str) -> None:
    assert isinstance(adapter.parse_box(text, BoxFrame(image_size=(640, 480))), (Box, BoxParseFailure))


@pytest.mark.parametrize(("answer", "expected"), [
    ("[0.214, 0.365, 0.642, 0.907]", Box(136.96, 175.2, 410.88, 435.36)),  # OneVision answers with 3 decimals
    ("[ 0.12 , 0.34 , 0.56 , 0.78 ]", Box(76.8, 163.2, 358.4, 374.4)),
    ("The person on the left.", None),
])
def test_parse_documented_answers(adapter: LlavaOnevisionAdapter, answer: str, expected: Box | None) -> None:
    assert_parses_to(adapter, answer, adapter.box_frame(None, (640, 480)), expected)
