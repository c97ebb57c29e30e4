"""Model-checking campaigns: run a machine for N examples, count, time, and report.

A campaign runs `KvschedMachine` on one system under test with a seed, shows progress on
stderr, and returns a `CampaignResult`; a counterexample comes back as a runnable program.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import seed, settings
from hypothesis.stateful import get_state_machine_test, run_state_machine_as_test

from kvsched.report import Progress
from kvsched.testing.bounded import bounded
from kvsched.testing.machine import CampaignStats, KvschedMachine
from kvsched.testing.system import SystemConfig, SystemFactory

# What a printed program's lines name: the machine, its configuration, and the events (a rule
# may take an event or a fault as its argument).
PROGRAM_IMPORTS = """from kvsched.spec import PrefixIdentity
from kvsched.spec.events import *  # noqa: F403
from kvsched.testing.machine import KvschedMachine
from kvsched.testing.system import SystemConfig"""


def program_namespace() -> dict[str, Any]:
    """The names `PROGRAM_IMPORTS` binds, for running a program's lines with `exec`."""
    namespace: dict[str, Any] = {}
    exec(PROGRAM_IMPORTS, namespace)
    return namespace


@dataclass(frozen=True, slots=True)
class CampaignResult:
    """One campaign's summary row, and its counterexample if it found one."""

    machine: str
    examples: int
    steps: int
    invariant_checks: int
    decoded_tokens: int
    seconds: float
    counterexample: str | None

    @property
    def outcome(self) -> str:
        """ "pass", or "FAIL" when a counterexample was found."""
        return "pass" if self.counterexample is None else "FAIL"


def run_machine(build: Callable[[], KvschedMachine], run_settings: settings) -> None:
    """Run machines from `build` as one hypothesis test (raises on a counterexample)."""
    machine_factory: Any = build  # hypothesis accepts any zero-argument machine factory
    run_state_machine_as_test(machine_factory, settings=run_settings)


def run_campaign(
    name: str,
    factory: SystemFactory,
    reference: SystemFactory | None,
    *,
    examples: int,
    steps: int,
    random_seed: int,
    config: SystemConfig | None = None,
    setup: str = "from kvsched.testing.system import spec_system\nfactory, reference = spec_system, None",
    progress: Callable[[int], None] | None = None,
) -> CampaignResult:
    """Run `examples` random programs of up to `steps` operations each against `factory`.

    `setup` is Python that defines `factory` and `reference` the way this call received them;
    it heads the reproduction printed for a counterexample. `progress(examples run)` is called
    as each program starts (default: a `Progress` line on stderr).
    """
    stats = CampaignStats()
    bar = Progress(name, examples)
    show = progress or bar.update

    def build() -> KvschedMachine:
        show(stats.examples)
        return KvschedMachine(factory, reference, config, stats)

    run_settings = bounded(examples, steps, seeded=True)
    machine_factory: Any = build  # hypothesis accepts any zero-argument machine factory
    test = seed(random_seed)(get_state_machine_test(machine_factory, settings=run_settings))
    started = time.perf_counter()
    counterexample = None
    try:
        with bar:
            test()
    except Exception as error:
        failure = f"{type(error).__name__}: {error}"
        program = extract_program(getattr(error, "__notes__", []))
        counterexample = format_program(setup, config or SystemConfig(), failure, program)
    return CampaignResult(
        name,
        stats.examples,
        stats.steps,
        stats.invariant_checks,
        stats.decoded_tokens,
        time.perf_counter() - started,
        counterexample,
    )


def format_program(setup: str, config: SystemConfig, failure: str, program: list[str]) -> str:
    """A counterexample as a campaign prints it: the imports, `setup`, the configuration, the
    failure expected, and the program's lines (the machine's construction first)."""
    return "\n".join([PROGRAM_IMPORTS, setup, f"config = {config!r}", f"# expected failure: {failure}", *program])


def extract_program(notes: list[str]) -> list[str]:
    """The runnable lines of hypothesis' failing-program report, on a configured machine."""
    lines = "\n".join(notes).splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("state = ")), len(lines))
    program = ["state = KvschedMachine(factory, reference, config)"]
    for line in lines[start + 1 :]:
        if not line.startswith(("state.", "#")):
            break
        program.append(line)
    return program
