"""Plain-text tables for the command-line reports (`kvsched verify`, `kvsched proofs`)."""

from __future__ import annotations

from collections.abc import Sequence


def print_table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> None:
    """Left-aligned columns as wide as their widest cell, the header ruled off."""
    cells = [[str(value) for value in row] for row in [header, *rows]]
    widths = [max(len(row[column]) for row in cells) for column in range(len(header))]
    for index, row in enumerate(cells):
        print("  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)))
        if index == 0:
            print("  ".join("-" * width for width in widths))
