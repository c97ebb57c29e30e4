"""The engine's state as one value, the queue's and the preemption's order, and its invariants.

    submit --> queued --admit--> running (prefilling --last chunk--> decoding) --> finished
                 ^                   |
                 +---- preempt ------+   (to the front of its priority class, tokens kept)

`EngineState` is the `SystemState` of the certified parts (pool, store, scheduler) plus what the
scheduler does not know: the queue, each running request's request and generated tokens, the
recurrent-state slots, and the cancellations the next step reports. The scheduler's slots stay
the truth about pages; `running` and the slots agree (`inv_engine_running_is_scheduled`).

Orders (each a total order, so spec and impl agree step for step):
- the queue: priority descending, FIFO inside a priority; a preempted request re-enters at the
  front of its priority class, so it keeps its place ahead of every later arrival;
- `running`: admission order; the preemption victim is the lowest-priority, latest-admitted
  running request (`victim`), so a request is never preempted for a later or lower one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvsched.spec import host_tier
from kvsched.spec.engine_config import EngineConfig, EngineRequest
from kvsched.spec.engine_tiers import is_a_tiered_cache
from kvsched.spec.host_tier import NO_HOST, PROMOTE, HostState
from kvsched.spec.invariants import INVARIANTS
from kvsched.spec.slots import RequestState, is_live
from kvsched.spec.system import SystemState


@dataclass(frozen=True, slots=True)
class Queued:
    """A request waiting for admission, with the tokens it generated before a preemption."""

    request: EngineRequest
    generated: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Running:
    """An admitted request. Its sequence is prompt + generated; `computed` of its tokens have
    their KV written. Prefilling, it computes the whole sequence (a recompute after preemption
    included) and then samples; decoding, every token but the last is computed and the last is
    the next round's input. `waiting` names the promotions (copies from the host tier) into its
    pages still in flight: until they complete it computes nothing."""

    request: EngineRequest
    generated: tuple[int, ...]
    computed: int
    decoding: bool
    admitted: int  # the engine's admission clock when it was admitted
    state_slot: int | None  # its recurrent-state slot (None when the engine has none)
    waiting: tuple[int, ...] = ()  # ids of the promotions into its pages still in flight

    @property
    def sequence_length(self) -> int:
        """Prompt + generated tokens."""
        return len(self.request.prompt) + len(self.generated)


@dataclass(frozen=True, slots=True)
class EngineState:
    """The whole engine."""

    system: SystemState
    queue: tuple[Queued, ...]  # front first
    running: tuple[Running, ...]  # admission order
    state_slots: tuple[int | None, ...]  # each slot's owner request id, None when free
    cancelled: tuple[int, ...]  # cancelled since the last step, in cancellation order
    admissions: int  # the admission clock: how many admissions so far
    host: HostState = NO_HOST  # the host tier and the copies in flight (none without one)
    leases: tuple[Leased, ...] = ()  # asynchronous readers' holds, in id order


@dataclass(frozen=True, slots=True)
class Leased:
    """An asynchronous reader's hold (a connector's save, a disaggregated send) on the pages of
    a request's written tokens, one reference each, until it ends."""

    lease_id: int
    pages: tuple[int, ...]


def external_holds(host: HostState, leases: Sequence[Leased]) -> tuple[int, ...]:
    """The device pages held outside the scheduler, store and cache: one per copy in flight
    and one per leased page, sorted (the system's `external`)."""
    return tuple(sorted((*host_tier.device_holds(host), *(page for lease in leases for page in lease.pages))))


def sequence_of(request: EngineRequest, generated: Sequence[int]) -> tuple[int, ...]:
    """Prompt + generated."""
    return request.prompt + tuple(generated)


def queue_position(queue: Sequence[Queued], priority: int, front: bool) -> int:
    """Where an entry of `priority` enters: after every higher priority, and after (back) or
    before (front) every entry of its own."""
    for index, entry in enumerate(queue):
        other = entry.request.priority
        if other < priority or (front and other == priority):
            return index
    return len(queue)


def enqueue(queue: tuple[Queued, ...], entry: Queued, *, front: bool) -> tuple[Queued, ...]:
    """`queue` with `entry` at the back (a new arrival) or the front (a preempted request) of
    its priority class."""
    index = queue_position(queue, entry.request.priority, front)
    return queue[:index] + (entry,) + queue[index:]


def victim_order(entry: Running) -> tuple[int, int]:
    """Preemption order: the smallest is preempted first (lowest priority, latest admitted)."""
    return (entry.request.priority, -entry.admitted)


def victim(running: Sequence[Running]) -> Running | None:
    """The running request to preempt first, if any."""
    return min(running, key=victim_order, default=None)


def prefill_order(entry: Running) -> tuple[int, int]:
    """The order running prefills get their chunks in: strict priority, then admission."""
    return (-entry.request.priority, entry.admitted)


def initial_engine(system: SystemState, config: EngineConfig) -> EngineState:
    """An engine with nothing queued or running."""
    host = host_tier.initial_host(config.host_pages)
    return EngineState(system, (), (), (None,) * config.state_slots, (), 0, host)


def live_ids(state: EngineState) -> set[int]:
    """The ids queued or running (what `submit` calls a duplicate)."""
    return {entry.request.request_id for entry in state.queue} | {entry.request.request_id for entry in state.running}


# -- invariants --------------------------------------------------------------------------------


def inv_engine_system(state: EngineState) -> bool:
    """Every invariant of the certified parts holds."""
    return all(invariant(state.system) for invariant in INVARIANTS)


def inv_engine_running_is_scheduled(state: EngineState) -> bool:
    """The running requests are exactly the scheduler's live requests; a decoding one is in
    DECODE with its last token seeded and every other token counted; a prefilling one is in
    PREFILL with exactly its computed tokens counted."""
    live = {slot.request_id: slot for slot in state.system.scheduler.slots if is_live(slot)}
    if set(live) != {entry.request.request_id for entry in state.running}:
        return False
    for entry in state.running:
        slot = live[entry.request.request_id]
        length = entry.sequence_length
        if entry.decoding:
            ready = slot.state is RequestState.DECODE and slot.token_ready
            if not ready or slot.token_count != length - 1 or slot.next_token_id != entry.generated[-1]:
                return False
        elif slot.state is not RequestState.PREFILL or slot.token_count != entry.computed:
            return False
    return True


def inv_engine_ids_unique(state: EngineState) -> bool:
    """No request id is both queued and running, or in either twice."""
    ids = [entry.request.request_id for entry in state.queue] + [entry.request.request_id for entry in state.running]
    return len(ids) == len(set(ids))


def inv_engine_queue_ordered(state: EngineState) -> bool:
    """The queue is in priority order, highest first."""
    priorities = [entry.request.priority for entry in state.queue]
    return priorities == sorted(priorities, reverse=True)


def inv_engine_admission_order(state: EngineState) -> bool:
    """`running` is in admission order, every admission stamp below the clock."""
    stamps = [entry.admitted for entry in state.running]
    return stamps == sorted(set(stamps)) and all(stamp < state.admissions for stamp in stamps)


def inv_engine_state_slots_exact(state: EngineState) -> bool:
    """With state slots, every running request holds exactly one, and every held one is held by
    exactly one running request (held + free = total); without, no request holds one."""
    owners = {slot: owner for slot, owner in enumerate(state.state_slots) if owner is not None}
    held = {entry.state_slot: entry.request.request_id for entry in state.running if entry.state_slot is not None}
    if not state.state_slots:
        return not held
    holders = [entry.state_slot for entry in state.running]
    return None not in holders and len(set(holders)) == len(holders) and owners == held


def inv_engine_generated_bounded(state: EngineState) -> bool:
    """No request has generated its limit and still runs or waits (it would have finished)."""
    entries: list[Queued | Running] = [*state.queue, *state.running]
    return all(len(entry.generated) < entry.request.max_new_tokens for entry in entries)


def inv_engine_host_tier(state: EngineState) -> bool:
    """The host tier's pages are exact, its cache and its copies well formed, its refused pages
    distinct and cached on the device, and the device pages the copies and the leases hold are
    exactly the system's external holds; leases are in id order, each id once."""
    host = state.host
    cached = {entry.page for entry in state.system.cache.pages}
    return (
        host_tier.inv_host_pages_exact(host)
        and host_tier.inv_host_cache_well_formed(host)
        and host_tier.inv_host_copies_well_formed(host)
        and host_tier.inv_host_refused_distinct(host)
        and all(page in cached for page in host.refused)
        and state.system.external == external_holds(host, state.leases)
        and [lease.lease_id for lease in state.leases] == sorted({lease.lease_id for lease in state.leases})
    )


def inv_engine_waits_for_promotions(state: EngineState) -> bool:
    """A running request waits for promotions in flight that name it, each into the page its
    table maps at the copy's depth, at most once each, and it is prefilling meanwhile (it
    computes nothing: `inv_engine_running_is_scheduled` counts every promoted page)."""
    tables = {slot.request_id: slot.table for slot in state.system.scheduler.slots if is_live(slot)}
    promotions = {copy.transfer_id: copy for copy in state.host.copies if copy.kind == PROMOTE}
    for entry in state.running:
        request_id = entry.request.request_id
        if entry.waiting and (entry.decoding or len(set(entry.waiting)) != len(entry.waiting)):
            return False
        table = tables.get(request_id, ())
        for transfer_id in entry.waiting:
            copy = promotions.get(transfer_id)
            if copy is None or copy.request_id != request_id:
                return False
            if copy.depth >= len(table) or table[copy.depth] != copy.page:
                return False
    return True


def inv_engine_is_a_tiered_cache(state: EngineState) -> bool:
    """As a tiered cache (`engine_tiers.as_tiers`), every device and host page's count is its
    holders and each free stack is exactly the unheld pages: the invariants z3 proves the tiered
    cache keeps at every size (`kvsched.proofs.tier_safety`)."""
    return is_a_tiered_cache(state.system, state.host, [lease.pages for lease in state.leases])


EngineInvariant = Callable[[EngineState], bool]

ENGINE_INVARIANTS: tuple[EngineInvariant, ...] = (
    inv_engine_system,
    inv_engine_running_is_scheduled,
    inv_engine_ids_unique,
    inv_engine_queue_ordered,
    inv_engine_admission_order,
    inv_engine_state_slots_exact,
    inv_engine_generated_bounded,
    inv_engine_host_tier,
    inv_engine_waits_for_promotions,
    inv_engine_is_a_tiered_cache,
)


def check_engine_invariants(state: EngineState) -> tuple[str, ...]:
    """The names of every engine invariant `state` violates."""
    return tuple(invariant.__name__ for invariant in ENGINE_INVARIANTS if not invariant(state))
