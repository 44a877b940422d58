"""Qwen2-VL adapter: fixture, head geometry, layout experiment, prompt, native box format."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st
from transformers import Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil
from transformers.image_utils import PILImageResampling
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from tests.conftest import noise_image
from vrh_interp.boxes import Box, BoxParseFailure, InvalidBoxError
from vrh_interp.families import adapter_for_config
from vrh_interp.families.base import BoxFrame
from vrh_interp.families.qwen2_vl import Qwen2VLAdapter
from vrh_interp.heads import HeadGeometry
from vrh_interp.testing.layout_probe import changed_positions
from vrh_interp.testing.tiny import TinyVLM
from vrh_interp.testing.tiny.qwen2_vl import TINY_MAX_PIXELS, TINY_MIN_PIXELS, build

# Image sizes covering smart_resize's three branches: downscale to the pixel budget (300x170, 640x480),
# plain rounding to multiples of 28 (97x203), upscale to the minimum (50x40).
LAYOUT_CASES = [
    ((300, 170), Box(0, 0, 90, 68)),
    ((300, 170), Box(170, 100, 300, 170)),
    ((97, 203), Box(19, 20, 87, 71)),
    ((97, 203), Box(94, 0, 97, 3)),
    ((640, 480), Box(128, 48, 576, 168)),
    ((640, 480), Box(0, 0, 640, 480)),
    ((50, 40), Box(10, 4, 45, 14)),
    ((50, 40), Box(47, 37, 50, 40)),
]


@pytest.fixture(scope="module")
def tiny() -> TinyVLM:
    model = build(seed=0)
    model.processor.image_processor.resample = PILImageResampling.NEAREST
    return model


@pytest.fixture(scope="module")
def adapter(tiny: TinyVLM) -> Qwen2VLAdapter:
    return Qwen2VLAdapter(tiny.model.config)


def test_fixture_is_the_real_family_and_registry_picks_the_adapter(tiny: TinyVLM) -> None:
    assert isinstance(tiny.model, Qwen2VLForConditionalGeneration)
    assert isinstance(tiny.processor.image_processor, Qwen2VLImageProcessorPil)
    assert tiny.model.config.get_text_config().vocab_size == len(tiny.processor.tokenizer)
    assert type(adapter_for_config(tiny.model.config)) is Qwen2VLAdapter


def test_geometry_and_attention_path_match_the_model(tiny: TinyVLM, adapter: Qwen2VLAdapter) -> None:
    text_config = tiny.model.config.get_text_config()
    assert adapter.geometry() == HeadGeometry(
        num_layers=text_config.num_hidden_layers,
        num_heads=text_config.num_attention_heads,
        num_kv_heads=text_config.num_key_value_heads,
        head_dim=text_config.hidden_size // text_config.num_attention_heads,
    )
    attention = adapter.attention_module(tiny.model, 1)
    assert attention is tiny.model.model.language_model.layers[1].self_attn
    assert adapter.output_projection(tiny.model, 1).in_features == attention.num_heads * attention.head_dim
    assert attention.head_dim == adapter.geometry().head_dim


@pytest.mark.parametrize(("image_size", "box"), LAYOUT_CASES)
def test_layout_equals_tokens_changed_by_painting_the_box(tiny: TinyVLM, adapter: Qwen2VLAdapter,
                                                          image_size: tuple[int, int], box: Box) -> None:
    image = noise_image(*image_size, seed=image_size[0])
    encoding = adapter.encode(tiny.processor, [image], [adapter.grounding_prompt(tiny.processor, "the object")])
    expected = adapter.visual_layout(encoding, image_size, tiny.processor).positions_for_box(box)
    assert expected
    assert changed_positions(tiny, adapter, image, box) == expected


@pytest.mark.parametrize("image_size", [(300, 170), (97, 203), (50, 40), (1000, 30)])
def test_layout_grid_follows_smart_resize(tiny: TinyVLM, adapter: Qwen2VLAdapter, image_size: tuple[int, int]) -> None:
    width, height = image_size
    encoding = adapter.encode(tiny.processor, [noise_image(width, height)],
                              [adapter.grounding_prompt(tiny.processor, "x")])
    layout = adapter.visual_layout(encoding, image_size, tiny.processor)
    resized_h, resized_w = smart_resize(height, width, 28, TINY_MIN_PIXELS, TINY_MAX_PIXELS)
    (block,) = layout.blocks
    assert (block.rows, block.cols) == (resized_h // 28, resized_w // 28)
    assert layout.input_size == (resized_w, resized_h)
    assert block.region == (0.0, 0.0, float(width), float(height))
    image_token_id = adapter.image_token_id(tiny.processor)
    assert list(layout.visual_positions) == (encoding["input_ids"][0] == image_token_id).nonzero().flatten().tolist()


def test_boxes_outside_the_image_are_refused(tiny: TinyVLM, adapter: Qwen2VLAdapter) -> None:
    encoding = adapter.encode(tiny.processor, [noise_image(300, 170)], [adapter.grounding_prompt(tiny.processor, "x")])
    layout = adapter.visual_layout(encoding, (300, 170), tiny.processor)
    with pytest.raises(InvalidBoxError, match="outside"):
        layout.positions_for_box(Box(200, 100, 310, 170))
    with pytest.raises(InvalidBoxError, match="outside"):
        adapter.format_box(Box(0, 0, 10, 200), BoxFrame(image_size=(300, 170)))
    with pytest.raises(InvalidBoxError, match="zero or negative area"):
        Box(10, 10, 10, 20)


def test_grounding_prompt_uses_the_chat_template_and_generates(tiny: TinyVLM, adapter: Qwen2VLAdapter) -> None:
    prompt = adapter.grounding_prompt(tiny.processor, "the red cube")
    assert "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>" in prompt
    assert "Find <|object_ref_start|>the red cube<|object_ref_end|><|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    encoding = adapter.encode(tiny.processor, [noise_image(300, 170)], [prompt])
    frames, grid_h, grid_w = encoding["image_grid_thw"][0].tolist()
    image_token_id = adapter.image_token_id(tiny.processor)
    assert int((encoding["input_ids"] == image_token_id).sum()) == frames * grid_h * grid_w // 4
    with torch.no_grad():
        generated = tiny.model.generate(**encoding, max_new_tokens=3, do_sample=False)
    assert generated.shape == (1, encoding["input_ids"].shape[1] + 3)


@st.composite
def boxes_in_images(draw: st.DrawFn) -> tuple[Box, tuple[int, int]]:
    """A box at least two 0-1000 quantisation steps wide and high inside a random image."""
    width, height = draw(st.integers(8, 4000)), draw(st.integers(8, 4000))
    min_w, min_h = 2 * width / 1000, 2 * height / 1000
    x1 = draw(st.floats(0, width - min_w))
    y1 = draw(st.floats(0, height - min_h))
    x2 = draw(st.floats(x1 + min_w, width))
    y2 = draw(st.floats(y1 + min_h, height))
    return Box(x1, y1, x2, y2), (width, height)


@settings(max_examples=200, deadline=None)
@given(boxes_in_images())
def test_format_then_parse_round_trips_within_one_step(adapter: Qwen2VLAdapter,
                                                       case: tuple[Box, tuple[int, int]]) -> None:
    box, (width, height) = case
    frame = BoxFrame(image_size=(width, height))
    parsed = adapter.parse_box(adapter.format_box(box, frame), frame)
    assert isinstance(parsed, Box)
    steps = (width / 1000, height / 1000, width / 1000, height / 1000)
    assert all(abs(a - b) <= step + 1e-9 for a, b, step in zip(parsed.as_tuple(), box.as_tuple(), steps))


NEAR_MISSES = st.sampled_from([
    "<|box_start|>(1,2),(3<|box_end|>", "(1,2),(3,4", "(1,2)(3,4)", "((1,2),(3,4))", "(-5,2),(3,4)",
    "(1000,1000),(0,0)", "(5,5),(5,9)", "(1.5e3,2),(3,4)", "(" + "9" * 400 + ",1),(2,3)", "(,),(,)",
])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), NEAR_MISSES, st.builds("".join, st.lists(st.sampled_from(list("()0123456789,. -<|>"))))))
def test_parse_never_raises(adapter: Qwen2VLAdapter, text: str) -> None:
    assert isinstance(adapter.parse_box(text, BoxFrame(image_size=(640, 480))), (Box, BoxParseFailure))


@pytest.mark.parametrize(("answer", "expected"), [
    # QwenLM/Qwen2-VL issue #9 (the README's high-five example), special tokens kept.
    ("<|object_ref_start|>击掌<|object_ref_end|><|box_start|>(531,516),(581,596)<|box_end|><|im_end|>",
     Box(1062, 516, 1162, 596)),
    # Same answer decoded with skip_special_tokens=True.
    ("击掌(531,516),(581,596)", Box(1062, 516, 1162, 596)),
    # Spaces between tokens, and only the first of several boxes.
    ("<|box_start|>( 100 , 250 ) , ( 600 , 1000 )<|box_end|>\n<|box_start|>(1,2),(3,4)<|box_end|>",
     Box(200, 250, 1200, 1000)),
    # Absolute pixels (Qwen2.5-VL style training data) are outside Qwen2-VL's 0-1000 frame.
    ("<|box_start|>(1769, 1013), (1778, 1027)<|box_end|>", None),
    ("<|box_start|>(600,500),(100,700)<|box_end|>", None),  # x2 < x1
    ("I cannot find the object in the image.", None),
])
def test_parse_documented_answers(adapter: Qwen2VLAdapter, answer: str, expected: Box | None) -> None:
    parsed = adapter.parse_box(answer, BoxFrame(image_size=(2000, 1000)))
    if expected is None:
        assert isinstance(parsed, BoxParseFailure)
    else:
        assert isinstance(parsed, Box)
        assert parsed.as_tuple() == pytest.approx(expected.as_tuple())
