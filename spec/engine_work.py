"""Where an engine operation is worked out: the engine's state opened in the certified parts'
spec objects, for the engine's parts to change.

The engine holds an `EngineState`, a value, and nothing else that changes. An operation opens a
`Work` on it (`Work.of`), the parts change the work (`engine_running`, `engine_admission`,
`engine_cache`, `engine_host`, `engine_leases`), and the engine takes `work.state` when the
operation succeeded. One that fails drops its work: the engine still holds the state it had, so
nothing is ever undone.

The parts share the work: the pool, the prefix store and the scheduler (the certified parts,
whose transitions keep the system's invariants), the automatic prefix cache, the host tier, the
leases, the queue, the running requests, the recurrent-state slots, the cancellations the next
step reports and the admission clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvsched.spec.engine_config import EngineConfig
from kvsched.spec.engine_state import EngineState, Leased, Queued, Running, external_holds, initial_engine
from kvsched.spec.host_tier import HostState
from kvsched.spec.page_keys import Digest, page_hash
from kvsched.spec.pool import BlockPool
from kvsched.spec.prefix import MAX_SET_PAGES, PrefixKvStore
from kvsched.spec.prefix_cache import EMPTY_CACHE, CacheState
from kvsched.spec.scheduler import RequestScheduler
from kvsched.spec.slots import RequestState
from kvsched.spec.system import SystemState


@dataclass(slots=True)
class Work:
    """An engine state, open for change."""

    config: EngineConfig
    digest: Digest
    pool: BlockPool
    store: PrefixKvStore
    scheduler: RequestScheduler
    cache: CacheState
    host: HostState
    leases: tuple[Leased, ...]
    queue: tuple[Queued, ...]
    running: tuple[Running, ...]
    state_slots: tuple[int | None, ...]
    cancelled: tuple[int, ...]
    admissions: int

    @classmethod
    def of(cls, state: EngineState, config: EngineConfig) -> Work:
        """`state`, open for change."""
        pool, store, scheduler = _certified_parts(config)
        pool.commit(state.system.pool)
        store.commit(state.system.store)
        scheduler.commit(state.system.scheduler)
        return cls(
            config,
            page_hash(config.page_hash),
            pool,
            store,
            scheduler,
            state.system.cache,
            state.host,
            state.leases,
            state.queue,
            state.running,
            state.state_slots,
            state.cancelled,
            state.admissions,
        )

    def reopen(self, state: EngineState) -> None:
        """The work holds `state` again (one it held before: the parts it changed since are
        dropped)."""
        self.pool.commit(state.system.pool)
        self.store.commit(state.system.store)
        self.scheduler.commit(state.system.scheduler)
        self.cache, self.host, self.leases = state.system.cache, state.host, state.leases
        self.queue, self.running, self.state_slots = state.queue, state.running, state.state_slots
        self.cancelled, self.admissions = state.cancelled, state.admissions

    @classmethod
    def initial(cls, config: EngineConfig) -> EngineState:
        """An engine of `config` with nothing queued or running."""
        pool, store, scheduler = _certified_parts(config)
        system = SystemState(pool.state, store.state, scheduler.state, (), EMPTY_CACHE)
        return initial_engine(system, config)

    @property
    def state(self) -> EngineState:
        """The work as a value."""
        external = external_holds(self.host, self.leases)
        system = SystemState(self.pool.state, self.store.state, self.scheduler.state, external, self.cache)
        return EngineState(
            system,
            self.queue,
            self.running,
            self.state_slots,
            self.cancelled,
            self.admissions,
            self.host,
            self.leases,
        )

    # -- the running requests -----------------------------------------------------------------

    def find(self, request_id: int) -> Running | None:
        """The running request `request_id`, if it runs."""
        return next((entry for entry in self.running if entry.request.request_id == request_id), None)

    def entry(self, request_id: int) -> Running:
        """The running request `request_id` (which runs)."""
        entry = self.find(request_id)
        assert entry is not None, "a running request"
        return entry

    def replace(self, entry: Running, **changes: object) -> Running:
        """`entry` changed, in its place."""
        new = replace(entry, **changes)  # type: ignore[arg-type]
        self.running = tuple(new if other is entry else other for other in self.running)
        return new

    def slot_of(self, request_id: int) -> int:
        """The scheduler slot of the running request `request_id`."""
        return next(
            index
            for index, slot in enumerate(self.scheduler.state.slots)
            if slot.state is not RequestState.EMPTY and slot.request_id == request_id
        )

    def free_state_slot(self) -> int | None:
        """The lowest free recurrent-state slot, if any."""
        return next((index for index, owner in enumerate(self.state_slots) if owner is None), None)

    def own_state_slot(self, slot: int, owner: int | None) -> None:
        """Recurrent-state slot `slot` is held by `owner` (None: free)."""
        self.state_slots = self.state_slots[:slot] + (owner,) + self.state_slots[slot + 1 :]


def _certified_parts(config: EngineConfig) -> tuple[BlockPool, PrefixKvStore, RequestScheduler]:
    """A fresh pool, prefix store and request scheduler of `config`, bound together."""
    pool = BlockPool(config.pages)
    store = PrefixKvStore(config.prefix_entries, min(config.logical_pages, MAX_SET_PAGES), pool=pool)
    scheduler = RequestScheduler(
        config.requests, config.logical_pages, pool=pool, prefixes=store, page_size=config.page_size
    )
    return pool, store, scheduler
