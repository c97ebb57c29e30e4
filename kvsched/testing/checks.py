"""The one step checker every harness shares: the hypothesis machine, the explorer and the
contract programs run an event, capture its `Outcome`, and ask `check_step` what went wrong.

`check_step(before, event, outcome, after, reference)` returns None or a `CheckFailure` of one
`FailureKind`, in this order: an untyped error; lockstep (the reference's outcome or state
differs); atomicity (a refused event changed the state, or a round ran on buffers that share
memory, which must be refused before anything is written); a read that changed the state; LIFO
reuse of the free stack; the exclusive-write postcondition of a write event; the invariants.
Ghost reads and liveness need more than one step; their checkers report the same kinds.
`CheckFailed` is the `AssertionError` a harness raises, carrying the failure: a report reads
the kind off the failure, never off a message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, is_dataclass
from enum import Enum
from typing import Any

from kvsched.spec import events as ev
from kvsched.spec.errors import KvschedError
from kvsched.spec.invariants import (
    check_invariants,
    post_failure_changes_nothing,
    post_lifo_reuse,
    post_written_page_exclusive,
)
from kvsched.spec.plan import WritePlan
from kvsched.spec.slots import RequestState
from kvsched.spec.system import SystemState


class FailureKind(Enum):
    """Which check a failure comes from."""

    UNTYPED = "untyped error"
    LOCKSTEP = "lockstep"
    ATOMICITY = "atomicity"
    READ_ONLY = "read-only query"
    LIFO = "LIFO order"
    EXCLUSIVE = "exclusive write"
    INVARIANT = "invariant"
    GHOST = "ghost read"
    LIVENESS = "liveness"
    DETERMINISM = "determinism"  # a request's tokens differ from its run alone
    ORDER = "queue order"  # a preempted request queued behind a later arrival of its priority
    CACHE = "cached content"  # a cached page does not hold the tokens its key names
    ISOLATION = "tenant isolation"  # a request holds a page cached for another tenant or adapter
    FULL_HIT = "full prefix hit"  # a prefix hit left no prompt token to compute
    LEAK = "leaked page"  # a page neither free nor reserved once every request is freed

    def __repr__(self) -> str:
        return f"FailureKind.{self.name}"


@dataclass(frozen=True, slots=True)
class CheckFailure:
    """A failed check: its kind and what it saw."""

    kind: FailureKind
    detail: str

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.detail}"


class CheckFailed(AssertionError):
    """A harness's failed check, with the `CheckFailure` it found."""

    def __init__(self, failure: CheckFailure) -> None:
        super().__init__(str(failure))
        self.failure = failure


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a call did: the value it returned, or its exception's type, message and typed
    details (compared by value, so two systems' outcomes compare with `==`)."""

    value: Any = None
    error: type[BaseException] | None = None
    message: str = ""
    details: tuple[tuple[str, int | None], ...] = ()

    def summary(self, results: bool = True) -> tuple[Any, ...]:
        """A comparable form: the normalized value (only that it returned, unless `results`),
        or the error's type, message and details."""
        if self.error is None:
            return ("returns", normalize(self.value) if results else None)
        return ("raises", self.error.__name__, self.message, self.details)

    @property
    def typed(self) -> bool:
        """It returned, or raised a kvsched error."""
        return self.error is None or issubclass(self.error, KvschedError)


def capture(call: Callable[[], Any], detailed: bool = True) -> Outcome:
    """Run `call`; its value or whatever it raised (every exception, typed or not). Unless
    `detailed`, a kvsched error is kept by its type alone (a search that compares no messages
    skips formatting them)."""
    try:
        return Outcome(call())
    except KvschedError as error:
        if not detailed:
            return Outcome(None, type(error))
        return Outcome(None, type(error), str(error), tuple(error.details().items()))
    except Exception as error:  # an untyped error is a finding, compared like any other
        return Outcome(None, type(error), str(error))


def normalize(value: Any) -> Any:
    """A comparable form of a result: plans by their steps, dataclasses by name and fields,
    sequences as tuples, numpy scalars as Python numbers."""
    if isinstance(value, Mapping):  # a step's tokens and finished requests, in any mapping form
        return tuple(sorted((key, normalize(item)) for key, item in value.items()))
    if isinstance(value, WritePlan):  # the spec's or impl's: by its steps
        return ("WritePlan", normalize(value.targets()), normalize(tuple(value)))
    if is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, *(normalize(getattr(value, f.name)) for f in fields(value)))
    if isinstance(value, list | tuple):
        return tuple(normalize(item) for item in value)
    if hasattr(value, "item") and callable(value.item):
        return normalize(value.item())
    return value


def written_pages(event: ev.Event, after: SystemState) -> list[tuple[int, int]]:
    """The (request id, logical page) pairs a returned write event made exclusive."""
    if isinstance(event, ev.EnsureWritable):
        return [(int(event.request_id), int(event.logical_page))]
    if isinstance(event, ev.EnsureWritableBatch):
        return [(int(r), int(k)) for r, k in zip(event.request_ids, event.logical_pages, strict=True)]
    page_size = int(event.page_size) if isinstance(event, ev.PrepareDecodeRound) else 0
    if page_size:
        width = len(after.scheduler.slots[0].table) if after.scheduler.slots else 0
        return [
            (slot.request_id, slot.token_count // page_size)
            for slot in after.scheduler.slots
            if slot.state is RequestState.DECODE and slot.token_count // page_size < width
        ]
    return []


def check_state(state: SystemState) -> CheckFailure | None:
    """Every invariant of `kvsched.spec.invariants` on one state."""
    broken = check_invariants(state)
    return CheckFailure(FailureKind.INVARIANT, ", ".join(broken)) if broken else None


def check_step(
    before: SystemState,
    event: ev.Event,
    outcome: Outcome,
    after: SystemState,
    reference: tuple[Outcome, SystemState] | None = None,
    *,
    results: bool = True,
    ownership: bool = True,
    invariants: bool = True,
    page_size: int | None = None,
) -> CheckFailure | None:
    """What is wrong with one step, or None.

    `reference`: the reference's outcome and state after the same event from the same state
    (lockstep); `results`: compare returned values, not only error types and states;
    `ownership`: the caller kept the ownership model (else only lockstep and atomicity apply,
    for a caller that releases pages it does not own on purpose); `invariants`: check them on
    `after` (a caller that has already checked an equal state skips them); `page_size`: the
    scheduler's, with which a committed round's writes are checked (each request's token lands
    in the page holding its position, which it must hold alone)."""
    error = outcome.error
    if not outcome.typed:
        return CheckFailure(FailureKind.UNTYPED, f"{event!r} raised {outcome.summary()}")
    if reference is not None:
        expected, expected_after = reference
        mine, theirs = outcome.summary(results), expected.summary(results)
        if mine != theirs:
            return CheckFailure(FailureKind.LOCKSTEP, f"{event!r} gave {mine}, the reference {theirs}")
        if after != expected_after:
            return CheckFailure(FailureKind.LOCKSTEP, f"{event!r} left {after}, the reference {expected_after}")
    if isinstance(event, ev.DecodeOverlapping) and error is None:
        return CheckFailure(FailureKind.ATOMICITY, f"{event!r}: a round ran on scratch buffers that share memory")
    if error is not None:
        if not post_failure_changes_nothing(before, after):
            return CheckFailure(FailureKind.ATOMICITY, f"{event!r} raised {error.__name__} but changed state")
        return None
    if isinstance(event, ev.Read) and after != before:
        return CheckFailure(FailureKind.READ_ONLY, f"{event!r} changed state")
    if not post_lifo_reuse(before, after):
        return CheckFailure(FailureKind.LIFO, f"{event!r}: {before.pool.free} -> {after.pool.free} out of order")
    if not ownership:
        return None
    for request_id, logical_page in written_pages(event, after):
        if not post_written_page_exclusive(after, request_id, logical_page):
            return CheckFailure(FailureKind.EXCLUSIVE, f"{event!r} left logical page {logical_page} shared")
    shared = round_wrote_shared(before, after, page_size) if isinstance(event, ev.DecodeRound) and page_size else None
    if shared is not None:
        return CheckFailure(FailureKind.EXCLUSIVE, f"{event!r} wrote request {shared}'s token into a shared page")
    return check_state(after) if invariants else None


def round_wrote_shared(before: SystemState, after: SystemState, page_size: int) -> int | None:
    """A request whose token a committed round wrote into a page it did not hold alone, if any."""
    for was, now in zip(before.scheduler.slots, after.scheduler.slots, strict=True):
        if was.state is not RequestState.DECODE or now.token_count == was.token_count:
            continue  # not in the round
        logical = was.token_count // page_size
        page = was.table[logical] if logical < len(was.table) else None
        if page is None or before.pool.refs[page] != 1:
            return was.request_id
    return None
