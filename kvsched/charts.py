"""Grouped bar charts for the benches' `--plot PATH`, drawn with matplotlib (the `bench` extra).

A chart is groups along the x axis (for example R = 32, 128, 256), one bar per series in each
group (spec, impl), with optional horizontal reference lines (a target, a measured bandwidth).
A logarithmic y axis suits figures that differ by orders of magnitude. Bars with no value are
left out; every bar carries its value, written along the bar so neighbours never overlap, and
each reference line is named in the legend with its value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Reference:
    """A horizontal line across the chart at `value`, labelled."""

    label: str
    value: float


@dataclass
class BarChart:
    """Groups of bars: `series[name][i]` is the bar of series `name` in group `groups[i]`."""

    title: str
    unit: str
    groups: Sequence[str]
    series: dict[str, list[float | None]]
    references: list[Reference] = field(default_factory=list)
    log_scale: bool = False

    def __post_init__(self) -> None:
        if not self.groups or not self.series:
            raise ValueError("a chart needs at least one group and one series")
        for name, series in self.series.items():
            if len(series) != len(self.groups):
                raise ValueError(f"series {name!r} has {len(series)} values for {len(self.groups)} groups")
        present = [value for values in self.series.values() for value in values if value is not None]
        present += [reference.value for reference in self.references]
        if not present:
            raise ValueError("a chart needs at least one value")
        if any(value < 0 or not math.isfinite(value) for value in present):
            raise ValueError("bar values must be finite and non-negative")
        if self.log_scale and any(value <= 0 for value in present):
            raise ValueError("a logarithmic chart needs positive values")

    def figure(self) -> Any:
        """The chart as a matplotlib figure (no window: the Agg/SVG backends only)."""
        from matplotlib.figure import Figure

        figure = Figure(figsize=(8, 4.8), layout="constrained")
        axes = figure.add_subplot()
        width = 0.8 / len(self.series)
        for index, (name, values) in enumerate(self.series.items()):
            drawn = [(g, value) for g, value in enumerate(values) if value is not None]
            bars = axes.bar(
                [g - 0.4 + width * (index + 0.5) for g, _ in drawn], [value for _, value in drawn], width, label=name
            )
            axes.bar_label(bars, labels=[number(value) for _, value in drawn], rotation=90, padding=2, fontsize=7)
        for index, reference in enumerate(self.references):
            axes.axhline(
                reference.value,
                color="0.2",
                linestyle=("--", ":", "-.")[index % 3],
                linewidth=1,
                label=f"{reference.label} ({number(reference.value)})",
            )
        axes.set_xticks(range(len(self.groups)), list(self.groups))
        axes.set_ylabel(self.unit)
        axes.set_title(self.title, fontsize=10)
        if self.log_scale:
            axes.set_yscale("log")
        axes.margins(y=0.25)
        axes.legend(fontsize=7, loc="upper left")
        return figure

    def write(self, path: str) -> None:
        """Write the chart to `path`; the format follows its suffix (.svg, .png, .pdf)."""
        from matplotlib import rc_context

        with rc_context({"svg.fonttype": "none", "svg.hashsalt": "kvsched"}):  # text stays text
            self.figure().savefig(path, metadata={"Date": None} if path.endswith(".svg") else None)


def number(value: float) -> str:
    """A bar's value as its label."""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2g}"
