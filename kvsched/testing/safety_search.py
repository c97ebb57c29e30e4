"""Safety-mode campaigns: hypothesis drives a `SafetyMachine` over anyone's page manager.

`search_safety(factory)` runs a bounded campaign (examples and steps, never a time budget, decide
what is searched), and returns a `SafetyResult`. On a failure the result holds the shrunk
counterexample as a program over the user's own factory, which runs as it is printed:

    from kvsched.testing import SafetyMachine
    from mymodule import factory

    machine = SafetyMachine(factory, pages=8, page_size=2)
    machine.submit(1, (0, 1, 2, 0))
    machine.submit(2, (0, 1, 2, 0))   # CheckFailed: full prefix hit ...

Prompts are built to repeat: each is the start of one of three fixed page sequences, then up to
a page of tokens of a three-token vocabulary (`prompt_starts`), so prefix hits, page reuse and
pages of the same tokens under another context come early, and each call shrinks on its own.
Shrinking is bounded by hypothesis's own count of shrinks, and optionally by `shrink_seconds`,
which can only change the counterexample printed, never whether one is found; the result says
when that bound cut shrinking short.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import hypothesis.internal.conjecture.engine as conjecture_engine
import hypothesis.internal.conjecture.providers as hypothesis_providers
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.reporting import with_reporter
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test, precondition, rule

from kvsched.testing.adapter import ManagerFactory
from kvsched.testing.checks import CheckFailed, CheckFailure
from kvsched.testing.safety import VOCABULARY, SafetyMachine

IDS = st.integers(1, 5)  # request ids: at most five requests live or preempted at once
MAX_TOKENS = 16  # a sequence stops decoding here
CUT_SHORT = "stopped because it is making very slow progress"  # hypothesis's report when shrinking times out


@dataclass(frozen=True, slots=True)
class SafetyResult:
    """One campaign: what ran, and the counterexample if a check failed."""

    target: str
    programs: int  # programs run, shrinking's included
    steps: int
    seed: int
    seconds: float
    failure: CheckFailure | None = None
    program: str | None = None  # the shrunk counterexample, runnable
    program_steps: int = 0
    shrink_cut_short: bool = False
    calls: dict[str, int] = field(default_factory=dict)  # totals over every example run

    @property
    def passed(self) -> bool:
        return self.failure is None


def prompt_starts(page_size: int) -> tuple[tuple[int, ...], ...]:
    """The prompts' starting pages: whole pages of one token each, in three orders, so prompts
    share starts (prefix hits) and share pages under another start (same tokens, other context)."""
    page = [(token,) * page_size for token in range(VOCABULARY)]
    return (page[0] + page[1] + page[2], page[2] + page[1] + page[0], page[1] + page[1] + page[2])


def machine_class(
    factory: ManagerFactory,
    pages: int,
    page_size: int,
    runs: list[SafetyMachine],
    progress: Callable[[int], None] | None = None,
) -> type:
    """A hypothesis state machine over `SafetyMachine(factory, pages, page_size)`; every machine
    it builds is appended to `runs` (hypothesis replays the shrunk failure last)."""
    starts = prompt_starts(page_size)

    class SafetyRun(RuleBasedStateMachine):
        # Calls name requests by id, and a call whose request is not in the state it needs does
        # nothing: deleting one call never changes what another means, so programs shrink well.
        def __init__(self) -> None:
            super().__init__()
            self.machine = SafetyMachine(factory, pages, page_size)
            runs.append(self.machine)
            if progress is not None:
                progress(len(runs))

        def _known(self, request_id: int) -> bool:
            return request_id in self.machine.sequences or request_id in self.machine.preempted

        @rule(
            request_id=IDS,
            start=st.integers(0, len(starts) - 1),
            keep=st.integers(0, 3 * page_size),
            extra=st.lists(st.integers(0, VOCABULARY - 1), max_size=page_size),
        )
        def submit(self, request_id: int, start: int, keep: int, extra: list[int]) -> None:
            if not self._known(request_id):
                self.machine.submit(request_id, (starts[start][:keep] + tuple(extra)) or (0,))

        @rule(request_id=IDS)
        def decode(self, request_id: int) -> None:
            if len(self.machine.sequences.get(request_id, ())) in range(1, MAX_TOKENS):
                self.machine.decode(request_id)

        @rule(rounds=st.integers(1, 4))
        def decode_all(self, rounds: int) -> None:
            """An engine's decode rounds: every live request decodes a token, `rounds` times."""
            for _ in range(rounds):
                for request_id in sorted(self.machine.sequences):
                    if len(self.machine.sequences[request_id]) < MAX_TOKENS:
                        self.machine.decode(request_id)

        @rule(request_id=IDS)
        def finish(self, request_id: int) -> None:
            if request_id in self.machine.sequences:
                self.machine.finish(request_id)

        @rule(request_id=IDS)
        def preempt(self, request_id: int) -> None:
            if request_id in self.machine.sequences:
                self.machine.preempt(request_id)

        @rule(request_id=IDS)
        def resume(self, request_id: int) -> None:
            if request_id in self.machine.preempted:
                self.machine.resume(request_id)

        @precondition(lambda self: "fork" in self.machine.capabilities)
        @rule(parent_id=IDS, child_id=IDS)
        def fork(self, parent_id: int, child_id: int) -> None:
            if parent_id in self.machine.sequences and not self._known(child_id):
                self.machine.fork(parent_id, child_id)

        @precondition(lambda self: "reset_cache" in self.machine.capabilities)
        @rule()
        def reset_cache(self) -> None:
            self.machine.reset_cache()

        def teardown(self) -> None:
            if not self.machine.failed:
                self.machine.teardown()

    return SafetyRun


@contextmanager
def seed_alone() -> Iterator[None]:
    """Generation as a function of the seed alone. Hypothesis draws some values (5 %) from the
    literals of the local modules loaded so far, its "local constants", so what a seed generates
    would change with what the process had imported; inside, only its global constants are drawn."""
    providers: Any = hypothesis_providers
    sets: Any = type(providers.GLOBAL_CONSTANTS.integers)
    empty = providers.Constants(integers=sets(), floats=sets(key=providers.float_to_int), bytes=sets(), strings=sets())
    saved: Any = (providers._get_local_constants, providers.CONSTANTS_CACHE)
    providers._get_local_constants = lambda: empty
    providers.CONSTANTS_CACHE = type(saved[1])(1024)  # its entries hold the local constants seen
    try:
        yield
    finally:
        providers._get_local_constants, providers.CONSTANTS_CACHE = saved


def format_program(machine: SafetyMachine, failure: CheckFailure, factory_module: str, factory_name: str) -> str:
    """The machine's calls as a program over the user's factory, the failed check on top."""
    lines = [
        f"# {failure}",
        "from kvsched.testing import SafetyMachine",
        f"from {factory_module} import {factory_name}",
        "",
        f"machine = SafetyMachine({factory_name}, pages={machine.pages}, page_size={machine.page_size})",
        *machine.program,
    ]
    return "\n".join(lines) + "\n"


def search_safety(
    factory: ManagerFactory,
    *,
    examples: int = 200,
    steps: int = 30,
    seed_value: int = 0,
    pages: int = 8,
    page_size: int = 2,
    shrink_seconds: int | None = None,
    source: tuple[str, str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> SafetyResult:
    """A campaign of `examples` programs of up to `steps` calls each over fresh managers from
    `factory`; `source` (module, name) is how the printed program imports the factory.

    `shrink_seconds` bounds shrinking by time as well as by hypothesis's count of shrinks. Left
    None, the whole result, which check failed and the program printed, is a function of the
    seed alone; with a time bound, a slower machine may print a longer program, or the
    counterexample of another check found while shrinking (never a pass for a failure)."""
    module, name = source or (getattr(factory, "__module__", "__main__"), getattr(factory, "__qualname__", "factory"))
    runs: list[SafetyMachine] = []
    reports: list[str] = []
    machine = machine_class(factory, pages, page_size, runs, progress)
    options = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        derandomize=False,  # the seed decides, whatever profile is loaded
        report_multiple_bugs=False,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )
    saved = conjecture_engine.MAX_SHRINKING_SECONDS
    conjecture_engine.MAX_SHRINKING_SECONDS = 10**9 if shrink_seconds is None else shrink_seconds
    start = time.process_time()
    failure: CheckFailure | None = None
    try:
        with seed_alone(), with_reporter(lambda value: reports.append(str(value))):
            seed(seed_value)(get_state_machine_test(machine, settings=options))()
    except CheckFailed as error:
        failure = error.failure
    finally:
        conjecture_engine.MAX_SHRINKING_SECONDS = saved
    seconds = time.process_time() - start
    calls: dict[str, int] = {}
    for run in runs:
        for key, value in run.calls.items():
            calls[key] = calls.get(key, 0) + value
    result = SafetyResult(f"{module}:{name}", len(runs), steps, seed_value, seconds, calls=calls)
    if failure is None:
        return result
    last = runs[-1]
    return SafetyResult(
        result.target,
        result.programs,
        steps,
        seed_value,
        seconds,
        failure,
        format_program(last, failure, module, name),
        len(last.program),
        any(CUT_SHORT in report for report in reports),
        calls,
    )
