"""The explorer's alphabet: every event of `kvsched.spec.events`, with every argument in range
and out of range.

Request ids are drawn from 0..requests (one more than the slots, so a fresh id always exists)
plus -1 (not a u64); prefix identities from `prefix_identity(0..entries)` (one more than the
entries, so a full store replaces); pages and logical pages from -1 to one past the end. Events
run on any system under test through `kvsched.spec.step.apply`, the same call the stateful
machine makes, and print as the Python that builds them, so a trace is a runnable program.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cache
from itertools import permutations, product
from typing import Any

from kvsched.spec import events as ev
from kvsched.spec.events import Event
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.slots import RequestState
from kvsched.spec.system import SystemState
from kvsched.testing.harness import prefix_identity, prefix_index
from kvsched.testing.system import SystemConfig

INVALID_ID = -1  # not a u64: every operation taking a request id must refuse it


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


# The fields of each event that name a request id, a prefix identity or a page (renamed by
# the explorer's symmetries, canon.py); a tuple field names one per element.
REQUEST_FIELDS: dict[type[Any], tuple[str, ...]] = {
    ev.ForeignPool: ("request_id",),
    ev.Admit: ("request_id",),
    ev.Fork: ("parent", "child"),
    ev.EnsureWritable: ("request_id",),
    ev.EnsureWritableBatch: ("request_ids",),
    ev.MarkPrefillComplete: ("request_id",),
    ev.SeedDecodeToken: ("request_id",),
    ev.RecordToken: ("request_id",),
    ev.RecordTokens: ("request_id",),
    ev.Finish: ("request_id",),
}
IDENTITY_FIELDS: dict[type[Any], tuple[str, ...]] = {
    ev.Admit: ("prefix",),
    ev.Publish: ("identity",),
    ev.Remove: ("identity",),
}
PAGE_FIELDS: dict[type[Any], tuple[str, ...]] = {ev.Publish: ("pages",), ev.Retain: ("page",), ev.Release: ("page",)}


ISSUE = Bounds(requests=3, pages=5, logical_pages=3, entries=2, entry_pages=2)
"""The reference sizes: 3 request slots, 5 pages, 3 logical pages, 2 entries of 2 pages."""


def _mapped(value: Any, names: dict[Any, Any]) -> Any:
    if isinstance(value, tuple):
        return tuple(names.get(item, item) for item in value)
    return names.get(value, value)


def rename(event: Event, ids: dict[int, int], identities: dict[int, int], pages: dict[int, int] | None = None) -> Event:
    """The same event with request ids, identity indices and pages mapped (others kept)."""
    changes: dict[str, Any] = {}
    for name in PAGE_FIELDS.get(type(event), ()) if pages else ():
        changes[name] = _mapped(getattr(event, name), pages or {})
    for name in REQUEST_FIELDS.get(type(event), ()):
        changes[name] = _mapped(getattr(event, name), ids)
    for name in IDENTITY_FIELDS.get(type(event), ()):
        index = prefix_index(getattr(event, name))
        if index is not None:
            changes[name] = identity(identities.get(index, index))
    return replace(event, **changes) if changes else event


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


def static_alphabet(bounds: Bounds) -> tuple[Event, ...]:
    """Every event whose arguments do not depend on the state."""
    ids = (*bounds.request_ids, INVALID_ID)
    prefixes = (None, *(identity(i) for i in bounds.identities))
    events: list[Event] = []
    events += [ev.Admit(r, prefix) for r in ids for prefix in prefixes]
    events += [ev.Fork(p, c) for p in ids for c in ids]
    events += [ev.EnsureWritable(r, k) for r in ids for k in range(-1, bounds.logical_pages + 1)]
    events += [ev.EnsureWritableBatch(*batch) for batch in _batches(bounds)]
    events += [ev.PrepareDecodeRound(size) for size in (bounds.page_size, 0)]
    events += [ev.MarkPrefillComplete(r) for r in ids]
    events += [ev.SeedDecodeToken(r, t) for r in ids for t in (*bounds.seed_tokens, -1, 2**32)]
    events += [ev.RecordToken(r) for r in ids]
    events += [ev.RecordTokens(r, n) for r in ids for n in (0, 2)]  # a prefill chunk, within the budget
    events += [ev.Finish(r) for r in ids]
    events += [ev.DecodeRound(fault) for fault in ev.Fault]
    events += [ev.DecodeRound(ev.Fault.NONE, short) for short in ev.SHORT_BUFFERS]
    events += [ev.DecodeOverlapping()]
    events += [ev.ForeignPool(r, call) for r in ids for call in ("finish", "ensure_writable")]
    events += [ev.Publish(identity(i), pages, 1) for i in bounds.identities for pages in _page_sets(bounds)]
    events += [ev.Remove(identity(i)) for i in bounds.identities]
    events += [ev.Reclaim(n) for n in range(-1, bounds.pages + 2)]
    events += [ev.Allocate()]
    events += [ev.Retain(p) for p in range(-1, bounds.pages + 1)]
    return tuple(events)


def _decoding(state: SystemState) -> list[int]:
    return [slot.token_count for slot in state.scheduler.slots if slot.state is RequestState.DECODE]


def within_budget(state: SystemState, bounds: Bounds) -> bool:
    """No request counts more than `max_tokens` (states past it are checked, not expanded)."""
    return all(slot.token_count <= bounds.max_tokens for slot in state.scheduler.slots)


CLEAN_ROUND = ev.DecodeRound()


def enabled(event: Event, state: SystemState, bounds: Bounds) -> bool:
    """False for the counting events once a budget is spent (the state space is finite)."""
    if event == CLEAN_ROUND:
        return all(count < bounds.max_tokens for count in _decoding(state))
    if isinstance(event, ev.Allocate | ev.Retain):
        return len(state.external) < bounds.max_external
    if isinstance(event, ev.RecordToken | ev.RecordTokens):
        count = 1 if isinstance(event, ev.RecordToken) else event.count
        return all(
            slot.token_count + count <= bounds.max_tokens or slot.request_id != event.request_id
            for slot in state.scheduler.slots
            if slot.state is not RequestState.EMPTY
        )
    return True


def alphabet(state: SystemState, bounds: Bounds, static: tuple[Event, ...]) -> list[Event]:
    """The events to try in `state`: the static ones within budget, plus the producer's releases."""
    events = [event for event in static if enabled(event, state, bounds)]
    events += [ev.Release(page) for page in sorted(set(state.external))]
    return events


@cache
def identity(index: int) -> PrefixIdentity:
    """The prefix identity of alphabet index `index` (derived once)."""
    return prefix_identity(index)
