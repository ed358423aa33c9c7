"""The runtime's Layout from Python: its mode and placement are the C++ enums, given by enum or by the names
gfdit.ParallelSpec uses, and ParallelSpec converts to and from it through those names alone."""

from __future__ import annotations

import itertools

import gfdit
import pytest
from gfdit._C import runtime as rt
from gfdit.attention import spec


def test_enums_and_their_names() -> None:
    assert list(rt.LayoutMode.__members__) == ["USP", "TORUS"]
    assert list(rt.Placement.__members__) == ["AUTO", "ULYSSES_LOW", "RING_LOW"]
    assert [rt.layout_mode_name(m) for m in rt.LayoutMode.__members__.values()] == ["usp", "torus"]
    assert [rt.placement_name(p) for p in rt.Placement.__members__.values()] == [
        "auto",
        "ulysses-low",
        "ring-low",
    ]
    assert spec.MODES == ("usp", "torus")
    assert spec.PLACEMENTS == ("auto", "ulysses-low", "ring-low")
    for name in spec.MODES:
        assert rt.layout_mode_name(rt.layout_mode_from_name(name)) == name
    for name in spec.PLACEMENTS:
        assert rt.placement_name(rt.placement_from_name(name)) == name
    with pytest.raises(gfdit.InvalidUsage, match="unknown mode 'ring'; valid modes: usp, torus"):
        rt.layout_mode_from_name("ring")
    with pytest.raises(gfdit.InvalidUsage, match="valid placements: auto, ulysses-low, ring-low"):
        rt.placement_from_name("low")


def test_layout_takes_the_enum_or_its_name() -> None:
    by_name = rt.Layout(ulysses=2, ring=2, mode="torus", placement="ring-low", cfg=2)
    by_enum = rt.Layout(2, 2, rt.LayoutMode.TORUS, rt.Placement.RING_LOW, 2)
    assert by_name == by_enum and by_name.degree() == 8 and by_name.pass_degree() == 4
    assert by_name.mode == rt.LayoutMode.TORUS and by_name.placement == rt.Placement.RING_LOW
    assert repr(by_name) == "Layout(ulysses=2, ring=2, mode='torus', placement='ring-low', cfg=2)"
    plain = rt.Layout()
    assert (plain.mode, plain.placement, plain.cfg) == (rt.LayoutMode.USP, rt.Placement.AUTO, 1)
    plain.mode, plain.placement = "torus", rt.Placement.ULYSSES_LOW
    assert (plain.mode, plain.placement) == (rt.LayoutMode.TORUS, rt.Placement.ULYSSES_LOW)
    assert gfdit.Layout is rt.Layout


@pytest.mark.parametrize(
    "kwargs, param, match",
    [
        ({"mode": "ring"}, "mode", "unknown mode 'ring'; valid modes: usp, torus"),
        ({"mode": 1}, "mode", r"mode must be a LayoutMode or its name \(usp, torus\), got 1"),
        ({"placement": "low"}, "placement", "valid placements: auto, ulysses-low, ring-low"),
        (
            {"placement": 2},
            "placement",
            r"placement must be a Placement or its name \(auto, ulysses-low, ring-low\)",
        ),
        ({"cfg": 3}, "cfg", "cfg must be 1 or 2"),
    ],
)
def test_layout_refuses_what_is_not_a_mode_or_placement(kwargs: dict, param: str, match: str) -> None:
    with pytest.raises(gfdit.InvalidUsage, match=match) as info:
        rt.Layout(**kwargs)
    assert info.value.param == param
    layout = rt.Layout()
    if param != "cfg":
        with pytest.raises(gfdit.InvalidUsage, match=match):
            setattr(layout, param, kwargs[param])


def test_parallel_spec_round_trips_through_the_layout() -> None:
    for mode, placement, cfg in itertools.product(spec.MODES, spec.PLACEMENTS, (1, 2)):
        ps = gfdit.ParallelSpec(ulysses=2, ring=3, mode=mode, placement=placement, cfg=cfg)
        layout = ps.layout()
        assert rt.layout_mode_name(layout.mode) == mode and rt.placement_name(layout.placement) == placement
        assert gfdit.ParallelSpec.of(layout) == ps
    with pytest.raises(gfdit.InvalidUsage, match="is not one of auto, ulysses-low, ring-low"):
        gfdit.ParallelSpec(placement="low")
