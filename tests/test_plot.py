"""The benches' SVG charts: every value drawn and labelled, bad data refused."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree

import pytest

from devtools.plot import BarChart, Reference

SVG = "{http://www.w3.org/2000/svg}"


def _bars(chart: BarChart) -> list[tuple[float, float]]:
    """(top y, height) of every data bar, in drawing order (legend keys are 10 high at the bottom)."""
    root = ElementTree.fromstring(chart.svg())
    rects = [rect for rect in root.iter(f"{SVG}rect") if rect.get("fill") != "white"]
    return [(float(r.get("y", 0)), float(r.get("height", 0))) for r in rects if r.get("height") != "10"]


def test_bars_grow_with_their_values_and_carry_them_as_labels() -> None:
    chart = BarChart("rounds & more", "µs", ["R = 32", "R = 256"], {"spec": [358.0, 5649.0], "impl": [8.3, 10.2]})
    bars = _bars(chart)
    assert len(bars) == 4
    heights = [height for _, height in bars]  # drawn group by group: spec, impl, spec, impl
    assert heights[0] > heights[1] and heights[2] > heights[3] and heights[2] > heights[0]
    svg = chart.svg()
    for label in ("358", "5,649", "8.3", "10", "rounds &amp; more", "R = 256", ">spec<", ">impl<"):
        assert label in svg


def test_log_scale_spans_whole_decades_and_places_references() -> None:
    chart = BarChart(
        "t", "µs", ["a"], {"s": [8.0], "i": [5649.0]}, references=[Reference("target", 50.0)], log_scale=True
    )
    svg = chart.svg()
    ticks = re.findall(r'text-anchor="end">([\d,.]+)</text>', svg)
    assert ticks[0] == "1" and ticks[-1] == "10,000"
    assert "target (50.0)" in svg
    (small_top, small_height), (large_top, large_height) = _bars(chart)
    assert large_height > small_height and large_top < small_top


def test_a_missing_value_draws_no_bar() -> None:
    chart = BarChart("t", "GB/s", ["float32", "float16"], {"twin": [4.0, 2.0], "torch": [None, 1.0]})
    assert len(_bars(chart)) == 3


@pytest.mark.parametrize(
    ("groups", "series", "log_scale", "message"),
    [
        ([], {"s": []}, False, "at least one group"),
        (["a"], {}, False, "at least one group"),
        (["a", "b"], {"s": [1.0]}, False, "has 1 values for 2 groups"),
        (["a"], {"s": [None]}, False, "at least one value"),
        (["a"], {"s": [-1.0]}, False, "finite and non-negative"),
        (["a"], {"s": [float("nan")]}, False, "finite and non-negative"),
        (["a"], {"s": [0.0]}, True, "positive values"),
    ],
)
def test_bad_data_is_refused(
    groups: list[str], series: dict[str, list[float | None]], log_scale: bool, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        BarChart("t", "u", groups, series, log_scale=log_scale)
