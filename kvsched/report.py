"""Plain-text tables for the command-line reports (`kvsched verify`, `kvsched proofs`), and the
benches' way to their chart writer."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType


def print_table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> None:
    """Left-aligned columns as wide as their widest cell, the header ruled off."""
    cells = [[str(value) for value in row] for row in [header, *rows]]
    widths = [max(len(row[column]) for row in cells) for column in range(len(header))]
    for index, row in enumerate(cells):
        print("  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)))
        if index == 0:
            print("  ".join("-" * width for width in widths))


def load_plot() -> ModuleType:
    """The benches' chart writer, which lives in a kvsched checkout (`devtools.plot`), not in the
    installed package; `--plot` outside a checkout is refused with a clear message."""
    try:
        return importlib.import_module("devtools.plot")
    except ModuleNotFoundError as error:
        raise SystemExit("--plot draws with devtools.plot: run the bench from a kvsched checkout") from error
