"""Running events: `apply` on any system with the spec's object API, `step` on a state value.

A system is anything with `pool`, `store` and `scheduler` objects of the spec's public API,
`scratch(items, tables, outputs)` for round buffers in its own form and, for the table events, a
list `tables` of standalone tables and `new_table(logical_pages)`; for the engine's events, an
`Engine` (whose model answers a `Step` as the event's faults say: the harness arms it). `apply`
makes the one call an event names and returns what it returned; it raises whatever it raises.

`step(state, event)` is the spec's transition on a whole `SystemState`: it runs the event on
fresh spec objects holding `state` and returns the new state and the result; `holds_after`
says how the external holder's references change. A refused event raises, and `state`, being a
value, is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvsched.spec import events as ev
from kvsched.spec.batch import RaggedBatchItem, RaggedBatchOutput, RaggedDecodeBackend
from kvsched.spec.domain import require_int
from kvsched.spec.pool import Allocated, BlockPool, Copy, PoolState
from kvsched.spec.prefix import PrefixKvStore, PrefixPageSet, StoreState
from kvsched.spec.scheduler import RequestScheduler
from kvsched.spec.slots import RequestState, RequestView, SchedulerState
from kvsched.spec.system import SystemState
from kvsched.spec.table import SequenceBlockTable, Table

VIEW = RequestView(0, 0, RequestState.EMPTY, 0, 0)


def round_sizes(system: Any, short: str) -> tuple[int, int, int]:
    """Scratch lengths for a round over every decoding request, less one in buffer `short`."""
    decoding = sum(1 for slot in system.snapshot()[2].slots if slot.state is RequestState.DECODE)
    sizes = [decoding, decoding * system.scheduler.logical_pages, decoding]
    if short:
        index = ev.SHORT_BUFFERS.index(short)
        sizes[index] = max(sizes[index] - 1, 0)
    return sizes[0], sizes[1], sizes[2]


def _round(system: Any, event: ev.DecodeRound | ev.DecodeOverlapping, backend: RaggedDecodeBackend | None) -> Any:
    if backend is None:
        raise ValueError("a round needs a backend")
    if isinstance(event, ev.DecodeRound):
        return system.scheduler.execute_decode_round(backend, *system.scratch(*round_sizes(system, event.short)))
    items, tables, outputs = round_sizes(system, "")
    scratch = system.overlapping_scratch(max(items, 1), max(tables, 1), max(outputs, 1))
    return system.scheduler.execute_decode_round(backend, *scratch)


def _foreign(system: Any, event: ev.ForeignPool) -> Any:
    pages = system.pool.physical_pages
    other = type(system.pool)(pages, max_references=system.snapshot()[0].max_references)
    for _ in range(pages):
        other.allocate()  # every page held there too, so a release in it would succeed
    if event.call == "finish":
        return system.scheduler.finish(event.request_id, other)
    return system.scheduler.ensure_writable(event.request_id, 0, other)


def _read(system: Any, event: ev.Read) -> tuple[Any, ...]:
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


Call = Callable[[Any, Any], Any]

_CALLS: dict[type[Any], Call] = {
    ev.Allocate: lambda s, e: s.pool.allocate(),
    ev.Retain: lambda s, e: s.pool.retain(e.page),
    ev.Release: lambda s, e: s.pool.release(e.page),
    ev.Writable: lambda s, e: s.pool.writable(e.current),
    ev.Admit: lambda s, e: s.scheduler.admit_with_prefix(e.request_id, e.prefix, s.store, s.pool),
    ev.Fork: lambda s, e: s.scheduler.fork(e.parent, e.child, s.pool),
    ev.EnsureWritable: lambda s, e: s.scheduler.ensure_writable(e.request_id, e.logical_page, s.pool),
    ev.EnsureWritableBatch: lambda s, e: s.scheduler.ensure_writable_batch(
        list(e.request_ids), list(e.logical_pages), s.pool
    ),
    ev.PrepareDecodeRound: lambda s, e: s.scheduler.prepare_decode_round(s.pool, e.page_size),
    ev.MarkPrefillComplete: lambda s, e: s.scheduler.mark_prefill_complete(e.request_id),
    ev.SeedDecodeToken: lambda s, e: s.scheduler.seed_decode_token(e.request_id, e.token),
    ev.RecordToken: lambda s, e: s.scheduler.record_token(e.request_id),
    ev.RecordTokens: lambda s, e: s.scheduler.record_tokens(e.request_id, e.count),
    ev.RecordChunk: lambda s, e: s.scheduler.record_chunk(e.request_id, e.count, s.pool),
    ev.AttachPages: lambda s, e: s.scheduler.attach_pages(e.request_id, list(e.pages), s.pool),
    ev.Finish: lambda s, e: s.scheduler.finish(e.request_id, s.pool),
    ev.ForeignPool: _foreign,
    ev.Publish: lambda s, e: s.store.publish(PrefixPageSet(e.identity, e.pages, e.tokens), s.pool),
    ev.Remove: lambda s, e: s.store.remove(e.identity, s.pool),
    ev.Reclaim: lambda s, e: s.store.reclaim(s.pool, e.pages),
    ev.Attach: lambda s, e: s.store.attach(e.identity, s.tables[e.table], s.pool),
    ev.NewTable: lambda s, e: s.new_table(e.logical_pages) and None,
    ev.TableWritable: lambda s, e: s.tables[e.table].ensure_writable(e.logical_page, s.pool),
    ev.TableFork: lambda s, e: s.tables[e.source].fork_into(s.tables[e.target], s.pool),
    ev.TableInstall: lambda s, e: s.tables[e.table].install_shared_prefix(list(e.pages), s.pool),
    ev.TableRelease: lambda s, e: s.tables[e.table].release_all(s.pool),
    ev.Read: _read,
    ev.Submit: lambda s, e: s.submit(e.request),
    ev.Cancel: lambda s, e: s.cancel(e.request_id),
    ev.PublishRunning: lambda s, e: s.publish(e.request_id, e.tokens, e.identity),
    ev.ForkRunning: lambda s, e: s.fork(e.parent, e.child),
    ev.ResetCache: lambda s, e: s.reset_cache(),
    ev.Step: lambda s, e: s.step(),
}


def apply(system: Any, event: Any, backend: RaggedDecodeBackend | None = None) -> Any:
    """Make the call `event` names on `system` (a round runs `backend`); what it returned. An
    event of a component outside the alphabet here makes its own call (`event.call(system)`)."""
    if isinstance(event, ev.DecodeRound | ev.DecodeOverlapping):
        return _round(system, event, backend)
    call = _CALLS.get(type(event))
    return call(system, event) if call is not None else event.call(system)


class SpecObjects:
    """The spec's pool, store and scheduler as one system (with standalone tables and round
    scratch in the spec's form): what `step` runs an event on, and the harness's reference."""

    def __init__(self, pool: BlockPool, store: PrefixKvStore, scheduler: RequestScheduler) -> None:
        self.pool = pool
        self.store = store
        self.scheduler = scheduler
        self.tables: list[SequenceBlockTable] = []

    @classmethod
    def at(cls, state: SystemState, page_size: int | None = None) -> SpecObjects:
        """Fresh spec objects holding `state` (its tables are not part of it)."""
        pool = BlockPool(len(state.pool.refs), max_references=state.pool.max_references)
        store = PrefixKvStore(len(state.store.entries), state.store.page_capacity, pool=pool)
        slots = state.scheduler.slots
        width = len(slots[0].table) if slots else 0
        scheduler = RequestScheduler(len(slots), width, pool=pool, prefixes=store, page_size=page_size)
        BlockPool.commit(pool, state.pool)
        PrefixKvStore.commit(store, state.store)
        RequestScheduler.commit(scheduler, state.scheduler)
        return cls(pool, store, scheduler)

    def snapshot(self) -> tuple[PoolState, StoreState, SchedulerState]:
        """The three objects' states."""
        return self.pool.state, self.store.state, self.scheduler.state

    def scratch(self, items: int, tables: int, outputs: int) -> tuple[Any, Any, Any]:
        """Round scratch lists of these lengths."""
        return [RaggedBatchItem()] * items, [0] * tables, [RaggedBatchOutput()] * outputs

    def overlapping_scratch(self, items: int, tables: int, outputs: int) -> tuple[Any, Any, Any]:
        """Round buffers that share memory: one list as both the block tables and the outputs."""
        shared: list[Any] = [0] * max(tables, outputs)
        return [RaggedBatchItem()] * items, shared, shared

    def new_table(self, logical_pages: int) -> SequenceBlockTable:
        """A standalone table: an owner of pages outside the three objects."""
        table = SequenceBlockTable(logical_pages)
        self.tables.append(table)
        return table

    def table_states(self) -> tuple[Table, ...]:
        """The standalone tables' entries."""
        return tuple(table.state for table in self.tables)


def step(
    state: SystemState,
    event: ev.Event,
    *,
    page_size: int | None = None,
    backend: RaggedDecodeBackend | None = None,
) -> tuple[SystemState, Any]:
    """The system after `event`, and what the call returned; raises when the call is refused.

    `page_size` is the scheduler's (it finds each round's write target); `backend` serves a
    `DecodeRound`. The table events need tables, which a `SystemState` has no field for."""
    system = SpecObjects.at(state, page_size)
    result = apply(system, event, backend)
    external = holds_after(state.external, event, result)
    return SystemState(system.pool.state, system.store.state, system.scheduler.state, external), result


HOLDER_EVENTS = frozenset(
    {ev.Allocate, ev.Retain, ev.Release, ev.Writable}
)  # the events that change the holder's references


def holds_after(external: tuple[int, ...], event: ev.Event, result: object) -> tuple[int, ...]:
    """The holder's references (a sorted multiset of pages) after `event` returned `result`.

    A `Release` of a page the holder does not hold changes nothing here: it is a reference
    taken from another owner (the ownership abuse a checker may drive on purpose)."""
    if type(event) not in HOLDER_EVENTS:
        return external
    held = list(external)
    if isinstance(event, ev.Allocate):
        held.append(require_int("page id", result))
    elif isinstance(event, ev.Retain):
        held.append(int(event.page))
    elif isinstance(event, ev.Release) and int(event.page) in held:
        held.remove(int(event.page))
    elif isinstance(event, ev.Writable) and isinstance(result, Allocated):
        held.append(result.page)
    elif isinstance(event, ev.Writable) and isinstance(result, Copy) and result.source in held:
        held.remove(result.source)
        held.append(result.destination)
    return tuple(sorted(held))
