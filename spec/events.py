"""Every public operation of a kvsched system as a value: the one alphabet every checker speaks.

An event names one call and its arguments, and makes it: `event.perform(system)` (the decode
rounds need a backend and scratch in the system's form: `kvsched.spec.step.apply` runs them).
Arguments are whatever a caller may pass, in range or not (`Admit(request_id="7")` is an event
too: the operation must refuse it), so one alphabet serves valid, invalid and out-of-domain
programs alike. Each event prints as the Python that builds it, so a list of events is a runnable
program (`kvsched.spec.step` runs it).

The owners outside kvsched, an external holder of page references and standalone page tables,
act through events too: `Allocate`, `Retain`, `Release` and `Writable` are the holder's calls on
the pool, and the `Table*` events act on table number `table` of the system's standalone tables.
The engine's events (`ENGINE_EVENTS`) act on an `Engine`, which owns its parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from kvsched.spec.prefix import PrefixPageSet
from kvsched.spec.slots import RequestState, RequestView


class Fault(Enum):
    """How a decode backend breaks the round's contract (`NONE`: it keeps it)."""

    NONE = "none"
    RAISE = "raise"  # an untyped exception from the backend
    WRONG_BATCH = "wrong_batch"  # the receipt counts one request too many
    TWO_LAUNCHES = "two_launches"
    ZERO_LAUNCHES = "zero_launches"
    CORRUPT_IDENTITY = "corrupt_identity"  # one output names another request
    WRONG_SLOT = "wrong_slot"  # one output names another slot
    NO_WRITE = "no_write"  # no output written
    BAD_RECEIPT = "bad_receipt"  # not a receipt at all
    REJECT = "reject"  # a typed refusal (BackendRejected)
    PARTIAL = "partial"  # only the first half of the outputs written

    def __repr__(self) -> str:
        return f"Fault.{self.name}"


SHORT_BUFFERS = ("items", "tables", "outputs")


# -- the external holder's calls on the pool -----------------------------------------------


@dataclass(frozen=True, slots=True)
class Allocate:
    """`pool.allocate()`: the holder takes a fresh page."""

    def perform(self, system: Any) -> Any:
        return system.pool.allocate()


@dataclass(frozen=True, slots=True)
class Retain:
    """`pool.retain(page)`: the holder takes one more reference."""

    page: Any

    def perform(self, system: Any) -> Any:
        return system.pool.retain(self.page)


@dataclass(frozen=True, slots=True)
class Release:
    """`pool.release(page)`: the holder drops a reference (its own, unless it abuses the pool)."""

    page: Any

    def perform(self, system: Any) -> Any:
        return system.pool.release(self.page)


@dataclass(frozen=True, slots=True)
class Writable:
    """`pool.writable(current)`: the holder's own copy-on-write of a page it holds (None: a new one)."""

    current: Any

    def perform(self, system: Any) -> Any:
        return system.pool.writable(self.current)


# -- the request scheduler ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Admit:
    """`scheduler.admit_with_prefix(request_id, prefix, store, pool)`."""

    request_id: Any
    prefix: Any = None

    def perform(self, system: Any) -> Any:
        return system.scheduler.admit_with_prefix(self.request_id, self.prefix, system.store, system.pool)


@dataclass(frozen=True, slots=True)
class Fork:
    """`scheduler.fork(parent, child, pool)`."""

    parent: Any
    child: Any

    def perform(self, system: Any) -> Any:
        return system.scheduler.fork(self.parent, self.child, system.pool)


@dataclass(frozen=True, slots=True)
class EnsureWritable:
    """`scheduler.ensure_writable(request_id, logical_page, pool)`."""

    request_id: Any
    logical_page: Any

    def perform(self, system: Any) -> Any:
        return system.scheduler.ensure_writable(self.request_id, self.logical_page, system.pool)


@dataclass(frozen=True, slots=True)
class EnsureWritableBatch:
    """`scheduler.ensure_writable_batch(request_ids, logical_pages, pool)`, as lists."""

    request_ids: tuple[Any, ...]
    logical_pages: tuple[Any, ...]

    def perform(self, system: Any) -> Any:
        return system.scheduler.ensure_writable_batch(list(self.request_ids), list(self.logical_pages), system.pool)


@dataclass(frozen=True, slots=True)
class PrepareDecodeRound:
    """`scheduler.prepare_decode_round(pool, page_size)`."""

    page_size: Any

    def perform(self, system: Any) -> Any:
        return system.scheduler.prepare_decode_round(system.pool, self.page_size)


@dataclass(frozen=True, slots=True)
class MarkPrefillComplete:
    """`scheduler.mark_prefill_complete(request_id)`."""

    request_id: Any

    def perform(self, system: Any) -> Any:
        return system.scheduler.mark_prefill_complete(self.request_id)


@dataclass(frozen=True, slots=True)
class SeedDecodeToken:
    """`scheduler.seed_decode_token(request_id, token)`."""

    request_id: Any
    token: Any

    def perform(self, system: Any) -> Any:
        return system.scheduler.seed_decode_token(self.request_id, self.token)


@dataclass(frozen=True, slots=True)
class RecordToken:
    """`scheduler.record_token(request_id)`."""

    request_id: Any

    def perform(self, system: Any) -> Any:
        return system.scheduler.record_token(self.request_id)


@dataclass(frozen=True, slots=True)
class RecordTokens:
    """`scheduler.record_tokens(request_id, count)`: a prefill chunk of `count` tokens."""

    request_id: Any
    count: Any

    def perform(self, system: Any) -> Any:
        return system.scheduler.record_tokens(self.request_id, self.count)


@dataclass(frozen=True, slots=True)
class RecordChunk:
    """`scheduler.record_chunk(request_id, count, pool)`: make room for and count a chunk."""

    request_id: Any
    count: Any

    def perform(self, system: Any) -> Any:
        return system.scheduler.record_chunk(self.request_id, self.count, system.pool)


@dataclass(frozen=True, slots=True)
class AttachPages:
    """`scheduler.attach_pages(request_id, pages, pool)`: share full pages after its own."""

    request_id: Any
    pages: tuple[Any, ...]

    def perform(self, system: Any) -> Any:
        return system.scheduler.attach_pages(self.request_id, list(self.pages), system.pool)


@dataclass(frozen=True, slots=True)
class Finish:
    """`scheduler.finish(request_id, pool)`."""

    request_id: Any

    def perform(self, system: Any) -> Any:
        return system.scheduler.finish(self.request_id, system.pool)


@dataclass(frozen=True, slots=True)
class DecodeRound:
    """`scheduler.execute_decode_round(backend, items, tables, outputs)` with a backend that
    answers every item (or breaks the contract as `fault` says), on scratch buffers sized for
    every decoding request, less one record in the buffer `short` names ("": none short)."""

    fault: Fault = Fault.NONE
    short: str = ""


@dataclass(frozen=True, slots=True)
class DecodeOverlapping:
    """`scheduler.execute_decode_round` on scratch buffers that share memory (the system's
    `overlapping_scratch`): the round must refuse them, or its backend reads tables the outputs
    overwrote."""


@dataclass(frozen=True, slots=True)
class ForeignPool:
    """`scheduler.finish(request_id, other)` or `scheduler.ensure_writable(request_id, 0, other)`
    (`call`) with a pool the scheduler is not bound to, every page of it held: it must refuse."""

    request_id: Any
    call: str = "finish"

    def perform(self, system: Any) -> Any:
        return _foreign(system, self)


# -- the prefix store -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Publish:
    """`store.publish(PrefixPageSet(identity, pages, tokens), pool)` (a set the page-set type
    refuses to build is refused by the call)."""

    identity: Any
    pages: tuple[Any, ...]
    tokens: Any

    def perform(self, system: Any) -> Any:
        return system.store.publish(PrefixPageSet(self.identity, self.pages, self.tokens), system.pool)


@dataclass(frozen=True, slots=True)
class Remove:
    """`store.remove(identity, pool)`."""

    identity: Any

    def perform(self, system: Any) -> Any:
        return system.store.remove(self.identity, system.pool)


@dataclass(frozen=True, slots=True)
class Reclaim:
    """`store.reclaim(pool, pages)`."""

    pages: Any

    def perform(self, system: Any) -> Any:
        return system.store.reclaim(system.pool, self.pages)


@dataclass(frozen=True, slots=True)
class Attach:
    """`store.attach(identity, tables[table], pool)` into a standalone table."""

    identity: Any
    table: int

    def perform(self, system: Any) -> Any:
        return system.store.attach(self.identity, system.tables[self.table], system.pool)


# -- standalone page tables -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewTable:
    """A new standalone `SequenceBlockTable(logical_pages)`, appended to the system's tables."""

    logical_pages: Any

    def perform(self, system: Any) -> Any:
        return system.new_table(self.logical_pages) and None


@dataclass(frozen=True, slots=True)
class TableWritable:
    """`tables[table].ensure_writable(logical_page, pool)`."""

    table: int
    logical_page: Any

    def perform(self, system: Any) -> Any:
        return system.tables[self.table].ensure_writable(self.logical_page, system.pool)


@dataclass(frozen=True, slots=True)
class TableFork:
    """`tables[source].fork_into(tables[target], pool)`."""

    source: int
    target: int

    def perform(self, system: Any) -> Any:
        return system.tables[self.source].fork_into(system.tables[self.target], system.pool)


@dataclass(frozen=True, slots=True)
class TableInstall:
    """`tables[table].install_shared_prefix(pages, pool)`."""

    table: int
    pages: tuple[Any, ...]

    def perform(self, system: Any) -> Any:
        return system.tables[self.table].install_shared_prefix(list(self.pages), system.pool)


@dataclass(frozen=True, slots=True)
class TableRelease:
    """`tables[table].release_all(pool)`."""

    table: int

    def perform(self, system: Any) -> Any:
        return system.tables[self.table].release_all(system.pool)


# -- every read-only query at once ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Read:
    """Every read-only query: `store.get(identity)`, `pool.ref_count(page)`, `pool.free_count()`,
    `scheduler.active_count()`, `scheduler.page_table(request_id)` (unless None) and
    `scheduler.runnable_into` a list of `views` views. Reads change nothing."""

    identity: Any = None
    page: Any = 0
    request_id: Any = None
    views: int = 0

    def perform(self, system: Any) -> Any:
        return _read(system, self)


# -- the engine (its pool, store and scheduler are its own) ---------------------------------


@dataclass(frozen=True, slots=True)
class Submit:
    """`engine.submit(request)`."""

    request: Any

    def perform(self, system: Any) -> Any:
        return system.submit(self.request)


@dataclass(frozen=True, slots=True)
class Cancel:
    """`engine.cancel(request_id)`."""

    request_id: Any

    def perform(self, system: Any) -> Any:
        return system.cancel(self.request_id)


@dataclass(frozen=True, slots=True)
class PublishRunning:
    """`engine.publish(request_id, tokens, identity)`."""

    request_id: Any
    tokens: Any
    identity: Any

    def perform(self, system: Any) -> Any:
        return system.publish(self.request_id, self.tokens, self.identity)


@dataclass(frozen=True, slots=True)
class LeaseRunning:
    """`engine.lease(request_id)`: an asynchronous reader holds a running request's written pages."""

    request_id: Any

    def perform(self, system: Any) -> Any:
        return system.lease(self.request_id)


@dataclass(frozen=True, slots=True)
class EndLease:
    """`engine.end_lease(lease_id)`: the reader read its pages and lets go."""

    lease_id: Any

    def perform(self, system: Any) -> Any:
        return system.end_lease(self.lease_id)


@dataclass(frozen=True, slots=True)
class ForkRunning:
    """`engine.fork(parent, child)`."""

    parent: Any
    child: Any

    def perform(self, system: Any) -> Any:
        return system.fork(self.parent, self.child)


@dataclass(frozen=True, slots=True)
class ResetCache:
    """`engine.reset_cache()`."""

    def perform(self, system: Any) -> Any:
        return system.reset_cache()


@dataclass(frozen=True, slots=True)
class Step:
    """`engine.step()`, its model breaking the decode round as `fault` says, raising in the
    prefill call when `prefill_fails`, and ending the copies between tiers in flight as
    `copies` says (the i-th copy asked about by `copies[i % len]`: 0 still in flight, 1 done,
    2 failed), and raising when the step starts its new copies between the tiers when
    `copy_fails`."""

    fault: Fault = Fault.NONE
    prefill_fails: bool = False
    copies: tuple[int, ...] = (1,)
    copy_fails: bool = False

    def perform(self, system: Any) -> Any:
        return system.step()


# -- the calls that take more than one line -------------------------------------------------

VIEW = RequestView(0, 0, RequestState.EMPTY, 0, 0)


def _foreign(system: Any, event: ForeignPool) -> Any:
    pages = system.pool.physical_pages
    other = type(system.pool)(pages, max_references=system.snapshot()[0].max_references)
    for _ in range(pages):
        other.allocate()  # every page held there too, so a release in it would succeed
    if event.call == "finish":
        return system.scheduler.finish(event.request_id, other)
    return system.scheduler.ensure_writable(event.request_id, 0, other)


def _read(system: Any, event: Read) -> tuple[Any, ...]:
    views = [VIEW] * event.views
    scheduler = system.scheduler
    table = None if event.request_id is None else scheduler.page_table(event.request_id)
    return (
        system.store.get(event.identity),
        system.pool.ref_count(event.page),
        system.pool.free_count(),
        scheduler.active_count(),
        table,
        scheduler.runnable_into(views),
        tuple(views),
    )


Event = (
    Allocate
    | Retain
    | Release
    | Writable
    | Admit
    | Fork
    | EnsureWritable
    | EnsureWritableBatch
    | PrepareDecodeRound
    | MarkPrefillComplete
    | SeedDecodeToken
    | RecordToken
    | RecordTokens
    | RecordChunk
    | AttachPages
    | Finish
    | DecodeRound
    | DecodeOverlapping
    | ForeignPool
    | Publish
    | Remove
    | Reclaim
    | Attach
    | NewTable
    | TableWritable
    | TableFork
    | TableInstall
    | TableRelease
    | Read
    | Submit
    | Cancel
    | PublishRunning
    | ForkRunning
    | LeaseRunning
    | EndLease
    | ResetCache
    | Step
)
ENGINE_EVENTS: tuple[type[Any], ...] = (
    Submit,
    Cancel,
    PublishRunning,
    ForkRunning,
    LeaseRunning,
    EndLease,
    ResetCache,
    Step,
)
EVENTS: tuple[type[Any], ...] = Event.__args__
