"""The explorer's alphabet: every operation, with every argument in range and out of range.

An `Operation` is a value (kind and arguments) that runs against any system under test with the
spec's public API (kvsched.testing.system) and renders as the Python call it makes, so a
counterexample trace is a runnable program. Request ids are drawn from 0..requests (one more
than the slots, so a fresh id always exists) plus -1 (not a u64); prefix identities from
`prefix_identity(0..entries)` (one more than the entries, so a full store replaces); pages and
logical pages from -1 to one past the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from itertools import permutations, product
from typing import Any

from kvsched.spec.errors import KvschedError
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.prefix import PrefixPageSet
from kvsched.spec.slots import RequestState
from kvsched.spec.system import SystemState
from kvsched.testing.backends import FAULTS, HarnessBackend
from kvsched.testing.machine import prefix_identity
from kvsched.testing.system import SystemConfig, SystemUnderTest

INVALID_ID = -1  # not a u64: every operation taking a request id must refuse it
SHORT_BUFFERS = ("items", "tables", "outputs")


@dataclass(frozen=True)
class Bounds:
    """The sizes of the explored systems and the budgets that keep the state space finite.

    `max_tokens` caps a request's token count (record_token and a well-behaved decode round
    are not tried past it) and `max_external` the producer's references (allocate and retain
    are not tried past it); neither limits which page-ownership configurations the tables and
    the store can reach within the sizes. `max_depth`, when set, makes the search depth-bounded:
    every state reachable in that many operations (states at the last depth are checked for
    the invariants and liveness, but no operation is tried from them).
    """

    requests: int = 3
    pages: int = 5
    logical_pages: int = 3
    entries: int = 2
    entry_pages: int = 2
    max_references: int = 3
    max_tokens: int = 1
    max_external: int = 2
    max_depth: int | None = None
    page_size: int = 2
    seed_tokens: tuple[int, ...] = (0,)

    def config(self) -> SystemConfig:
        """The harness configuration of these sizes."""
        return SystemConfig(
            requests=self.requests,
            logical_pages=self.logical_pages,
            physical_pages=self.pages,
            store_entries=self.entries,
            store_pages=self.entry_pages,
            max_references=self.max_references,
            page_size=self.page_size,
        )

    @property
    def request_ids(self) -> range:
        """The valid request ids the explorer uses (symmetric: canon.py renames them)."""
        return range(self.requests + 1)

    @property
    def identities(self) -> range:
        """The prefix identities the explorer uses, by index (symmetric too)."""
        return range(self.entries + 1)


@dataclass(frozen=True)
class Operation:
    """One call on the system: `kind` names it, `args` are its arguments."""

    kind: str
    args: tuple[Any, ...] = ()

    def __repr__(self) -> str:
        return f"{self.kind}{self.args!r}"


REQUEST_ARGS = {
    "ensure_writable_batch": (0,),
    "admit": (0,),
    "fork": (0, 1),
    "ensure_writable": (0,),
    "mark_prefill_complete": (0,),
    "seed_decode_token": (0,),
    "record_token": (0,),
    "finish": (0,),
}
IDENTITY_ARGS = {"admit": (1,), "publish": (0,), "remove": (0,)}
PAGE_ARGS = {"publish": (1,), "ext_retain": (0,), "ext_release": (0,)}


def rename(
    operation: Operation, ids: dict[int, int], identities: dict[int, int], pages: dict[int, int] | None = None
) -> Operation:
    """The same operation with request ids, identity indices and pages mapped (others kept)."""
    args = list(operation.args)
    if pages:
        for index in PAGE_ARGS.get(operation.kind, ()):
            if isinstance(args[index], tuple):
                args[index] = tuple(pages.get(value, value) for value in args[index])
            else:
                args[index] = pages.get(args[index], args[index])
    for index in REQUEST_ARGS.get(operation.kind, ()):
        if isinstance(args[index], tuple):
            args[index] = tuple(ids.get(value, value) for value in args[index])
        else:
            args[index] = ids.get(args[index], args[index])
    for index in IDENTITY_ARGS.get(operation.kind, ()):
        if args[index] is not None:
            args[index] = identities.get(args[index], args[index])
    return Operation(operation.kind, tuple(args))


def _page_sets(bounds: Bounds) -> Iterator[tuple[int, ...]]:
    """Every arrangement of up to `entry_pages` distinct pages (closed under renaming pages), one
    out-of-range set and one over the capacity (refused for its length before a page is read)."""
    for length in range(1, bounds.entry_pages + 1):
        yield from permutations(range(bounds.pages), length)
    yield (bounds.pages,)  # out of range
    yield tuple(range(min(bounds.entry_pages + 1, bounds.pages)))  # over the entry capacity


def _batches(bounds: Bounds) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Two-step batches over the first two requests and a first and an out-of-range logical page.

    A batch is the single calls in order, so it reaches no state the single calls do not: these
    are here to check its all-or-nothing rollback and its agreement with the single calls, and
    need not be closed under the id symmetry (canon.py) the single calls rely on. They name no
    page, so the page symmetry maps each to itself.
    """
    steps = [(r, k) for r in (0, 1) for k in (0, bounds.logical_pages)]
    for first, second in product(steps, steps):
        yield (first[0], second[0]), (first[1], second[1])
    yield (), ()
    yield (0,), ()  # mismatched lengths


def static_alphabet(bounds: Bounds) -> tuple[Operation, ...]:
    """Every operation whose arguments do not depend on the state."""
    ids = (*bounds.request_ids, INVALID_ID)
    identities = (None, *bounds.identities)
    ops: list[Operation] = []
    ops += [Operation("admit", (r, i)) for r in ids for i in identities]
    ops += [Operation("fork", (p, c)) for p in ids for c in ids]
    ops += [Operation("ensure_writable", (r, k)) for r in ids for k in range(-1, bounds.logical_pages + 1)]
    ops += [Operation("ensure_writable_batch", batch) for batch in _batches(bounds)]
    ops += [Operation("prepare_decode_round", (size,)) for size in (bounds.page_size, 0)]
    ops += [Operation("mark_prefill_complete", (r,)) for r in ids]
    ops += [Operation("seed_decode_token", (r, t)) for r in ids for t in (*bounds.seed_tokens, -1, 2**32)]
    ops += [Operation("record_token", (r,)) for r in ids]
    ops += [Operation("finish", (r,)) for r in ids]
    ops += [Operation("decode", (fault, "")) for fault in FAULTS]
    ops += [Operation("decode", ("none", short)) for short in SHORT_BUFFERS]
    ops += [Operation("publish", (i, pages, 1)) for i in bounds.identities for pages in _page_sets(bounds)]
    ops += [Operation("remove", (i,)) for i in bounds.identities]
    ops += [Operation("reclaim", (n,)) for n in range(-1, bounds.pages + 2)]
    ops += [Operation("ext_allocate")]
    ops += [Operation("ext_retain", (p,)) for p in range(-1, bounds.pages + 1)]
    return tuple(ops)


def _decoding(state: SystemState) -> list[int]:
    return [slot.token_count for slot in state.scheduler.slots if slot.state is RequestState.DECODE]


def within_budget(state: SystemState, bounds: Bounds) -> bool:
    """No request counts more than `max_tokens` (states past it are checked, not expanded)."""
    return all(slot.token_count <= bounds.max_tokens for slot in state.scheduler.slots)


def enabled(operation: Operation, state: SystemState, bounds: Bounds) -> bool:
    """False for the counting operations once a budget is spent (the state space is finite)."""
    if operation.kind == "decode" and operation.args == ("none", ""):
        return all(count < bounds.max_tokens for count in _decoding(state))
    if operation.kind in ("ext_allocate", "ext_retain"):
        return len(state.external) < bounds.max_external
    if operation.kind == "record_token":
        return all(
            slot.token_count < bounds.max_tokens or slot.request_id != operation.args[0]
            for slot in state.scheduler.slots
            if slot.state is not RequestState.EMPTY
        )
    return True


def alphabet(state: SystemState, bounds: Bounds, static: tuple[Operation, ...]) -> list[Operation]:
    """The operations to try in `state`: the static ones within budget, plus the producer's releases."""
    ops = [operation for operation in static if enabled(operation, state, bounds)]
    ops += [Operation("ext_release", (page,)) for page in sorted(set(state.external))]
    return ops


@cache
def identity(index: int) -> PrefixIdentity:
    """The prefix identity of alphabet index `index` (derived once)."""
    return prefix_identity(index)


@cache
def page_set(index: int, pages: tuple[int, ...], tokens: int) -> PrefixPageSet:
    """The page set a publish operation offers (validated once; a bad one raises every time)."""
    return PrefixPageSet(identity(index), pages, tokens)


def _page_set(index: int, pages: tuple[int, ...], tokens: int) -> PrefixPageSet:
    try:
        return page_set(index, pages, tokens)
    except KvschedError:
        return PrefixPageSet(identity(index), pages, tokens)  # raises again, uncached


def _decode(sut: SystemUnderTest, state: SystemState, bounds: Bounds, fault: str, short: str) -> Any:
    count = len(_decoding(state))
    sizes = {"items": count, "tables": count * bounds.logical_pages, "outputs": count}
    if short:
        sizes[short] = max(sizes[short] - 1, 0)
    scratch = sut.scratch(sizes["items"], sizes["tables"], sizes["outputs"])
    return sut.scheduler.execute_decode_round(HarnessBackend(fault, bounds.page_size), *scratch)


Runner = Callable[[SystemUnderTest, SystemState, Bounds, tuple[Any, ...]], Any]

_RUNNERS: dict[str, Runner] = {
    "admit": lambda s, _, __, a: s.scheduler.admit_with_prefix(
        a[0], None if a[1] is None else identity(a[1]), s.store, s.pool
    ),
    "fork": lambda s, _, __, a: s.scheduler.fork(a[0], a[1], s.pool),
    "ensure_writable": lambda s, _, __, a: s.scheduler.ensure_writable(a[0], a[1], s.pool),
    "ensure_writable_batch": lambda s, _, __, a: s.scheduler.ensure_writable_batch(list(a[0]), list(a[1]), s.pool),
    "prepare_decode_round": lambda s, _, __, a: s.scheduler.prepare_decode_round(s.pool, a[0]),
    "mark_prefill_complete": lambda s, _, __, a: s.scheduler.mark_prefill_complete(a[0]),
    "seed_decode_token": lambda s, _, __, a: s.scheduler.seed_decode_token(a[0], a[1]),
    "record_token": lambda s, _, __, a: s.scheduler.record_token(a[0]),
    "finish": lambda s, _, __, a: s.scheduler.finish(a[0], s.pool),
    "decode": lambda s, state, bounds, a: _decode(s, state, bounds, a[0], a[1]),
    "publish": lambda s, _, __, a: s.store.publish(_page_set(a[0], a[1], a[2]), s.pool),
    "remove": lambda s, _, __, a: s.store.remove(identity(a[0]), s.pool),
    "reclaim": lambda s, _, __, a: s.store.reclaim(s.pool, a[0]),
    "ext_allocate": lambda s, _, __, a: s.pool.allocate(),
    "ext_retain": lambda s, _, __, a: s.pool.retain(a[0]),
    "ext_release": lambda s, _, __, a: s.pool.release(a[0]),
}


def run(operation: Operation, sut: SystemUnderTest, state: SystemState, bounds: Bounds) -> tuple[Any, tuple[int, ...]]:
    """Run the operation on `sut` (loaded with `state`); its result and the producer's new holds.

    Raises whatever the system raises; the producer's holds change only when the call returned.
    """
    result = _RUNNERS[operation.kind](sut, state, bounds, operation.args)
    external = state.external
    if operation.kind == "ext_allocate":
        external = tuple(sorted((*external, int(result))))
    elif operation.kind == "ext_retain":
        external = tuple(sorted((*external, operation.args[0])))
    elif operation.kind == "ext_release":
        held = list(external)
        held.remove(operation.args[0])
        external = tuple(held)
    return result, external


def call_source(operation: Operation, state: SystemState, bounds: Bounds) -> str:
    """The Python expression that performs the operation on `pool`, `store`, `scheduler`."""
    a = operation.args

    def named(index: int | None) -> str:
        return "None" if index is None else f"prefix_identity({index})"

    if operation.kind == "decode":
        count = len(_decoding(state))
        sizes = [count, count * bounds.logical_pages, count]
        if a[1]:
            sizes[SHORT_BUFFERS.index(a[1])] = max(sizes[SHORT_BUFFERS.index(a[1])] - 1, 0)
        backend = f"HarnessBackend({a[0]!r}, {bounds.page_size})"
        return f"scheduler.execute_decode_round({backend}, *system.scratch({sizes[0]}, {sizes[1]}, {sizes[2]}))"
    calls: dict[str, Callable[[], str]] = {
        "admit": lambda: f"scheduler.admit_with_prefix({a[0]}, {named(a[1])}, store, pool)",
        "fork": lambda: f"scheduler.fork({a[0]}, {a[1]}, pool)",
        "ensure_writable": lambda: f"scheduler.ensure_writable({a[0]}, {a[1]}, pool)",
        "ensure_writable_batch": lambda: f"scheduler.ensure_writable_batch({list(a[0])}, {list(a[1])}, pool)",
        "prepare_decode_round": lambda: f"scheduler.prepare_decode_round(pool, {a[0]})",
        "mark_prefill_complete": lambda: f"scheduler.mark_prefill_complete({a[0]})",
        "seed_decode_token": lambda: f"scheduler.seed_decode_token({a[0]}, {a[1]})",
        "record_token": lambda: f"scheduler.record_token({a[0]})",
        "finish": lambda: f"scheduler.finish({a[0]}, pool)",
        "publish": lambda: f"store.publish(PrefixPageSet({named(a[0])}, {a[1]!r}, {a[2]}), pool)",
        "remove": lambda: f"store.remove({named(a[0])}, pool)",
        "reclaim": lambda: f"store.reclaim(pool, {a[0]})",
        "ext_allocate": lambda: "pool.allocate()",
        "ext_retain": lambda: f"pool.retain({a[0]})",
        "ext_release": lambda: f"pool.release({a[0]})",
    }
    return calls[operation.kind]()


def statements(operation: Operation, state: SystemState, bounds: Bounds, refused: bool) -> list[str]:
    """The lines of a printed program that perform the operation (and track the producer's holds).

    A call the system refuses is wrapped in `attempt(...)`, which prints the refusal.
    """
    call = call_source(operation, state, bounds)
    if refused:
        return [f"attempt(lambda: {call})"]
    if operation.kind == "ext_allocate":
        return [f"external.append({call})"]
    if operation.kind == "ext_retain":
        return [call, f"external.append({operation.args[0]})"]
    if operation.kind == "ext_release":
        return [call, f"external.remove({operation.args[0]})"]
    return [call]
