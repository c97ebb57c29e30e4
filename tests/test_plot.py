"""The benches' charts (matplotlib): every value drawn and labelled, bad data refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvsched.charts import BarChart, Reference


def _bars(chart: BarChart) -> list[tuple[float, float]]:
    """(bottom, height) of every data bar, in drawing order (series by series)."""
    axes = chart.figure().axes[0]
    return [(patch.get_y(), patch.get_height()) for container in axes.containers for patch in container]


def _labels(chart: BarChart) -> list[str]:
    return [text.get_text() for text in chart.figure().axes[0].texts]


def test_bars_grow_with_their_values_and_carry_them_as_labels(tmp_path: Path) -> None:
    chart = BarChart("rounds & more", "µs", ["R = 32", "R = 256"], {"spec": [358.0, 5649.0], "impl": [8.3, 10.2]})
    heights = [height for _, height in _bars(chart)]  # spec's bars, then impl's
    assert heights == [358.0, 5649.0, 8.3, 10.2]
    assert _labels(chart) == ["358", "5,649", "8.3", "10.2"]
    path = tmp_path / "chart.svg"
    chart.write(str(path))
    svg = path.read_text()
    for label in ("358", "5,649", "8.3", "rounds &amp; more", "R = 256", "spec", "impl"):
        assert label in svg


def test_labels_stand_along_their_bars_so_neighbours_never_overlap() -> None:
    chart = BarChart("t", "µs", ["a"], {name: [1000.0 + index] for index, name in enumerate("abcdef")})
    assert {text.get_rotation() for text in chart.figure().axes[0].texts} == {90.0}


def test_log_scale_and_references_named_in_the_legend_with_their_values() -> None:
    chart = BarChart(
        "t", "µs", ["a"], {"s": [8.0], "i": [5649.0]}, references=[Reference("target", 50.0)], log_scale=True
    )
    axes = chart.figure().axes[0]
    assert axes.get_yscale() == "log"
    assert "target (50.0)" in [text.get_text() for text in axes.get_legend().get_texts()]
    (_, small), (_, large) = _bars(chart)
    assert large > small


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
