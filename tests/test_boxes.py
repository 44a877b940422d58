from __future__ import annotations

import pytest

from vrh_interp.core.description.boxes import Box, BoxParseFailure, InvalidBoxError, iou
from vrh_interp.core.description.families.base import VisualBlock, VisualLayout


def test_box_iou_and_xywh():
    a = Box(0, 0, 10, 10)
    b = Box.from_xywh(5, 5, 10, 10)
    assert b.as_tuple() == (5, 5, 15, 15)
    assert iou(a, b) == pytest.approx(25 / 175)
    assert iou(BoxParseFailure("junk", "no box"), a) == 0.0
    assert not BoxParseFailure("x", "y")


@pytest.mark.parametrize("coords", [(0, 0, 0, 5), (5, 5, 4, 9), (0, 0, float("nan"), 1)])
def test_degenerate_boxes_are_refused(coords):
    with pytest.raises(InvalidBoxError):
        Box(*coords)


def test_box_outside_image_is_refused_with_reason():
    with pytest.raises(InvalidBoxError, match="outside the 100x50 image"):
        Box(10, 10, 120, 40).check_inside(100, 50)


def test_layout_positions_for_box_uses_each_block_region():
    # a 2x3 grid over a 60x40 image, plus a 1x1 thumbnail over the whole image
    grid = VisualBlock("tile", tuple(range(10, 16)), rows=2, cols=3, region=(0, 0, 60, 40))
    thumb = VisualBlock("thumbnail", (20,), rows=1, cols=1, region=(0, 0, 60, 40))
    layout = VisualLayout(image_size=(60, 40), visual_positions=tuple(range(10, 16)) + (20,), blocks=(grid, thumb))
    # box inside cell (row 1, col 2) only -> position 15, plus the thumbnail
    assert layout.positions_for_box(Box(41, 21, 59, 39)) == [15, 20]
    # touching a cell edge without positive overlap does not select it
    assert layout.positions_for_box(Box(20, 0, 40, 20)) == [11, 20]
    with pytest.raises(InvalidBoxError):
        layout.positions_for_box(Box(0, 0, 61, 10))
