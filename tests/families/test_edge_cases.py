"""Family edge cases: extreme aspect ratios (LLaVA-NeXT, LLaVA-OneVision) and boxes on token edges.

* Extreme aspect ratios: the model's own ``unpad_image`` keeps 0 rows or 0 columns of the tile grid (2000x40,
  40x2000, 1x40, 8x200) while its forward runs fine. The layout must describe what the model packs: the base
  view's tokens, one ``image_newline`` per kept row (checked against the model's layer-0 input) and no tile
  tokens.
* Token edges: token edges are computed in floating point, so a box whose edge sits exactly on a token edge
  (``23.0`` computed as ``22.999999999999996``) used to pick up the whole neighbouring row or column.
  Perturbation check: a box starting exactly on an edge selects what the box nudged by +eps (into the token)
  selects, and the box nudged by -eps adds exactly the tokens left of (above) the edge.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.idefics3 import Idefics3ImageProcessorPil

from tests.conftest import noise_image
from tests.families.checks import assert_separators_are_image_newlines, encode_noise_image
from vrh_interp.core.description.boxes import Box
from vrh_interp.core.description.families import adapter_for_config
from vrh_interp.core.description.families.base import FamilyAdapter, VisualLayout
from vrh_interp.core.description.families.idefics3 import frame_blocks, split_canvas_size
from tests.layout_probe import check_layout_by_painting, nearest_resampling
from vrh_interp.core.description.tiny import TinyVLM, build_tiny

EXTREME_SIZES = [(2000, 40), (40, 2000), (1, 40), (8, 200)]
ANYRES_FAMILIES = ("llava_next", "llava_onevision")


@pytest.fixture(scope="module", params=ANYRES_FAMILIES)
def anyres(request: pytest.FixtureRequest) -> tuple[TinyVLM, FamilyAdapter]:
    tiny = build_tiny(request.param)
    return tiny, adapter_for_config(tiny.model.config)


def packed_feature_count(tiny: TinyVLM, encoding: object) -> int:
    """How many features the model's own ``pack_image_features`` produces for the (single) image: the real
    method runs, wrapped only to read its output."""
    inner = tiny.model.model
    original = inner.pack_image_features
    counts: list[int] = []

    def reading(*args: object, **kwargs: object) -> object:
        features, lengths = original(*args, **kwargs)
        counts.extend(int(f.shape[0]) for f in features)
        return features, lengths

    inner.pack_image_features = reading
    try:
        with torch.no_grad():
            tiny.model(**encoding)
    finally:
        del inner.pack_image_features
    return counts[0]


@pytest.mark.parametrize("image_size", EXTREME_SIZES)
def test_extreme_aspect_ratios_follow_the_models_own_packing(anyres: tuple[TinyVLM, FamilyAdapter],
                                                              image_size: tuple[int, int]) -> None:
    tiny, adapter = anyres
    encoding = encode_noise_image(tiny, adapter, image_size)
    layout = adapter.visual_layout(encoding, image_size, tiny.processor)
    image_token_count = int((encoding["input_ids"][0] == adapter.image_token_id(tiny.processor)).sum())
    assert len(layout.visual_positions) == image_token_count == packed_feature_count(tiny, encoding)
    assert [b.name for b in layout.blocks] == ["base"]  # unpadding kept no tile token
    newlines = assert_separators_are_image_newlines(tiny, adapter, encoding, layout)
    assert len(newlines) == len(layout.visual_positions) - len(layout.blocks[0].positions)
    width, height = image_size
    painted = check_layout_by_painting(tiny, adapter, noise_image(width, height), Box(0, 0, width, height))
    assert painted == sorted(layout.blocks[0].positions)


def nice_token_edges(layout: VisualLayout, image_size: tuple[int, int]) -> list[tuple[int, float, bool]]:
    """(axis, edge, computed_inexactly) for every interior token edge of every block that is a number with at
    most 3 decimals (what a user writes), ``computed_inexactly`` when ``start + i * width`` misses it."""
    edges = set()
    for block in layout.blocks:
        for axis, count in ((0, block.cols), (1, block.rows)):
            start, end = block.region[axis], block.region[axis + 2]
            for index in range(1, count):
                computed = start + index * (end - start) / count
                edge = round(computed, 9)
                if 0 < edge < image_size[axis] and edge == round(edge, 3):
                    edges.add((axis, edge, computed != edge))
    return sorted(edges)


def box_at(axis: int, edge: float, side: int, image_size: tuple[int, int]) -> Box:
    """The box from ``edge`` to the image's far edge (``side`` 0) or from the near edge to ``edge`` (``side``
    2) on ``axis``, spanning the whole other axis."""
    coords = [0.0, 0.0, float(image_size[0]), float(image_size[1])]
    coords[axis + side] = edge
    return Box(*coords)


def tokens_beside(layout: VisualLayout, axis: int, edge: float, side: int) -> set[int]:
    """Positions of the tokens just outside a box whose ``side`` sits on ``edge``: the column (row) ending at
    ``edge`` for a box starting there (``side`` 0), the one starting at ``edge`` for a box ending there."""
    found = set()
    for block in layout.blocks:
        count = block.cols if axis == 0 else block.rows
        start, end = block.region[axis], block.region[axis + 2]
        for index in range(count + 1):  # block edges too: a neighbouring tile's token may end there
            line = index - 1 if side == 0 else index
            if 0 <= line < count and abs(start + index * (end - start) / count - edge) < 1e-9 * max(1.0, abs(edge)):
                cells = [(r, line) for r in range(block.rows)] if axis == 0 else [(line, c) for c in range(block.cols)]
                found.update(block.positions[r * block.cols + c] for r, c in cells)
    return found


def assert_edge_perturbations(layout: VisualLayout, image_size: tuple[int, int]) -> int:
    """The perturbation check on every nice token edge; returns how many edges were computed inexactly."""
    inexact, eps = 0, 1e-6
    for axis, edge, computed_inexactly in nice_token_edges(layout, image_size):
        inexact += computed_inexactly
        for side, inward in ((0, eps), (2, -eps)):
            on_edge = set(layout.positions_for_box(box_at(axis, edge, side, image_size)))
            inside = set(layout.positions_for_box(box_at(axis, edge + inward, side, image_size)))
            outside = set(layout.positions_for_box(box_at(axis, edge - inward, side, image_size)))
            assert on_edge == inside, (image_size, axis, edge, side)
            assert on_edge < outside and outside - on_edge == tokens_beside(layout, axis, edge, side) - on_edge, \
                (image_size, axis, edge, side)
    return inexact


# image sizes whose token edges include round numbers that float arithmetic misses (found by search)
EDGE_SIZES = {"llava_next": [(69, 99), (90, 25), (55, 64)], "llava_onevision": [(27, 99), (90, 25), (55, 64)]}


def test_boxes_on_token_edges_take_no_neighbouring_row_or_column(anyres: tuple[TinyVLM, FamilyAdapter]) -> None:
    tiny, adapter = anyres
    inexact = 0
    for image_size in EDGE_SIZES[adapter.name]:
        layout = adapter.visual_layout(encode_noise_image(tiny, adapter, image_size), image_size, tiny.processor)
        inexact += assert_edge_perturbations(layout, image_size)
    assert inexact > 0  # the sizes do exercise edges that floating point misses


@pytest.mark.parametrize(("image_size", "box"), [
    ((32, 32), Box(8, 8, 24, 24)),  # edges on base-view (8 px) and tile (4 px) token edges, whole-pixel scales
    ((16, 16), Box(8, 0, 16, 8)),
    ((32, 16), Box(16, 4, 24, 12)),
])
def test_llava_next_boxes_on_token_edges_agree_with_painting(image_size: tuple[int, int], box: Box) -> None:
    tiny = build_tiny("llava_next")
    positions = check_layout_by_painting(tiny, adapter_for_config(tiny.model.config), noise_image(*image_size), box)
    assert positions  # the model's own tokens under the box, and none beside it


def test_idefics3_tiny_model_boxes_on_token_edges() -> None:
    tiny = nearest_resampling(build_tiny("idefics3"))
    adapter = adapter_for_config(tiny.model.config)
    for image_size in [(50, 37), (99, 17), (33, 99)]:
        layout = adapter.visual_layout(encode_noise_image(tiny, adapter, image_size), image_size, tiny.processor)
        assert_edge_perturbations(layout, image_size)
    # 96x96: 3x3 tiles at scale 1 (8 px tokens) + the global image at 1/3 (24 px tokens); NEAREST samples every
    # global token inside its own 24 px, so painting is exact for a box on 24 px edges
    assert check_layout_by_painting(tiny, adapter, noise_image(96, 96), Box(24, 24, 72, 48))


def test_idefics3_boxes_on_token_edges_with_released_frame_sizes() -> None:
    # Idefics3-8B: 364 px frames of 13 x 13 tokens (364 / 14 patches, pixel shuffle 2), longest edge 4 x 364
    processor = Idefics3ImageProcessorPil(size={"longest_edge": 4 * 364}, max_image_size={"longest_edge": 364})
    inexact = 0
    for image_size in [(640, 480), (178, 130), (100, 975), (1000, 300)]:
        canvas_width, canvas_height = split_canvas_size(image_size, 4 * 364, 364)
        frames = (canvas_width // 364) * (canvas_height // 364) + 1
        blocks = frame_blocks(list(range(frames * 169)), image_size, frames, 13, processor)
        layout = VisualLayout(image_size=image_size, visual_positions=tuple(range(frames * 169)), blocks=blocks)
        inexact += assert_edge_perturbations(layout, image_size)
    assert inexact > 0
