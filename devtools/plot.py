"""Grouped bar charts as standalone SVG, for the benches' `--plot PATH` (standard library only).

A chart is groups along the x axis (for example R = 32, 128, 256), one bar per series in each
group (spec, impl), with optional horizontal reference lines (a target, a measured bandwidth).
A logarithmic y axis suits figures that differ by orders of magnitude. Bars with no value are
left out; every bar carries its value as a label, so the picture never hides the number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
WIDTH, HEIGHT = 720, 400
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 50, 80


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
        present = self._present()
        if not present:
            raise ValueError("a chart needs at least one value")
        if any(value < 0 or not math.isfinite(value) for value in present):
            raise ValueError("bar values must be finite and non-negative")
        if self.log_scale and any(value <= 0 for value in present):
            raise ValueError("a logarithmic chart needs positive values")

    def _values(self) -> list[float | None]:
        return [value for values in self.series.values() for value in values] + [r.value for r in self.references]

    def _present(self) -> list[float]:
        return [value for value in self._values() if value is not None]

    def _range(self) -> tuple[float, float]:
        values = self._present()
        if self.log_scale:
            return 10 ** math.floor(math.log10(min(values))), 10 ** math.ceil(math.log10(max(values)))
        return 0.0, _nice_ceiling(max(values))

    def _y(self, value: float) -> float:
        low, high = self._range()
        height = HEIGHT - TOP - BOTTOM
        if self.log_scale:
            fraction = (math.log10(value) - math.log10(low)) / (math.log10(high) - math.log10(low))
        else:
            fraction = (value - low) / (high - low) if high > low else 0.0
        return HEIGHT - BOTTOM - fraction * height

    def _ticks(self) -> list[float]:
        low, high = self._range()
        if self.log_scale:
            return [10.0**power for power in range(round(math.log10(low)), round(math.log10(high)) + 1)]
        return [high * step / 5 for step in range(6)]

    def svg(self) -> str:
        """The chart as an SVG document."""
        parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">',
            f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
            f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="14">{escape(self.title)}</text>',
            f'<text x="16" y="{(TOP + HEIGHT - BOTTOM) / 2}" text-anchor="middle" '
            f'transform="rotate(-90 16 {(TOP + HEIGHT - BOTTOM) / 2})">{escape(self.unit)}</text>',
        ]
        for tick in self._ticks():
            y = self._y(tick)
            parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
            parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_number(tick)}</text>')
        parts += self._bars()
        for index, reference in enumerate(self.references):
            y = self._y(reference.value)
            parts.append(
                f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                'stroke="#333" stroke-dasharray="6 4"/>'
            )
            anchor_x = WIDTH - RIGHT - 4 - 230 * (index % 2)
            parts.append(
                f'<text x="{anchor_x}" y="{y - 4:.1f}" text-anchor="end">'
                f"{escape(reference.label)} ({_number(reference.value)})</text>"
            )
        parts.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" stroke="#333"/>')
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{HEIGHT - BOTTOM}" y2="{HEIGHT - BOTTOM}" stroke="#333"/>'
        )
        parts += self._legend()
        parts.append("</svg>")
        return "\n".join(parts) + "\n"

    def _bars(self) -> list[str]:
        parts = []
        group_width = (WIDTH - LEFT - RIGHT) / len(self.groups)
        bar_width = group_width * 0.8 / len(self.series)
        base = self._y(self._range()[0]) if self.log_scale else self._y(0.0)
        for g, group in enumerate(self.groups):
            left = LEFT + g * group_width + group_width * 0.1
            parts.append(
                f'<text x="{LEFT + (g + 0.5) * group_width:.1f}" y="{HEIGHT - BOTTOM + 16}" '
                f'text-anchor="middle">{escape(group)}</text>'
            )
            for s, values in enumerate(self.series.values()):
                value = values[g]
                if value is None:
                    continue
                x, y = left + s * bar_width, self._y(value)
                parts.append(
                    f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_width * 0.92:.1f}" height="{max(base - y, 0.5):.1f}" '
                    f'fill="{PALETTE[s % len(PALETTE)]}"/>'
                )
                parts.append(
                    f'<text x="{x + bar_width * 0.46:.1f}" y="{y - 3:.1f}" text-anchor="middle" font-size="9">'
                    f"{_number(value)}</text>"
                )
        return parts

    def _legend(self) -> list[str]:
        parts = []
        x = LEFT
        for s, name in enumerate(self.series):
            y = HEIGHT - 30
            parts.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{PALETTE[s % len(PALETTE)]}"/>')
            parts.append(f'<text x="{x + 14}" y="{y}">{escape(name)}</text>')
            x += 24 + 7 * len(name)
        return parts


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten at or above `value` (1 for 0)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(step * power for step in (1.0, 2.0, 2.5, 5.0, 10.0) if step * power >= value)


def _number(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2g}"


def write(chart: BarChart, path: str) -> None:
    """Write `chart` as an SVG file."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(chart.svg())
