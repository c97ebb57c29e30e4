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
Each program's pool is one of `POOL_SIZES` pages, from a request or two's worth (pressure:
refusals, evictions and copy-on-write with no page left) to room for five. Shrinking is bounded
by a count of programs, never by time: the result is a function of the seed alone.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import hypothesis.internal.conjecture.engine as conjecture_engine
import hypothesis.internal.conjecture.providers as hypothesis_providers
import hypothesis.internal.conjecture.shrinker as conjecture_shrinker
from hypothesis import seed
from hypothesis import strategies as st
from hypothesis.reporting import with_reporter
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test, initialize, precondition, rule

from kvsched.spec.kv_layout import Recurrent
from kvsched.testing.adapter import ManagerFactory
from kvsched.testing.bounded import bounded
from kvsched.testing.checks import CheckFailed, CheckFailure
from kvsched.testing.safety import (
    COVERAGE,
    OPTIONAL_VERBS,
    VOCABULARY,
    NotAnAdapter,
    SafetyMachine,
    require_adapter,
    require_view,
)

IDS = st.integers(1, 5)  # request ids: at most five requests live or preempted at once
MAX_TOKENS = 16  # a sequence stops decoding here
POOL_SIZES = (4, 6, 8, 16)  # pages per manager, drawn per program: pressure (a request or two) to room
SHRINKS = 1500  # shrinking stops after this many programs run
MAX_PAGES = 4096  # the harness walks every page after every call
MAX_PAGE_SIZE = 256  # prompts run to three pages and a page of tokens


class BadSetting(ValueError):
    """A campaign setting out of its range; nothing ran."""


def check_settings(*, examples: int, steps: int, pages: int | None, page_size: int, shrinks: int) -> None:
    """A one-line `BadSetting` for the first setting out of range."""
    ranges = (
        ("examples", examples, 1, None, "programs to run"),
        ("steps", steps, 1, None, "calls per program"),
        ("pages", pages, 1, MAX_PAGES, "pages per manager"),
        ("page size", page_size, 1, MAX_PAGE_SIZE, "tokens per page"),
        ("shrinks", shrinks, 0, None, "programs shrinking may run"),
    )
    for name, value, low, high, what in ranges:
        if value is None and name == "pages":
            continue  # drawn per program from POOL_SIZES
        if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
            bound = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise BadSetting(f"{name} must be an int {bound} ({what}), not {value!r}")


@dataclass(frozen=True, slots=True)
class SafetyResult:
    """One campaign: what ran, what it exercised, and the counterexample if a check failed."""

    target: str
    programs: int  # programs run, shrinking's included
    steps: int
    seed: int
    seconds: float  # CPU seconds
    failure: CheckFailure | None = None
    program: str | None = None  # the shrunk counterexample, runnable
    program_steps: int = 0
    coverage: dict[str, int] = field(default_factory=dict)  # totals over every program run (`COVERAGE`)
    warnings: tuple[str, ...] = ()  # what the campaign could not check, and why

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
    pages: int | None,
    page_size: int,
    runs: list[SafetyMachine],
    progress: Callable[[int, bool], None] | None = None,
) -> type:
    """A hypothesis state machine over `SafetyMachine(factory, pages, page_size)`; every machine
    it builds is appended to `runs` (hypothesis replays the shrunk failure last)."""
    starts = prompt_starts(page_size)
    sizes = POOL_SIZES if pages is None else (pages,)
    found = [False]  # a program failed: the ones after it are shrinking's

    class SafetyRun(RuleBasedStateMachine):
        # Calls name requests by id, and a call whose request is not in the state it needs does
        # nothing: deleting one call never changes what another means, so programs shrink well.
        machine: SafetyMachine

        @initialize(size=st.sampled_from(sizes))
        def build(self, size: int) -> None:
            found[0] = found[0] or (bool(runs) and runs[-1].failed)
            self.machine = SafetyMachine(factory, size, page_size, check=False)
            runs.append(self.machine)
            if progress is not None:
                progress(len(runs), found[0])
            self.machine.check_start()  # once it is a run: a failure here is reported as the others

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
            if self.machine.ready(request_id) and len(self.machine.sequences[request_id]) < MAX_TOKENS:
                self.machine.decode(request_id)

        @rule(rounds=st.integers(1, 4))
        def decode_all(self, rounds: int) -> None:
            """An engine's decode rounds: every live request decodes a token, `rounds` times."""
            for _ in range(rounds):
                for request_id in sorted(self.machine.sequences):
                    if self.machine.ready(request_id) and len(self.machine.sequences[request_id]) < MAX_TOKENS:
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
            if self.machine.ready(parent_id) and not self._known(child_id):
                self.machine.fork(parent_id, child_id)

        @precondition(lambda self: "reset_cache" in self.machine.capabilities)
        @rule()
        def reset_cache(self) -> None:
            self.machine.reset_cache()

        def teardown(self) -> None:
            machine = getattr(self, "machine", None)  # None: the build raised, and that error is the one reported
            if machine is not None and not machine.failed:
                machine.teardown()

    # The rules of the optional two-phase admission and leases only for a manager that declares
    # them: a rule a program may draw changes every other program a seed gives, and the
    # campaigns over other managers stay as they were.
    declared = require_adapter(factory(min(sizes), page_size))

    class TwoPhaseRules:
        machine: SafetyMachine
        _known: Callable[[int], bool]

        @rule(
            request_id=IDS,
            start=st.integers(0, len(starts) - 1),
            keep=st.integers(0, 3 * page_size),
            extra=st.lists(st.integers(0, VOCABULARY - 1), max_size=page_size),
        )
        def lookup(self, request_id: int, start: int, keep: int, extra: list[int]) -> None:
            """The first phase of a two-phase admission; its commit comes some calls later."""
            if not self._known(request_id):
                self.machine.lookup(request_id, (starts[start][:keep] + tuple(extra)) or (0,))

        @rule(request_id=IDS)
        def commit(self, request_id: int) -> None:
            if request_id in self.machine.answers and not self._known(request_id):
                self.machine.commit(request_id)

        @rule(request_id=IDS, other=IDS, start=st.integers(0, len(starts) - 1), keep=st.integers(1, 3 * page_size))
        def lookup_then_reuse(self, request_id: int, other: int, start: int, keep: int) -> None:
            """A lookup; then another prompt takes every page it can and writes it (the pages the
            lookup found among them, when only the cache held them) and finishes; then the commit:
            the race between a lookup and its pin, which the separate rules rarely line up."""
            if request_id == other or self._known(request_id) or self._known(other):
                return
            self.machine.lookup(request_id, starts[start][:keep])
            take_every_page(self.machine, other)
            self.machine.commit(request_id)

    class LeaseRules:
        machine: SafetyMachine
        _known: Callable[[int], bool]

        @rule(request_id=IDS, other=IDS)
        def lease_across_finish(self, request_id: int, other: int) -> None:
            """A reader leases a request's pages; the request finishes and another prompt takes
            every page it can; then the reader reads: the lease must have kept its pages."""
            if not self.machine.ready(request_id) or request_id == other or self._known(other):
                return
            number = self.machine.lease(request_id)
            self.machine.finish(request_id)
            take_every_page(self.machine, other)
            if number is not None:
                self.machine.end_lease(number)

        @rule(request_id=IDS)
        def lease(self, request_id: int) -> None:
            """An asynchronous reader takes a live request's pages; it reads them some calls later."""
            if self.machine.ready(request_id):
                self.machine.lease(request_id)

        @rule(which=st.integers(0, 3))
        def end_lease(self, which: int) -> None:
            held = sorted(self.machine.leases)
            if held:
                self.machine.end_lease(held[which % len(held)])

    class TierRules:
        machine: SafetyMachine
        _known: Callable[[int], bool]

        @rule()
        def demote(self) -> None:
            """The manager copies what it would evict next to its host tier; later admissions
            of the same prompts find it there."""
            self.machine.demote()

        @rule()
        def demote_then_reset(self) -> None:
            """Everything the device cache holds goes to the host, then the device cache is
            dropped (with "reset_cache"): the next admissions of those prompts find them only
            in the host tier."""
            if self.machine.demote() and "reset_cache" in declared:
                self.machine.reset_cache()

        @rule(
            request_id=IDS,
            other=IDS,
            start=st.integers(0, len(starts) - 1),
            keep=st.integers(page_size + 1, 3 * page_size),
        )
        def round_trip(self, request_id: int, other: int, start: int, keep: int) -> None:
            """A prompt cached and demoted, its device pages taken by another prompt, then asked
            for again (found in the host tier: promoted); its pages demoted and taken again, then
            asked for once more: the path of a promoted page's cache entry through the device's
            reuse. The request stays live. With "async_copies", every copy lands after each
            demotion and admission (the other rules end them late, failed, out of order)."""
            if request_id == other or self._known(request_id) or self._known(other):
                return
            prompt = starts[start][:keep]
            for _ in range(2):
                if self.machine.submit(request_id, prompt):
                    land_every_copy(self.machine)
                    self.machine.finish(request_id)
                self.machine.demote()
                land_every_copy(self.machine)
                take_every_page(self.machine, other)
            self.machine.submit(request_id, prompt)

        @rule()
        def fill_the_host(self) -> None:
            """Every start, whole, under each tenant: cached, finished and demoted, more keys than
            a host tier of the pool's size holds, so it reuses its oldest pages."""
            free = [request_id for request_id in range(1, 6) if not self._known(request_id)]
            tenants = {request_id % 2: request_id for request_id in reversed(free)}  # one id a tenant
            for prompt in starts:
                for request_id in sorted(tenants.values()):
                    if self.machine.submit(request_id, prompt):
                        self.machine.finish(request_id)
                    self.machine.demote()

    class DraftRules:
        machine: SafetyMachine

        @rule(request_id=IDS, drafts=st.integers(1, 3), accepted=st.integers(0, 3))
        def speculate(self, request_id: int, drafts: int, accepted: int) -> None:
            """A decode with drafts after its token, some of them kept (speculative decoding)."""
            if self.machine.ready(request_id) and len(self.machine.sequences[request_id]) + 1 + drafts <= MAX_TOKENS:
                self.machine.speculate(request_id, drafts, min(accepted, drafts))

        @rule(rounds=st.integers(1, 3), drafts=st.integers(1, 3), accepted=st.integers(0, 3))
        def speculate_all(self, rounds: int, drafts: int, accepted: int) -> None:
            """An engine's speculative rounds: every live request decodes with drafts, `rounds` times."""
            for _ in range(rounds):
                for request_id in sorted(self.machine.sequences):
                    self.speculate(request_id, drafts, accepted)

    class CopyRules:
        machine: SafetyMachine

        @precondition(lambda self: self.machine.copies is not None and bool(self.machine.copies.flights))
        @rule(which=st.integers(0, 7), fails=st.integers(0, 3))
        def complete_copy(self, which: int, fails: int) -> None:
            """A copy in flight ends, one in four failed, any one of them: copies end out of order."""
            assert self.machine.copies is not None
            flights = sorted(self.machine.copies.flights)
            self.machine.complete_copy(flights[which % len(flights)], fails != 0)

        @precondition(lambda self: self.machine.copies is not None and bool(self.machine.copies.flights))
        @rule()
        def complete_every_copy(self) -> None:
            """Every copy in flight ends, done, oldest first: waiting requests read and compute."""
            land_every_copy(self.machine)

    mixins = [
        rules
        for rules, needs in (
            (CopyRules, {"async_copies"}),
            (TwoPhaseRules, {"lookup", "commit"}),
            (LeaseRules, {"lease", "end_lease"}),
            (TierRules, {"demote", "promote"}),
            (DraftRules, {"drafts"}),
        )
        if needs <= declared
    ]
    if not mixins:
        return SafetyRun
    return type("SafetyRun", (*mixins, SafetyRun), {})


def land_every_copy(machine: SafetyMachine, ok: bool = True) -> None:
    """Every copy in flight ends, done (`ok`) or failed, oldest first (nothing without "async_copies")."""
    for copy_id in sorted(machine.copies.flights if machine.copies is not None else ()):
        machine.complete_copy(copy_id, ok)


def take_every_page(machine: SafetyMachine, request_id: int) -> None:
    """`request_id` takes every page the manager could hand out (free or evictable), writes them
    and finishes: every page only a cache held is reused."""
    view = machine.manager.view()
    tokens = len(view.free | view.evictable) * machine.page_size
    if tokens and machine.submit(request_id, (VOCABULARY - 1,) * tokens):
        machine.finish(request_id)


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


@contextmanager
def shrink_budget(programs: int) -> Iterator[None]:
    """Shrinking stops after `programs` programs, a count and never a time: hypothesis's shrinker
    stops when its calls since the last success reach a stall bound; this adds a total bound."""
    shrinker: Any = conjecture_shrinker.Shrinker
    stalled = shrinker.check_calls

    def check_calls(self: Any) -> None:
        if self.calls - self.initial_calls >= programs:
            raise conjecture_shrinker.StopShrinking
        stalled(self)

    shrinker.check_calls = check_calls
    saved: Any = conjecture_engine.MAX_SHRINKING_SECONDS
    conjecture_engine.MAX_SHRINKING_SECONDS = 10**9  # and no time bound
    try:
        yield
    finally:
        shrinker.check_calls = stalled
        conjecture_engine.MAX_SHRINKING_SECONDS = saved


def format_program(machine: SafetyMachine, failure: CheckFailure, factory_module: str, factory_name: str) -> str:
    """The machine's calls as a program over the user's factory, the failed check on top."""
    return program_text(failure, (factory_module, factory_name), machine.pages, machine.page_size, machine.program)


def program_text(
    failure: CheckFailure, source: tuple[str, str], pages: int, page_size: int, calls: Sequence[str]
) -> str:
    """`calls` of the harness over `source`'s factory (module, name) and a pool of `pages` pages,
    as a program that runs as it is printed, the failed check on top."""
    module, name = source
    lines = [
        f"# {failure}",
        "from kvsched.testing import SafetyMachine",
        f"from {module} import {name}",
        "",
        f"machine = SafetyMachine({name}, pages={pages}, page_size={page_size})",
        *calls,
    ]
    return "\n".join(lines) + "\n"


# What a campaign must exercise of each capability these name, per 1,000 programs: below it the
# result warns (and `kvsched check --strict` fails), for a search that rarely reaches a verb checks
# it little. Each floor is a fraction of what the default campaign reaches on kvsched's own parts
# and on the offload toy (`devtools.check_defaults`, docs/benchmarks.md).
FLOORS = {
    "promote": ("promoted", 500),
    "demote": ("demoted", 1000),
    "end_lease": ("leases_read", 50),
    "commit": ("committed", 100),
}


def coverage_warnings(manager: object, coverage: dict[str, int], examples: int = 0) -> tuple[str, ...]:
    """What a campaign of `examples` programs over `manager` could not check: a declared
    capability never exercised, or exercised below its floor (`FLOORS`), or a verb the adapter
    (or an object it wraps) has but does not declare, so it is never called."""
    declared: frozenset[str] = frozenset(getattr(manager, "capabilities", ()))
    exercised = {
        "fork": "forked",
        "copy_on_write": "copied",
        "reset_cache": "reset",
        "atomic": "refused",
        "commit": "committed",
        "end_lease": "leases_read",
        "demote": "demoted",
        "promote": "promoted",
        "drafts": "rejected",
    }
    warnings = [
        f"capability {capability!r} is declared but the campaign never exercised it ({counter} = 0)"
        for capability, counter in exercised.items()
        if capability in declared and not coverage.get(counter)
    ]
    groups = getattr(manager, "groups", ()) if "groups" in declared else ()
    if any(isinstance(group, Recurrent) for group in groups) and not coverage.get("state_copies"):
        warnings.append("a recurrent group is declared but the campaign never copied a state (state_copies = 0)")
    for capability, (counter, per_thousand) in FLOORS.items():
        floor = -(-per_thousand * examples // 1000)
        if capability in declared and 0 < coverage.get(counter, 0) < floor:
            warnings.append(
                f"capability {capability!r} was exercised {coverage[counter]} times ({counter}), below its floor of"
                f" {floor} for {examples} programs: the search rarely reaches it (see FLOORS)"
            )
    wrapped = [manager, *(value for value in vars(manager).values() if hasattr(value, "__dict__"))]
    for capability, verb in {"fork": "fork", "copy_on_write": "copy", "reset_cache": "reset"}.items():
        if capability in declared:
            continue
        found = sorted(
            {
                f"{type(holder).__name__}.{name}"
                for holder in wrapped
                for name in dir(holder)
                if verb in name.lower() and not name.startswith("_") and callable(getattr(holder, name, None))
            }
        )
        if found:
            warnings.append(
                f"{', '.join(found)} exists but capability {capability!r} is not declared: the harness never calls it"
                f" (declare it and add the adapter verb {OPTIONAL_VERBS[capability]!r})"
            )
    return tuple(warnings)


def search_safety(
    factory: ManagerFactory,
    *,
    examples: int = 1000,
    steps: int = 30,
    seed_value: int = 0,
    pages: int | None = None,
    page_size: int = 2,
    shrinks: int = SHRINKS,
    source: tuple[str, str] | None = None,
    progress: Callable[[int, bool], None] | None = None,
) -> SafetyResult:
    """A campaign of `examples` programs of up to `steps` calls each over fresh managers from
    `factory`; `source` (module, name) is how the printed program imports the factory.

    Each program draws its pool's size from `POOL_SIZES` unless `pages` fixes it. Shrinking
    stops after `shrinks` programs, so the whole result, which check failed and
    the program printed, is a function of the seed alone. `progress(programs, shrinking)` is
    called as each program starts. A factory that raises, or does not build an adapter, is a
    `NotAnAdapter`, and a setting out of range a `BadSetting`, before anything runs."""
    check_settings(examples=examples, steps=steps, pages=pages, page_size=page_size, shrinks=shrinks)
    module, name = source or (getattr(factory, "__module__", "__main__"), getattr(factory, "__qualname__", "factory"))
    sizes = POOL_SIZES if pages is None else (pages,)
    for size in sizes:  # every size the campaign builds, so a factory that refuses one says so now
        try:
            probe = factory(size, page_size)
        except Exception as error:
            drawn = f" (the campaign builds managers of {', '.join(map(str, sizes))} pages; --pages fixes one)"
            raise NotAnAdapter(
                f"factory({size}, {page_size}) raised {type(error).__name__}: {error}{drawn if pages is None else ''}"
            ) from error
        require_adapter(probe)
        require_view(probe)
    runs: list[SafetyMachine] = []
    machine = machine_class(factory, pages, page_size, runs, progress)
    options = bounded(examples, steps, seeded=True)  # the seed decides, whatever profile is loaded
    start = time.process_time()
    failure: CheckFailure | None = None
    try:
        with seed_alone(), shrink_budget(shrinks), with_reporter(lambda _: None):
            seed(seed_value)(get_state_machine_test(machine, settings=options))()
    except CheckFailed as error:
        failure = error.failure
    seconds = time.process_time() - start
    coverage: Counter[str] = Counter({counter: 0 for counter in COVERAGE})
    for run in runs:
        coverage.update(run.coverage)
    result = SafetyResult(
        f"{module}:{name}",
        len(runs),
        steps,
        seed_value,
        seconds,
        coverage=dict(coverage),
        warnings=coverage_warnings(probe, coverage, examples),
    )
    if failure is None:
        return result
    last = runs[-1]
    return replace(
        result, failure=failure, program=format_program(last, failure, module, name), program_steps=len(last.program)
    )
