"""A failure store: every counterexample a safety campaign found, replayed first by every later run.

`kvsched check TARGET --failures DIR` keeps each finding as one JSON file in DIR (storage every
worker and every later run reaches): the target, the pool the program ran on, its calls, and the
check it failed. Before its search, a campaign replays every finding stored for its target and
page size over a fresh manager: one that still fails is the campaign's result at once, without a
search (the finding the team has not fixed yet, first); one that passes now is reported as
passing and the search runs. A campaign that fails stores its shrunk program. So a finding found
once, by any worker or any run, is checked first by all that follow, whatever seed they draw.

A file's calls are the harness's own (`machine.VERB(literal, ...)`, as `SafetyMachine.program`
writes them). A replay parses each call and runs only the harness's verbs with literal
arguments: a file is data, never code. A file that is not a finding is a `BadFinding`, which
`kvsched check` reports as a usage error (exit 2) naming the file.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvsched.testing.adapter import ManagerFactory
from kvsched.testing.checks import CheckFailed, CheckFailure
from kvsched.testing.safety import SafetyMachine

VERBS = frozenset(
    {
        "submit",
        "decode",
        "speculate",
        "finish",
        "preempt",
        "resume",
        "fork",
        "reset_cache",
        "lookup",
        "commit",
        "lease",
        "end_lease",
        "demote",
        "complete_copy",
        "teardown",
    }
)  # the calls `SafetyMachine.program` records


class BadFinding(ValueError):
    """A stored finding that cannot be read or replayed as one (its file named)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """A counterexample: the target's program over a pool of `pages` pages of `page_size` tokens,
    and the check it failed when it was found."""

    target: str
    pages: int
    page_size: int
    calls: tuple[str, ...]
    check: str
    detail: str

    @property
    def name(self) -> str:
        """The file it is stored as: the same program of the same target, one file."""
        digest = hashlib.sha256(json.dumps([self.target, self.pages, self.page_size, self.calls]).encode())
        return f"{digest.hexdigest()[:16]}.json"


def method_call(line: str, receiver: str) -> tuple[str, ast.Call]:
    """A stored line `RECEIVER.NAME(...)`: the name and the call's node (ValueError otherwise)."""
    try:
        node = ast.parse(line.strip(), mode="eval").body
    except SyntaxError as error:
        raise ValueError(f"{line!r} is not a call") from error
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == receiver
    ):
        raise ValueError(f"{line!r} is not a call {receiver}.NAME(...)")
    return node.func.attr, node


def parse_call(line: str) -> tuple[str, tuple[Any, ...]]:
    """A recorded call `machine.VERB(ARGS)`: its verb and literal arguments (ValueError otherwise)."""
    verb, node = method_call(line, "machine")
    if node.keywords:
        raise ValueError(f"{line!r} is not a call machine.VERB(...)")
    if verb not in VERBS:
        raise ValueError(f"{line!r}: {verb} is not one of the harness's calls")
    try:
        return verb, tuple(ast.literal_eval(argument) for argument in node.args)
    except ValueError as error:
        raise ValueError(f"{line!r}: its arguments are not literals") from error


def from_program(target: str, program: str, failure: CheckFailure) -> Finding:
    """The finding a campaign printed: `program` as `format_program` writes it."""
    lines = program.splitlines()
    machine = next(index for index, line in enumerate(lines) if line.startswith("machine = SafetyMachine("))
    sizes = ast.parse(lines[machine]).body[0]
    if not (isinstance(sizes, ast.Assign) and isinstance(sizes.value, ast.Call)):
        raise ValueError(f"{lines[machine]!r} does not make the machine")
    size: dict[str, int] = {keyword.arg or "": ast.literal_eval(keyword.value) for keyword in sizes.value.keywords}
    calls = tuple(line for line in lines[machine + 1 :] if line.strip())
    return Finding(target, size["pages"], size["page_size"], calls, failure.kind.name, failure.detail)


def replay(factory: ManagerFactory, finding: Finding) -> CheckFailure | None:
    """The finding's calls over a fresh manager from `factory`, then the teardown: the check that
    fails, or None when every call passes now."""
    calls = [parse_call(line) for line in finding.calls]
    try:
        machine = SafetyMachine(factory, finding.pages, finding.page_size)
        for verb, arguments in calls:
            getattr(machine, verb)(*arguments)
        if not calls or calls[-1][0] != "teardown":
            machine.teardown()
    except CheckFailed as failed:
        return failed.failure
    return None


class FailureStore:
    """The findings in `directory`, one JSON file each (the directory made if it is not there, so
    that a campaign learns before it runs that it could not store what it finds)."""

    def __init__(self, directory: Path) -> None:
        if directory.exists() and not directory.is_dir():
            raise BadFinding(f"{directory} is not a directory")
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise BadFinding(f"{directory} cannot be made: {error}") from error
        if not os.access(directory, os.W_OK):
            raise BadFinding(f"{directory} is not writable")
        self.directory = directory

    def findings(self, target: str, page_size: int) -> list[tuple[Path, Finding]]:
        """Every finding stored for `target` at `page_size`, by file name (a fixed order)."""
        found = []
        for path in sorted(self.directory.glob("*.json")):
            finding = self._read(path)
            if finding.target == target and finding.page_size == page_size:
                found.append((path, finding))
        return found

    def add(self, finding: Finding) -> Path:
        """Store `finding` (once: the same program of the same target is one file)."""
        path = self.directory / finding.name
        data = {**asdict(finding), "calls": list(finding.calls)}
        path.write_text(json.dumps(data, indent=1) + "\n")
        return path

    @staticmethod
    def _read(path: Path) -> Finding:
        try:
            data = json.loads(path.read_text())
            finding = Finding(
                target=_typed(data, "target", str),
                pages=_typed(data, "pages", int),
                page_size=_typed(data, "page_size", int),
                calls=tuple(_typed(data, "calls", list)),
                check=_typed(data, "check", str),
                detail=_typed(data, "detail", str),
            )
            if not all(isinstance(line, str) for line in finding.calls):
                raise TypeError("calls: not every call is a string")
            for line in finding.calls:
                parse_call(line)
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise BadFinding(f"{path}: not a stored finding ({error})") from error
        return finding


def _typed(data: Any, field: str, kind: type) -> Any:
    """`data[field]`, which must be a `kind` (a bool is no int)."""
    value = data[field]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{field}: {value!r} is not of type {kind.__name__}")
    return value


def replay_all(
    factory: ManagerFactory, findings: Sequence[tuple[Path, Finding]]
) -> tuple[tuple[Path, Finding, CheckFailure] | None, int]:
    """Replay `findings` in order: the first that still fails (its file, the finding, the check it
    fails now), or None; and how many were replayed."""
    for count, (path, finding) in enumerate(findings, 1):
        failure = replay(factory, finding)
        if failure is not None:
            return (path, finding, failure), count
    return None, len(findings)
