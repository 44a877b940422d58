from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from vrh_interp.core.description.heads import Head, HeadGeometry, HeadOutOfRangeError, HeadSet
from vrh_interp.core.description.head_mapping import IncompatibleHeadGridError, transfer_heads


@given(st.integers(0, 500), st.integers(0, 500))
def test_head_prints_and_parses_back(layer, head):
    h = Head(layer, head)
    assert str(h) == f"L{layer}H{head}"
    assert Head.parse(str(h)) == h
    assert Head.parse(str(h).lower()) == h


def test_head_is_ordered_hashable_and_typed():
    assert sorted([Head(2, 0), Head(1, 5), Head(1, 2)]) == [Head(1, 2), Head(1, 5), Head(2, 0)]
    assert len({Head(1, 2), Head(1, 2)}) == 1
    with pytest.raises(TypeError):
        Head(1.0, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Head(-1, 0)
    with pytest.raises(ValueError, match="L<layer>H<head>"):
        Head.parse("19,17")
    with pytest.raises(AttributeError):
        Head(1, 2).layer = 3  # type: ignore[misc]


def test_headset_keeps_order_reads_layer_head_tuples_and_rejects_duplicates():
    hs = HeadSet.parse("L3H1, L0H2 L1H0")
    assert hs.to_list() == ["L3H1", "L0H2", "L1H0"]
    assert hs[0] == Head(3, 1) and hs[:2] == HeadSet([Head(3, 1), Head(0, 2)])
    assert hs.by_layer() == {0: [2], 1: [0], 3: [1]}
    assert Head(0, 2) in hs and Head(0, 3) not in hs
    assert hs.difference([Head(0, 2)]).to_list() == ["L3H1", "L1H0"]
    assert hs.union([Head(9, 9), Head(3, 1)]).to_list() == ["L3H1", "L0H2", "L1H0", "L9H9"]
    assert HeadSet([(1, 2), "L0H3"]) == HeadSet([Head(1, 2), Head(0, 3)])  # (layer, head), layer first
    with pytest.raises(TypeError, match="is not a head"):
        HeadSet([(1, 2, 3)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="duplicate"):
        HeadSet([Head(1, 2), Head(1, 2)])


def test_geometry_validates_heads():
    g = HeadGeometry(num_layers=4, num_heads=8, num_kv_heads=2, head_dim=16)
    assert g.total_heads == 32 and len(g.all_heads()) == 32
    assert g.validate([Head(3, 7)]) == HeadSet([Head(3, 7)])
    with pytest.raises(HeadOutOfRangeError, match="L4H0"):
        g.validate([Head(4, 0)])
    with pytest.raises(ValueError):
        HeadGeometry(num_layers=2, num_heads=6, num_kv_heads=4, head_dim=8)


def test_transfer_identity_requires_equal_grids():
    a = HeadGeometry(4, 8, 2, 16)
    heads = HeadSet([Head(3, 7), Head(0, 1)])
    assert transfer_heads(heads, a, HeadGeometry(4, 8, 2, 16)) == heads
    with pytest.raises(IncompatibleHeadGridError, match="relative_depth"):
        transfer_heads(heads, a, HeadGeometry(6, 8, 2, 16))
    with pytest.raises(IncompatibleHeadGridError, match="head_dim"):
        transfer_heads(heads, a, HeadGeometry(4, 8, 2, 32))


def test_transfer_relative_depth_maps_layers_explicitly():
    a, b = HeadGeometry(4, 8, 2, 16), HeadGeometry(7, 8, 2, 16)
    mapped = transfer_heads(HeadSet([Head(0, 1), Head(3, 7), Head(1, 2)]), a, b, mapping="relative_depth")
    assert mapped.to_list() == ["L0H1", "L6H7", "L2H2"]
    with pytest.raises(IncompatibleHeadGridError, match="equal head counts"):
        transfer_heads(HeadSet([Head(0, 1)]), a, HeadGeometry(7, 4, 2, 16), mapping="relative_depth")
