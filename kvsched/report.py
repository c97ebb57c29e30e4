"""What the commands print: plain-text tables, JSON documents, progress on stderr, and the one
error that means "not run as asked" (exit status 2)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn, TextIO


class UsageError(Exception):
    """A command could not run as asked (bad arguments, an import or configuration error, a
    missing extra): one line on stderr, exit status 2."""


class CommandParser(argparse.ArgumentParser):
    """Every command's parser: a usage mistake is one line on stderr naming it, and exit status 2
    (argparse's own prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def print_table(rows: Sequence[Sequence[object]], header: Sequence[str], file: TextIO | None = None) -> None:
    """Left-aligned columns as wide as their widest cell, the header ruled off."""
    cells = [[str(value) for value in row] for row in [header, *rows]]
    widths = [max(len(row[column]) for row in cells) for column in range(len(header))]
    for index, row in enumerate(cells):
        print("  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip(), file=file)
        if index == 0:
            print("  ".join("-" * width for width in widths), file=file)


def measurement(command: str) -> dict[str, object]:
    """Where and when a figure was measured, for its JSON report: the UTC date and time, the
    command, the machine (CPUs, processor, Python) and its load average over the last minute
    when the run started (a shared machine's load changes the times, never the verdicts)."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": command,
        "cpus": os.cpu_count(),
        "machine": f"{platform.machine()} {platform.processor() or platform.system()}".strip(),
        "python": platform.python_version(),
        "load_1min": round(os.getloadavg()[0], 2),
    }


def bench_main(
    prog: str,
    doc: str,
    argv: list[str] | None,
    rows: Callable[[], list[dict[str, Any]]],
    report: Callable[[list[dict[str, Any]]], dict[str, Any]],
    table: tuple[Sequence[str], Callable[[dict[str, Any]], list[object]]],
) -> int:
    """A bench command: `--json PATH` writes `report(rows())` with how it was measured; the
    table (`table`: its header and a row's cells) is printed unless the JSON goes to stdout."""
    parser = CommandParser(prog=prog, description=doc.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="write the JSON report to PATH ('-': stdout)")
    args = parser.parse_args(argv)
    measured = measurement(" ".join([prog, *(argv if argv is not None else sys.argv[1:])]))
    measured_rows = rows()
    if args.json:
        write_json(args.json, {"measured": measured, **report(measured_rows)})
    if args.json != "-":
        header, cells = table
        print_table([cells(row) for row in measured_rows], header)
    return 0


def write_json(path: str, payload: object) -> None:
    """Every command's `--json PATH`: one JSON document at PATH, or on stdout for `-`; a
    `UsageError` when PATH cannot be written."""
    text = json.dumps(payload, indent=2)
    if path == "-":
        print(text)
        return
    try:
        Path(path).write_text(text + "\n", encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write --json {path}: {error.strerror or error}") from error


def require_writable(path: str, command: str) -> None:
    """A `UsageError` before a long run whose `--json PATH` could not be written after it."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{command}: --json {path} is a folder; name a file")
    folder = target.parent
    if not folder.is_dir():
        raise UsageError(f"{command}: --json {path}: no folder {folder}")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UsageError(f"{command}: --json {path} cannot be written")


class Progress:
    """`done of total` on stderr: one line redrawn in place on a terminal; elsewhere (a CI log)
    plain lines, one per tenth of the total and one per change of phase, with no escape codes."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None) -> None:
        self.label, self.total = label, total
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self._step, self._phase, self._shown = max(1, total // 10), "", False

    def update(self, done: int, phase: str = "") -> None:
        if phase or done > self.total:  # hypothesis may run a few programs past its count
            message = f"{self.label}: {phase or 'finishing'}, {done} run"
        else:
            message = f"{self.label}: {done} of {self.total}"
        if self.live:
            self.stream.write(f"\r\x1b[2K{message}")
        elif phase != self._phase or (not phase and done % self._step == 0):
            self.stream.write(message + "\n")
        else:
            return
        self._phase, self._shown = phase, True
        self.stream.flush()

    def note(self, message: str) -> None:
        """Show `message` after the label: redrawn in place on a terminal, a line elsewhere."""
        text = f"{self.label}: {message}"
        self.stream.write(f"\r\x1b[2K{text}" if self.live else text + "\n")
        self._shown = True
        self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self.live and self._shown:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
