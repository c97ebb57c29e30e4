"""The stateful machine's core: run one event on the system under test (and the reference), check
the step with `kvsched.testing.checks.check_step`, and keep the ghost memory in step.

`MachineBase` holds the systems, the external holder's references and the ghost; its rules live
in the mixins of `kvsched.testing.rules_*`, each of which builds events and hands them to `run`.
After every rule it checks the invariants and the ghost reads; at teardown, liveness.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis.stateful import invariant

from kvsched.spec import Copy, PrefixIdentity
from kvsched.spec import events as ev
from kvsched.spec.domain import as_int
from kvsched.spec.invariants import INVARIANTS, post_drained_all_free
from kvsched.spec.slots import Slot, is_live
from kvsched.spec.step import apply, holds_after
from kvsched.spec.system import SystemState
from kvsched.spec.table import get_mapped_pages
from kvsched.testing.backends import HarnessBackend, backend_for
from kvsched.testing.checks import CheckFailure, FailureKind, Outcome, capture, check_state
from kvsched.testing.component_machine import CheckedMachine
from kvsched.testing.ghost import GhostMemory, History
from kvsched.testing.registry import SYSTEM
from kvsched.testing.system import SystemConfig, SystemFactory, SystemUnderTest, spec_system

IDENTITY_COUNT = 3  # one more than the store's entries, so publishing replaces
UNKNOWN_IDENTITY = PrefixIdentity((99, 99, 99, 99))


@dataclass(slots=True)
class CampaignStats:
    """Counts a campaign reports."""

    examples: int = 0
    steps: int = 0
    invariant_checks: int = 0
    decoded_tokens: int = 0
    failed_operations: int = 0


def prefix_identity(index: int) -> PrefixIdentity:
    """The harness's prefix number `index`."""
    return PrefixIdentity((index + 1, 0, 0, 0))


def prefix_history(index: int, tokens: int) -> History:
    """The tokens prefix `index` holds: the content is fixed by the identity."""
    return tuple(100 + 10 * index + position for position in range(tokens))


def prefix_index(identity: object) -> int | None:
    """The harness's number of a prefix identity (None for any other)."""
    if isinstance(identity, PrefixIdentity) and identity.words[1:] == (0, 0, 0):
        return identity.words[0] - 1
    return None


class MachineBase(CheckedMachine):
    """Drives one system under test, in lockstep with the spec unless `reference` is None.

    `ownership`: the program keeps the ownership model (every invariant, the exclusive-write
    postcondition, the ghost reads and liveness are checked); a subclass that releases pages it
    does not own sets it False, and then only lockstep and atomicity are checked."""

    component = SYSTEM
    sut: SystemUnderTest
    ref: SystemUnderTest | None

    def __init__(
        self,
        factory: SystemFactory = spec_system,
        reference: SystemFactory | None = spec_system,
        config: SystemConfig | None = None,
        stats: CampaignStats | None = None,
    ) -> None:
        config = config or SystemConfig()
        super().__init__(factory(config), reference(config) if reference is not None else None, config)
        self.ghost = GhostMemory(self.config.page_size)
        self.external: tuple[int, ...] = ()
        self.stats = stats
        self.backends: dict[bool, HarnessBackend | None] = {}  # by "is the system under test"
        if stats is not None:
            stats.examples += 1

    # -- the checked step (`CheckedMachine.run`), through its hooks ------------------------------

    def state(self, system: SystemUnderTest | None = None) -> SystemState:
        """The system's whole state; standalone tables' pages count as external holds."""
        system = system or self.sut
        held = list(self.external)
        for table in _table_states(system):
            held.extend(get_mapped_pages(table))
        return SystemState(*system.snapshot(), tuple(sorted(held)))

    def call(self, system: Any, event: Any) -> Outcome:
        """Run `event` on `system`, a round with a backend of its own (the system under test's
        writes the ghost memory when the program keeps the ownership model)."""
        mine = system is self.sut
        ghost = self.ghost if mine and self.ownership else None
        backend = self.backends[mine] = backend_for(event, self.config.page_size, ghost)
        return capture(lambda: apply(system, event, backend))

    def settle(self, event: Any, outcome: Outcome) -> None:
        """The external holder's references follow a returned holder event."""
        if self.stats is not None:
            self.stats.steps += 1
        if outcome.error is None:
            self.external = holds_after(self.external, event, outcome.value)

    def compare(self, event: Any) -> CheckFailure | None:
        """The two backends saw the same batches, and the standalone tables agree."""
        if self.ref is None:
            return None
        mine, theirs = self.backends.get(True), self.backends.get(False)
        if mine is not None and theirs is not None and mine.seen != theirs.seen:
            return CheckFailure(FailureKind.LOCKSTEP, f"{event!r}: the backends saw different batches")
        if _table_states(self.sut) != _table_states(self.ref):
            return CheckFailure(FailureKind.LOCKSTEP, f"{event!r}: the standalone tables diverge")
        return None

    def observe(self, event: Any, outcome: Outcome, after: Any) -> CheckFailure | None:
        """Keep the ghost's histories in step with a returned event; count a refused one."""
        if outcome.error is not None:
            if self.stats is not None:
                self.stats.failed_operations += 1
        elif self.ownership:
            self._observe(event, outcome.value, self.backends.get(True))
        return None

    def run(self, event: Any, *, invariants: bool = False) -> Outcome:
        """Run `event` on the system (and the reference) and check the step; its outcome (the
        invariants are checked after each rule, not after each of its events)."""
        return super().run(event, invariants=invariants)

    def _observe(self, event: ev.Event, result: Any, backend: HarnessBackend | None) -> None:
        """Keep the ghost's histories in step with a returned event."""
        histories = self.ghost.histories
        if isinstance(event, ev.Admit):
            index = prefix_index(event.prefix)
            hit = result.prefix_hit and index is not None
            history = prefix_history(index, result.prefix_tokens) if hit and index is not None else ()
            histories[as_int(event.request_id) or 0] = history
        elif isinstance(event, ev.Fork):
            histories[as_int(event.child) or 0] = histories.get(as_int(event.parent) or 0, ())
        elif isinstance(event, ev.EnsureWritable) and isinstance(result, Copy):
            self.ghost.copy_page(result.source, result.destination)
        elif isinstance(event, ev.EnsureWritableBatch | ev.PrepareDecodeRound | ev.RecordChunk):
            for action in result:
                if isinstance(action, Copy):
                    self.ghost.copy_page(action.source, action.destination)
        if isinstance(event, ev.RecordToken | ev.RecordTokens | ev.RecordChunk):
            # a count without a write the harness knows of; positions past the table never
            # hold a page, so the history stops there
            request_id = as_int(event.request_id) or 0
            count = 1 if isinstance(event, ev.RecordToken) else int(event.count)
            capacity = self.config.logical_pages * self.config.page_size + 1
            history = histories.get(request_id, ())
            histories[request_id] = history + (None,) * min(count, max(capacity - len(history), 0))
        elif isinstance(event, ev.Finish):
            histories.pop(as_int(event.request_id) or 0, None)
        elif isinstance(event, ev.DecodeRound) and backend is not None and backend.seen is not None:
            if self.stats is not None:
                self.stats.decoded_tokens += len(backend.seen[0])
            for request_id, _, token, position, *_ in backend.seen[0]:
                histories[request_id] = histories.get(request_id, ())[:position] + (token,)

    # -- what the rules pick from ------------------------------------------------------------

    def slot_of(self, request_id: int) -> Slot | None:
        """The live slot of `request_id`, if any."""
        for slot in self.sut.snapshot()[2].slots:
            if is_live(slot) and slot.request_id == request_id:
                return slot
        return None

    def live_ids(self) -> list[int]:
        """The live requests' ids, sorted."""
        return sorted(slot.request_id for slot in self.sut.snapshot()[2].slots if is_live(slot))

    def has_live_request(self) -> bool:
        """Some slot holds a request (the rules that need one wait for it)."""
        return bool(self.live_ids())

    def request(self, pick: int) -> int:
        """A live request for picks 0..6 (when any is live), else an unknown or invalid id."""
        live = self.live_ids()
        if live and pick <= 6:
            return live[pick % len(live)]
        return (2**64, -1, 5, 4, 3, 2, 1, 0, 9, 7)[pick]

    def page(self, pick: int) -> int:
        """A held page for picks 0..5 (when any is held), else any id, in range or not."""
        held = [page for page, count in enumerate(self.sut.snapshot()[0].refs) if count > 0]
        if held and pick <= 5:
            return held[pick % len(held)]
        return (-1, 0, 1, 2, 3, 4, 5, 6, 7, self.config.physical_pages)[pick]

    def ref_count(self, page: int) -> int | None:
        """The page's reference count in the system under test (None out of range)."""
        refs = self.sut.snapshot()[0].refs
        return refs[page] if 0 <= page < len(refs) else None

    # -- checks after every rule, and at the end -----------------------------------------------

    @invariant()
    def check_system_invariants(self) -> None:
        """Every invariant, impl's own representation check where it has one, the ghost reads."""
        if not self.ownership:
            return
        state = self.state()
        if failure := check_state(state):
            self.fail(failure)
        broken = getattr(self.sut, "representation", lambda: ())()
        if broken:
            self.fail(CheckFailure(FailureKind.INVARIANT, "representation: " + ", ".join(broken)))
        mismatches = self.ghost.mismatches(state.scheduler)
        if mismatches:
            self.fail(CheckFailure(FailureKind.GHOST, "; ".join(mismatches[:3])))
        if self.stats is not None:
            self.stats.invariant_checks += len(INVARIANTS) + 1

    def teardown(self) -> None:
        """Liveness: finish everything, remove every entry, release every standalone table, drop
        own holds; all pages free."""
        if self.failed or not self.ownership:
            return
        drain: list[ev.Event] = [ev.Finish(request_id) for request_id in self.live_ids()]
        drain += [ev.Remove(entry.page_set.identity) for entry in self.sut.snapshot()[1].entries if entry is not None]
        drain += [ev.TableRelease(index) for index in range(len(getattr(self.sut, "tables", ())))]
        drain += [ev.Release(page) for page in self.external]
        for event in drain:  # each a checked step, the invariants after it
            if self.run(event).error is not None:
                self.fail(CheckFailure(FailureKind.LIVENESS, f"draining failed at {event!r}"))
            if failure := check_state(self.state()):
                self.fail(failure)
        drained = self.state()
        if not post_drained_all_free(drained):
            held = len(drained.pool.refs) - len(drained.pool.free)
            self.fail(CheckFailure(FailureKind.LIVENESS, f"{held} pages still held after draining"))


def _table_states(system: Any) -> tuple[Any, ...]:
    states = getattr(system, "table_states", None)
    return states() if states is not None else ()
