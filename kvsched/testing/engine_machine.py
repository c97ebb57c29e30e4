"""The engine's stateful harness: submit, cancel, publish and step (with a failing model) on an
engine under test, in lockstep with the spec's engine, every check after every event.

After each event (`EngineMachine.run`): a typed outcome; the spec's outcome and state
(lockstep); an event that raised changed nothing (atomicity); every engine invariant; the step's
limits (tokens run within `max_batched_tokens`, running within `max_batch_size`); the ghost
reads (every computed position of every running request reads its own history); every copy
the backend runs is one the engine holds (none forgotten); the tokens the model computed in a
step within `max_batched_tokens` (counted by the model, not reported by the engine);
determinism (every token streamed equals what the request samples alone and densely); a
preempted request's place (ahead of every later arrival of its priority); with the automatic
prefix cache, every cached page holds, in the ghost KV, exactly the tokens its key names, at
exactly its positions, and no request holds a page cached for another tenant or adapter
(requests are drawn under two tenants and two adapters). At teardown, liveness: with no
arrivals and a well-behaved model, every request finishes within a bound of steps and every
page and state slot not held by a published prefix or the cache is free; with a host tier, the
same from the same state when every copy fails and when one host page is bad.
"""

from __future__ import annotations

from collections.abc import Callable
from copy import deepcopy
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from kvsched.spec import events as ev
from kvsched.spec.engine_config import EngineConfig, EngineRequest, StepOutput, pages_for, salt_of
from kvsched.spec.engine_events import cached_entries
from kvsched.spec.engine_state import EngineState, sequence_of
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.kv_events import Entry, EventBatch, Stored, fold_events
from kvsched.spec.page_keys import CacheSalt, page_hash, page_keys
from kvsched.spec.prefix import get_store_references
from kvsched.spec.prefix_cache import get_cache_references
from kvsched.spec.sequence import FinishReason
from kvsched.spec.step import apply
from kvsched.testing.checks import CheckFailure, FailureKind, Outcome, capture
from kvsched.testing.component_machine import CheckedMachine
from kvsched.testing.engine_liveness import TIER_FAULTS, drained
from kvsched.testing.engine_model import DONE, FAILED, IN_FLIGHT, VOCAB, HarnessModel, greedy_tokens
from kvsched.testing.registry import ENGINE

EngineFactory = Callable[[EngineConfig, Any], Any]
EOS = 7
IDS = 6  # request ids 1..6; 0 and 7 are never submitted
BASES = ((3, 1, 4, 1, 5, 9, 2, 6), (2, 7, 1, 8, 2, 8, 1, 8))  # what prompts start with
SETTLE_STEPS = 8  # steps in which a request of BASES' length, alone, runs to its end
FULL_HOST_PAGES = 2  # a host tier of this many pages or fewer: a round trip fills it

SHAPES = {
    "default": EngineConfig(
        requests=3,
        pages=7,
        page_size=2,
        logical_pages=8,
        max_batch_size=3,
        max_batched_tokens=5,
        chunk_size=2,
        prefill_reserve_pages=3,
        max_queue=4,
        max_seq_len=16,
        state_slots=2,
        prefix_entries=2,
        admission="first_chunk",  # admissions preempted by prefills: the most pressure
    ),
    "tight": EngineConfig(
        requests=2,
        pages=4,
        page_size=2,
        logical_pages=4,
        max_batch_size=2,
        max_batched_tokens=3,
        chunk_size=1,
        prefill_reserve_pages=0,
        max_queue=3,
        max_seq_len=8,
        prefix_entries=1,
        admission="first_chunk",
    ),
}
SHAPES["cached"] = replace(SHAPES["default"], pages=9, prefill_reserve_pages=2, prefix_caching=True)
SHAPES["cached_tight"] = replace(SHAPES["tight"], pages=5, prefix_caching=True)
SHAPES["whole_prompt"] = replace(SHAPES["default"], admission="whole_prompt")  # the default policy
SHAPES["whole_prompt_cached"] = replace(SHAPES["cached"], admission="whole_prompt")
SHAPES["host"] = replace(SHAPES["cached"], pages=7, host_pages=6)  # a host tier: demotions, promotions, copies late
SHAPES["host_tight"] = replace(SHAPES["cached_tight"], host_pages=2)
SHAPES["host_small"] = replace(SHAPES["host"], host_pages=2)  # a full host tier: its pages taken back
# room for three requests at once and chunks as long as the budget: decode and prefill share a step
SHAPES["roomy"] = replace(
    SHAPES["default"], pages=14, prefill_reserve_pages=0, chunk_size=4, max_batched_tokens=4, state_slots=3
)
TENANTS = 2
ADAPTERS = 2
# how a step ends the copies between tiers in flight (each copy asked about, cycling)
COPIES = st.sampled_from(
    [(DONE,)] * 2 + [(IN_FLIGHT,), (IN_FLIGHT, DONE), (DONE, IN_FLIGHT), (FAILED,), (DONE, FAILED), (FAILED, DONE)]
)


def spec_engine(config: EngineConfig, model: Any) -> Any:
    """The spec's engine."""
    from kvsched.spec.engine import Engine

    return Engine(config, model)


def impl_engine(config: EngineConfig, model: Any) -> Any:
    """impl's engine."""
    from kvsched.impl.engine import Engine

    return Engine(config, model)


def prefix_for(tokens: tuple[int, ...], tenant: int = 0, adapter: int = 0) -> PrefixIdentity:
    """The harness's identity for a prefix: its tokens name it (content-addressed), within a
    tenant and adapter (named prefixes are shared by name; the harness keeps them apart)."""
    words = [len(tokens) + tenant * 2**16 + adapter * 2**24, 0, 0, 0]
    for index, token in enumerate(tokens):
        words[1 + index % 3] = (words[1 + index % 3] * 131 + token + 1) % 2**32
    return PrefixIdentity((words[0], words[1], words[2], words[3]))


@dataclass(slots=True)
class Submission:
    """What the harness knows of one submitted request."""

    request: EngineRequest
    order: int  # submission order
    streamed: list[int]


def budget_failure(config: EngineConfig, tokens: int) -> CheckFailure | None:
    """The model computed at most `max_batched_tokens` tokens in one step."""
    if tokens > config.max_batched_tokens:
        return CheckFailure(FailureKind.INVARIANT, f"the model computed {tokens} tokens in one step")
    return None


def ghost_failure(model: HarnessModel, state: EngineState) -> CheckFailure | None:
    """No copy the backend runs is one the engine forgot (it would write a page the engine may
    hand to another owner); every computed position of every running request reads its own
    history (a request waiting for promotions, up to the first page one of them is still
    writing)."""
    forgotten = model.forgotten({copy.transfer_id for copy in state.host.copies})
    if forgotten:
        return CheckFailure(FailureKind.GHOST, f"the backend runs {', '.join(forgotten)}: the engine forgot it")
    memory = model.memory
    written: dict[int, int] = {}
    for copy in state.host.copies:
        written[copy.transfer_id] = copy.depth * memory.page_size
    memory.histories = {
        entry.request.request_id: sequence_of(entry.request, entry.generated)[
            : min([entry.computed, *(written[tid] for tid in entry.waiting if tid in written)])
        ]
        for entry in state.running
    }
    mismatches = memory.mismatches(state.system.scheduler)
    return CheckFailure(FailureKind.GHOST, "; ".join(mismatches[:3])) if mismatches else None


def events_failure(
    published: frozenset[Entry], next_seq: int, batch: EventBatch | None, after: EngineState, expected: Any
) -> CheckFailure | None:
    """The engine's KV events: `batch` (what it published since `published`, numbered `next_seq`
    or None) folds to its cached set after the event, device and host, each key it stores
    naming the parent its page has; and it is the reference's `expected` batch."""
    cached = cached_entries(after)
    if batch is not None and batch.seq != next_seq:
        return CheckFailure(FailureKind.EVENTS, f"batch {batch.seq} published where {next_seq} was next")
    events = () if batch is None else batch.events
    folded = fold_events(published, events)
    if folded != cached.keys():
        wrong = "contradict what was published" if folded is None else f"fold to {sorted(folded ^ cached.keys())}"
        return CheckFailure(FailureKind.EVENTS, f"the events {events} {wrong}, beside what is cached")
    for event in events:
        if isinstance(event, Stored) and event.parent != cached[event.key, event.tier][0]:
            return CheckFailure(FailureKind.EVENTS, f"{event} names a parent its page does not have")
    if batch != expected:
        return CheckFailure(FailureKind.LOCKSTEP, f"published {batch}, the reference {expected}")
    return None


def cache_failure(
    config: EngineConfig, model: HarnessModel, state: EngineState, salts: set[CacheSalt]
) -> CheckFailure | None:
    """Every cached page, on the device and in the host tier, holds, in the ghost KV, exactly the
    tokens its key names at exactly its positions (its key is the chain of what it holds, for one
    of the `salts` in use); no running request holds a page cached for another salt."""
    page_size, digest = config.page_size, page_hash(config.page_hash)
    owner: dict[int, CacheSalt] = {}
    tiers = [("", model.memory, c.page, c.depth, c.key, c.parent) for c in state.system.cache.pages]
    tiers += [("host ", model.host, entry.page, entry.depth, entry.key, entry.parent) for entry in state.host.cache]
    for tier, memory, page, depth, key, parent in tiers:
        rows = memory.pages.get(page, {})
        end = (depth + 1) * page_size
        history = rows.get(page_size - 1) or ()
        full = len(history) == end and None not in history
        if not full or any(rows.get(row) != history[: end - page_size + row + 1] for row in range(page_size)):
            return CheckFailure(FailureKind.CACHE, f"cached {tier}page {page} (depth {depth}) holds {rows}")
        tokens = tuple(token for token in history if token is not None)
        chains = ((salt, page_keys(tokens, page_size, salt, digest)) for salt in salts)
        found = next(((salt, chain) for salt, chain in chains if chain[-1] == key), None)
        if found is None:
            return CheckFailure(FailureKind.CACHE, f"{tier}page {page}'s key names none of {tokens} for any salt")
        salt, chain = found
        if parent != (chain[-2] if depth else None):
            return CheckFailure(FailureKind.CACHE, f"{tier}page {page} (depth {depth}) names a parent not its chain's")
        if not tier:
            owner[page] = salt
    tables = {slot.request_id: slot.table for slot in state.system.scheduler.slots}
    for entry in state.running:
        mine = salt_of(config, entry.request)
        for mapped in tables.get(entry.request.request_id, ()):
            if mapped is not None and mapped in owner and owner[mapped] != mine:
                return CheckFailure(
                    FailureKind.ISOLATION,
                    f"request {entry.request.request_id} ({mine}) reads page {mapped} of {owner[mapped]}",
                )
    return None


class EngineMachine(CheckedMachine):
    """Drives one engine under test, in lockstep with the spec's unless `reference` is None."""

    component = ENGINE

    def __init__(
        self,
        factory: EngineFactory = impl_engine,
        reference: EngineFactory | None = spec_engine,
        config: EngineConfig = SHAPES["default"],
    ) -> None:
        self.model = HarnessModel(config.page_size)
        self.ref_model = HarnessModel(config.page_size)
        engine = factory(config, self.model)
        super().__init__(engine, reference(config, self.ref_model) if reference is not None else None, config)
        self.engine = engine
        self.submissions: dict[int, Submission] = {}
        self.submitted = 0
        self.published: list[tuple[tuple[int, ...], int, int]] = []  # (tokens, tenant, adapter) published
        # (a prompt, + its output once finished; tenant, adapter)
        self.conversations: list[tuple[tuple[int, ...], int, int]] = []
        self.leases: dict[int, dict[int, dict[int, Any]]] = {}  # lease id -> page -> the KV it saw
        self.salts = {
            CacheSalt(tenant, adapter, config.model_id) for tenant in range(TENANTS) for adapter in range(ADAPTERS)
        }
        self.tokens_before = 0  # the model's token count before the event being checked
        self.folded: frozenset[Entry] = frozenset()  # every batch the engine published, folded
        self.next_seq = 0

    def call(self, system: Any, event: Any) -> Outcome:
        """Run `event` on one engine, its model armed with a step's faults."""
        if isinstance(event, ev.Step):
            (self.model if system is self.engine else self.ref_model).arm(event)
        if system is self.engine:
            self.tokens_before = self.model.tokens
        return capture(lambda: apply(system, event))

    def observe(self, event: Any, outcome: Outcome, after: Any) -> CheckFailure | None:
        """The ghost reads, the cached content and isolation; for a returned event, determinism
        and the preempted requests' places."""
        failure = budget_failure(self.config, self.model.tokens - self.tokens_before)
        failure = failure or ghost_failure(self.model, after)
        failure = failure or cache_failure(self.config, self.model, after, self.salts)
        failure = failure or self._events(after)
        if failure is None and outcome.error is None:
            failure = self._observe(event, outcome.value, after)
        return failure

    def _events(self, after: EngineState) -> CheckFailure | None:
        """The KV events published since the last event fold, with all before them, to the
        cached set (and are the reference's)."""
        batch = self.engine.take_events()
        expected = self.ref.take_events() if self.ref is not None else batch
        failure = events_failure(self.folded, self.next_seq, batch, after, expected)
        if failure is None and batch is not None:
            self.folded, self.next_seq = frozenset(cached_entries(after)), batch.seq + 1
        return failure

    def _observe(self, event: ev.Event, value: Any, after: EngineState) -> CheckFailure | None:
        """Keep the submissions in step; check determinism and the preempted requests' places."""
        if isinstance(event, ev.Submit):
            request = event.request
            self.conversations.append((request.prompt, request.tenant, request.adapter))
            self.submitted += 1
            self.submissions[event.request.request_id] = Submission(event.request, self.submitted, [])
        if isinstance(event, ev.Cancel):
            self.submissions.pop(int(event.request_id))
        if isinstance(event, ev.ForkRunning):
            self.submitted += 1
            parent = self.submissions[int(event.parent)]
            child = replace(parent.request, request_id=int(event.child))
            self.submissions[child.request_id] = Submission(child, self.submitted, list(parent.streamed))
        if isinstance(event, ev.LeaseRunning):  # the pages of its written tokens, as its table maps them
            entry = next(entry for entry in after.running if entry.request.request_id == event.request_id)
            slot = next(slot for slot in after.system.scheduler.slots if slot.request_id == event.request_id)
            pages = [
                page for page in slot.table[: pages_for(entry.computed, self.config.page_size)] if page is not None
            ]
            self.leases[value] = {page: dict(self.model.memory.pages.get(page, {})) for page in pages}
        if isinstance(event, ev.EndLease):
            return self._read_lease(int(event.lease_id))
        if isinstance(event, ev.PublishRunning):
            entry = next(entry for entry in after.running if entry.request.request_id == event.request_id)
            request = entry.request
            self.published.append(
                (sequence_of(request, entry.generated)[: event.tokens], request.tenant, request.adapter)
            )
        if not isinstance(value, StepOutput):
            return None
        for request_id, tokens in value.tokens.items():
            submission = self.submissions[request_id]
            submission.streamed.extend(tokens)
            request = submission.request
            expected = greedy_tokens(request.prompt, request.max_new_tokens, request.eos_token_id)
            if submission.streamed != expected[: len(submission.streamed)]:
                return CheckFailure(
                    FailureKind.DETERMINISM, f"request {request_id} streamed {submission.streamed}, alone {expected}"
                )
        for request_id, reason in value.finished.items():
            if reason is FinishReason.CANCELLED:
                continue  # forgotten when it was cancelled
            submission = self.submissions.pop(request_id)
            request = submission.request
            self.conversations.append((request.prompt + tuple(submission.streamed), request.tenant, request.adapter))
            expected = greedy_tokens(request.prompt, request.max_new_tokens, request.eos_token_id)
            if submission.streamed != expected:
                return CheckFailure(
                    FailureKind.DETERMINISM, f"request {request_id} finished with {submission.streamed}"
                )
        return self._places(value.preempted, after)

    def _read_lease(self, lease_id: int) -> CheckFailure | None:
        """The reader reads its pages: each holds the KV it held when the lease began."""
        for page, seen in sorted(self.leases.pop(lease_id).items()):
            now = self.model.memory.pages.get(page, {})
            if now != seen:
                return CheckFailure(FailureKind.GHOST, f"lease {lease_id} reads page {page}: {now}, not {seen}")
        return None

    def _places(self, preempted: tuple[int, ...], after: EngineState) -> CheckFailure | None:
        queue = [entry.request.request_id for entry in after.queue]
        for request_id in preempted:
            if request_id not in queue:
                continue  # readmitted in the same step is impossible; cancelled is not
            mine = self.submissions[request_id]
            for other in queue[: queue.index(request_id)]:
                theirs = self.submissions[other]
                if theirs.request.priority == mine.request.priority and theirs.order > mine.order:
                    return CheckFailure(FailureKind.ORDER, f"preempted {request_id} queued behind later {other}")
        return None

    # -- rules -------------------------------------------------------------------------------

    @rule(
        request_id=st.integers(1, IDS),
        base=st.sampled_from(BASES),
        shared=st.integers(0, 8),
        tail=st.lists(st.integers(0, VOCAB - 1), max_size=4).map(tuple),
        max_new_tokens=st.integers(1, 8),
        eos=st.sampled_from([None, EOS]),
        priority=st.integers(0, 1),
        prefix=st.integers(0, 9),
        tenant=st.integers(0, TENANTS - 1),
        adapter=st.sampled_from([0] * 3 + list(range(1, ADAPTERS))),  # mostly one: prompts still share pages
    )
    def submit(
        self,
        request_id: int,
        base: tuple[int, ...],
        shared: int,
        tail: tuple[int, ...],
        max_new_tokens: int,
        eos: int | None,
        priority: int,
        prefix: int,
        tenant: int,
        adapter: int = 0,
    ) -> None:
        prompt = (base[:shared] + tail) or base[:1]  # prompts share prefixes, so published ones hit
        identity = prefix_for(prompt[:prefix], tenant, adapter) if 0 < prefix <= len(prompt) else None
        request = EngineRequest(request_id, prompt, max_new_tokens, eos, priority, tenant, identity, adapter=adapter)
        self.run(ev.Submit(request))

    @rule(
        request_id=st.integers(1, IDS),
        pick=st.integers(0, 3),
        tail=st.lists(st.integers(0, VOCAB - 1), max_size=2).map(tuple),
        max_new_tokens=st.integers(1, 4),
    )
    def submit_after_published(self, request_id: int, pick: int, tail: tuple[int, ...], max_new_tokens: int) -> None:
        """A prompt that starts with (or is) a prefix published earlier, naming it: a hit."""
        if not self.published:
            return
        published, tenant, adapter = self.published[pick % len(self.published)]
        identity = prefix_for(published, tenant, adapter)
        request = EngineRequest(
            request_id, published + tail, max_new_tokens, tenant=tenant, prefix=identity, adapter=adapter
        )
        self.run(ev.Submit(request))

    @rule(
        request_id=st.integers(1, IDS),
        pick=st.integers(0, 3),
        tail=st.lists(st.integers(0, VOCAB - 1), max_size=3).map(tuple),
        max_new_tokens=st.integers(1, 3),
    )
    def submit_next_turn(self, request_id: int, pick: int, tail: tuple[int, ...], max_new_tokens: int) -> None:
        """A conversation's next turn: an earlier request's prompt (and its whole output, once it
        finished), then more: with a host tier, what was evicted is asked for again."""
        if not self.conversations:
            return
        history, tenant, adapter = self.conversations[-1 - pick % len(self.conversations)]
        self.run(ev.Submit(EngineRequest(request_id, history + tail, max_new_tokens, tenant=tenant, adapter=adapter)))

    @rule(value=st.sampled_from([None, -1, "3", 2**64]))
    def submit_not_a_request(self, value: Any) -> None:
        self.run(ev.Submit(value))

    @rule(request_id=st.integers(0, IDS + 1))
    def cancel(self, request_id: int) -> None:
        self.run(ev.Cancel(request_id))

    @rule(pick=st.integers(0, 5), tokens=st.integers(0, 10))
    def publish(self, pick: int, tokens: int) -> None:
        running = self.engine.to_spec().running
        if not running:
            return
        entry = running[pick % len(running)]
        sequence = sequence_of(entry.request, entry.generated)
        identity = prefix_for(sequence[:tokens], entry.request.tenant, entry.request.adapter)
        self.run(ev.PublishRunning(entry.request.request_id, tokens, identity))

    @rule(pick=st.integers(0, 5), child=st.integers(0, IDS + 1))
    def fork(self, pick: int, child: int) -> None:
        running = self.engine.to_spec().running
        parent = running[pick % len(running)].request.request_id if running else pick
        self.run(ev.ForkRunning(parent, child))

    @rule(pick=st.integers(0, 5))
    def lease(self, pick: int) -> None:
        """A connector's save or a disaggregated send holds a running request's written pages."""
        running = self.engine.to_spec().running
        self.run(ev.LeaseRunning(running[pick % len(running)].request.request_id if running else pick))

    @rule(pick=st.integers(0, 3))
    def end_lease(self, pick: int) -> None:
        """Some events later the reader reads what it holds and lets go (or names no lease)."""
        held = sorted(self.leases)
        self.run(ev.EndLease(held[pick % len(held)] if held else pick))

    @rule()
    def reset_cache(self) -> None:
        self.run(ev.ResetCache())

    @rule(
        fault=st.sampled_from(
            [ev.Fault.NONE] * 6
            + [ev.Fault.RAISE, ev.Fault.CORRUPT_IDENTITY, ev.Fault.WRONG_BATCH, ev.Fault.PARTIAL, ev.Fault.REJECT]
        ),
        prefill_fails=st.sampled_from([False] * 6 + [True]),
        copies=COPIES,
        copy_fails=st.sampled_from([False] * 12 + [True]),
    )
    def step(self, fault: ev.Fault, prefill_fails: bool, copies: tuple[int, ...], copy_fails: bool = False) -> None:
        self.run(ev.Step(fault, prefill_fails, copies, copy_fails and bool(self.config.host_pages)))

    @rule(count=st.integers(2, 6), copies=COPIES)
    def steps(self, count: int, copies: tuple[int, ...]) -> None:
        """Several steps with a well-behaved model (copies between tiers end as `copies` says):
        requests run to their ends, the cache fills and evicts, within one program."""
        for _ in range(count):
            self.run(ev.Step(copies=copies))

    def teardown(self) -> None:
        """Liveness: with no arrivals, every request finishes within a bound of steps; then
        only published prefixes hold pages, and no state slot is held."""
        if self.failed:
            return
        for lease_id in sorted(self.leases):
            self.run(ev.EndLease(lease_id))
        state = self.engine.to_spec()
        work = [*state.queue, *state.running]
        bound = 8 + sum(4 * (len(entry.request.prompt) + entry.request.max_new_tokens) for entry in work)
        for tier in TIER_FAULTS if self.config.host_pages else ():
            failure = drained(deepcopy(self.engine), bound, tier)
            if failure is not None:
                self.fail(failure)
                return
        for _ in range(bound):
            if not self.engine.has_work():
                break
            self.run(ev.Step())
        if self.engine.has_work():
            self.fail(CheckFailure(FailureKind.LIVENESS, f"work left after {bound} steps"))
        left = self.engine.to_spec()
        store, pool = left.system.store, left.system.pool
        cached = get_cache_references(left.system.cache)
        held = [
            page
            for page, count in enumerate(pool.refs)
            if count != get_store_references(store, page) + cached.get(page, 0)
        ]
        if held or any(owner is not None for owner in left.state_slots):
            self.fail(CheckFailure(FailureKind.LIVENESS, f"pages {held} or state slots still held after draining"))


class FullHostMachine(EngineMachine):
    """The engine machine on a host tier small enough to fill (`FULL_HOST_PAGES` pages or fewer):
    one rule more, which fills it while a promotion reads it."""

    @rule(
        first=st.integers(1, IDS),
        length=st.integers(4, 5),
        more=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=2).map(tuple),
        newcomer=st.lists(st.integers(0, VOCAB - 1), min_size=4, max_size=8).map(tuple),
        copies=COPIES,
    )
    def round_trip(
        self, first: int, length: int, more: tuple[int, ...], newcomer: tuple[int, ...], copies: tuple[int, ...]
    ) -> None:
        """With a host tier: a prompt computed, pushed to the host by another prompt's pressure,
        asked for again with more tokens, and a newcomer arriving while that return's copies are
        in flight (as `copies` says): the host fills while a promotion still reads it."""
        ids = [(first + offset - 1) % IDS + 1 for offset in range(4)]
        prompt, other = BASES[0][:length], BASES[1]
        for request in (EngineRequest(ids[0], prompt, 1), EngineRequest(ids[1], other, 2)):
            self.run(ev.Submit(request))
            for _ in range(SETTLE_STEPS):
                self.run(ev.Step(copies=(DONE,)))
        self.run(ev.Submit(EngineRequest(ids[2], prompt + more, 1)))
        self.run(ev.Step(copies=copies))
        self.run(ev.Submit(EngineRequest(ids[3], newcomer, 2)))
        for _ in range(4):
            self.run(ev.Step(copies=copies))


def engine_machine(
    factory: EngineFactory = impl_engine,
    reference: EngineFactory | None = spec_engine,
    config: EngineConfig = SHAPES["default"],
) -> type[EngineMachine]:
    """An `EngineMachine` class over these engines and shape (what hypothesis runs); on a host
    tier small enough to fill, a `FullHostMachine`."""
    base = FullHostMachine if 0 < config.host_pages <= FULL_HOST_PAGES else EngineMachine

    class Machine(base):  # type: ignore[valid-type,misc]
        def __init__(self) -> None:
            super().__init__(factory, reference, config)

    Machine.__name__ = EngineMachine.__name__
    return Machine


def shape(name: str, **changes: Any) -> EngineConfig:
    """A named shape with some fields changed."""
    return replace(SHAPES[name], **changes)
