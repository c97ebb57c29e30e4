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

from typing import Any

from kvsched.spec import events as ev
from kvsched.spec.batch import RaggedBatchItem, RaggedBatchOutput, RaggedDecodeBackend
from kvsched.spec.domain import require_int
from kvsched.spec.pool import Allocated, BlockPool, Copy, PoolState
from kvsched.spec.prefix import PrefixKvStore, StoreState
from kvsched.spec.scheduler import RequestScheduler
from kvsched.spec.slots import RequestState, SchedulerState
from kvsched.spec.system import SystemState
from kvsched.spec.table import SequenceBlockTable, Table


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


def apply(system: Any, event: Any, backend: RaggedDecodeBackend | None = None) -> Any:
    """Make the call `event` names on `system` (each event makes its own, `event.perform(system)`;
    a round runs `backend` over scratch in the system's form); what it returned."""
    if isinstance(event, ev.DecodeRound | ev.DecodeOverlapping):
        return _round(system, event, backend)
    return event.perform(system)


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
