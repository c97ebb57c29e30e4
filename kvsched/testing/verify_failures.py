"""`kvsched verify --failures DIR`: every counterexample a campaign found, run first by every later run.

Beside `kvsched check`'s findings (`kvsched.testing.failures`, DIR's own files), a campaign's
counterexamples are kept in DIR's folder `verify/`, one JSON file each: the campaign's name, the
system's configuration, the program's lines (`state.RULE(NAME=VALUE, ...)`, as hypothesis prints
them) and the failure it raised when it was found. Before a campaign searches, every program
stored under its name runs again on a fresh machine: one that still fails is the campaign's
result at once (no search; its row counts no programs); one that passes now is said to pass, and
the search runs. A campaign that fails stores its program. So a counterexample found once, by any
worker or any run, is tried first by all that follow, whatever seed they draw.

A stored line is data, never code: it must call a rule, invariant or the teardown of
`KvschedMachine` with keyword arguments bound to its signature, each argument a literal, a member
of an enum of the events' alphabet, or one of its classes called with such arguments. A file that
is not such a program is a `BadFinding` (`kvsched verify` exits 2, naming the file).
"""

from __future__ import annotations

import ast
import enum
import hashlib
import inspect
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hypothesis.stateful import INITIALIZE_RULE_MARKER, INVARIANT_MARKER, RULE_MARKER

from kvsched.testing.campaign import CampaignResult, format_program, program_namespace
from kvsched.testing.failures import BadFinding, FailureStore, method_call
from kvsched.testing.machine import KvschedMachine
from kvsched.testing.system import SystemConfig, SystemFactory

FOLDER = "verify"  # the campaigns' counterexamples, in the failure store's directory
MACHINE_LINE = "state = KvschedMachine(factory, reference, config)"


MARKERS = (RULE_MARKER, INITIALIZE_RULE_MARKER, INVARIANT_MARKER)


def _calls() -> dict[str, inspect.Signature]:
    """What a stored line may call on the machine: its rules, its invariants, its teardown."""
    calls = {"teardown": inspect.signature(KvschedMachine.teardown)}
    for name, member in inspect.getmembers(KvschedMachine, inspect.isfunction):
        if any(getattr(member, marker, None) is not None for marker in MARKERS):
            calls[name] = inspect.signature(member)
    return calls


CALLS = _calls()
# The names an argument may use: the spec's classes and enums that `PROGRAM_IMPORTS` binds.
NAMES = {
    name: value
    for name, value in program_namespace().items()
    if isinstance(value, type) and value.__module__.startswith("kvsched.spec.")
}


def _value(node: ast.expr) -> Any:
    """An argument's value: a literal, an enum's member, a class of `NAMES` called with values."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple | ast.List):
        items = [_value(item) for item in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        number = node.operand.value
        if isinstance(number, int | float) and not isinstance(number, bool):
            return -number
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in NAMES:
        kind = NAMES[node.value.id]
        if issubclass(kind, enum.Enum) and node.attr in kind.__members__:
            return kind[node.attr]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in NAMES:
        kind = NAMES[node.func.id]
        if not issubclass(kind, enum.Enum) and all(keyword.arg is not None for keyword in node.keywords):
            arguments = [_value(argument) for argument in node.args]
            return kind(*arguments, **{keyword.arg or "": _value(keyword.value) for keyword in node.keywords})
    raise ValueError(f"{ast.unparse(node)!r} is not a literal, an event's enum or class")


def parse_line(line: str) -> tuple[str, dict[str, Any]]:
    """A stored line `state.RULE(NAME=VALUE, ...)`: the call's name and arguments (ValueError
    otherwise, also when they do not fit its signature)."""
    name, node = method_call(line, "state")
    if node.args or any(keyword.arg is None for keyword in node.keywords):
        raise ValueError(f"{line!r} is not a call state.RULE(NAME=VALUE, ...)")
    if name not in CALLS:
        raise ValueError(f"{line!r}: {name} is not a rule of the machine")
    try:
        arguments = {keyword.arg or "": _value(keyword.value) for keyword in node.keywords}
    except (TypeError, ValueError) as error:
        raise ValueError(f"{line!r}: {error}") from error
    try:
        CALLS[name].bind(None, **arguments)
    except TypeError as error:
        raise ValueError(f"{line!r}: {error}") from error
    return name, arguments


@dataclass(frozen=True, slots=True)
class ProgramFinding:
    """A campaign's counterexample: its program over `config` and the failure it raised."""

    campaign: str
    config: dict[str, int]
    lines: tuple[str, ...]
    failure: str

    @property
    def name(self) -> str:
        """The file it is stored as: the same program of the same campaign, one file."""
        digest = hashlib.sha256(json.dumps([self.campaign, self.config, self.lines], sort_keys=True).encode())
        return f"{digest.hexdigest()[:16]}.json"

    def program(self, setup: str, failure: str) -> str:
        """The runnable reproduction, as a campaign prints it, naming `failure`."""
        return format_program(setup, SystemConfig(**self.config), failure, [MACHINE_LINE, *self.lines])


def from_counterexample(campaign: str, program: str) -> ProgramFinding:
    """The finding in a campaign's printed reproduction (`format_program`'s text)."""
    lines = program.splitlines()
    config_line = next(line for line in lines if line.startswith("config = SystemConfig("))
    call = ast.parse(config_line).body[0]
    if not (isinstance(call, ast.Assign) and isinstance(call.value, ast.Call)):
        raise ValueError(f"{config_line!r} does not make the configuration")
    config = {keyword.arg or "": ast.literal_eval(keyword.value) for keyword in call.value.keywords}
    failure = next((line for line in lines if line.startswith("# expected failure: ")), "")
    start = lines.index(MACHINE_LINE)
    calls = tuple(line for line in lines[start + 1 :] if line.startswith("state."))
    return ProgramFinding(campaign, config, calls, failure.removeprefix("# expected failure: "))


def replay(factory: SystemFactory, reference: SystemFactory | None, finding: ProgramFinding) -> str | None:
    """Run the finding's program on a fresh machine, then its teardown: the failure it raises
    now (`TYPE: MESSAGE`), or None when it passes."""
    calls = [parse_line(line) for line in finding.lines]
    try:
        machine = KvschedMachine(factory, reference, SystemConfig(**finding.config))
        for name, arguments in calls:
            getattr(machine, name)(**arguments)
        if not calls or calls[-1][0] != "teardown":
            machine.teardown()
    except Exception as error:  # a campaign's failure is any exception its program raises
        return f"{type(error).__name__}: {error}"
    return None


class ProgramStore:
    """The campaigns' findings in `directory / FOLDER` (made before anything runs, so that a
    campaign learns first that it could not store what it finds)."""

    def __init__(self, directory: Path) -> None:
        self.directory = FailureStore(directory / FOLDER).directory

    def findings(self, campaign: str) -> list[tuple[Path, ProgramFinding]]:
        """Every finding stored for `campaign`, by file name (a fixed order)."""
        found = []
        for path in sorted(self.directory.glob("*.json")):
            finding = self._read(path)
            if finding.campaign == campaign:
                found.append((path, finding))
        return found

    def add(self, finding: ProgramFinding) -> Path:
        """Store `finding` (once: the same program of the same campaign is one file)."""
        path = self.directory / finding.name
        path.write_text(json.dumps({**asdict(finding), "lines": list(finding.lines)}, indent=1) + "\n")
        return path

    @staticmethod
    def _read(path: Path) -> ProgramFinding:
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or set(data) != {"campaign", "config", "lines", "failure"}:
                raise TypeError("not the fields campaign, config, lines and failure")
            campaign, config, lines, failure = data["campaign"], data["config"], data["lines"], data["failure"]
            if not isinstance(campaign, str) or not isinstance(failure, str):
                raise TypeError("campaign and failure must be strings")
            if not isinstance(config, dict) or not all(
                isinstance(value, int) and not isinstance(value, bool) for value in config.values()
            ):
                raise TypeError("config: not a table of integers")
            SystemConfig(**config)
            if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
                raise TypeError("lines: not a list of strings")
            for line in lines:
                parse_line(line)
        except (OSError, ValueError, TypeError) as error:
            raise BadFinding(f"{path}: not a stored program ({error})") from error
        return ProgramFinding(campaign, config, tuple(lines), failure)


@dataclass(frozen=True, slots=True)
class Replayed:
    """A campaign's stored findings run again: the first that still fails (its file, its program
    as the campaign prints it), or None; and how many ran."""

    failing: tuple[Path, str] | None
    count: int


def replay_stored(
    store: ProgramStore, campaign: str, factory: SystemFactory, reference: SystemFactory | None, setup: str
) -> Replayed:
    """Run `campaign`'s stored findings in order, up to the first that still fails."""
    findings: Sequence[tuple[Path, ProgramFinding]] = store.findings(campaign)
    for count, (path, finding) in enumerate(findings, 1):
        failure = replay(factory, reference, finding)
        if failure is not None:
            return Replayed((path, finding.program(setup, failure)), count)
    return Replayed(None, len(findings))


def replayed_result(campaign: str, program: str) -> CampaignResult:
    """The row of a campaign whose stored finding still fails: no program searched."""
    return CampaignResult(campaign, 0, 0, 0, 0, 0.0, program)
