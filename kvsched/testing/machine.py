"""The stateful model-checking machine: any system under test, driven through every operation.

`KvschedMachine(factory, reference)` builds the system under test from `factory` and, unless
`reference` is None, a spec system beside it. Every rule runs one public operation — valid,
invalid (unknown ids, duplicates, out-of-range pages, exhausted pools, full schedulers, double
finishes, short buffers) or fault-injected (see `FAULTS`) — on both, then checks:

- lockstep: same result, same error type, same abstract state as the reference;
- atomicity: an operation that raised left the whole state exactly as it was;
- errors are typed: anything but a `KvschedError` is a bug;
- postconditions: after `ensure_writable` the written page has exactly one reference;
- after every step, every `inv_*` of `kvsched.spec.invariants` and the ghost-memory read check;
- at teardown, liveness: finishing every request, removing every prefix and dropping the
  harness's own holds returns every page to the free stack.

A failure prints the steps as calls on a fresh machine (`state = KvschedMachine()` ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import note
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvsched.spec import Copy, KvschedError, PrefixIdentity, PrefixPageSet, RequestState, RequestView
from kvsched.spec.invariants import (
    INVARIANTS,
    check_invariants,
    post_drained_all_free,
    post_failure_changes_nothing,
    post_lifo_reuse,
    post_written_page_exclusive,
)
from kvsched.spec.slots import Slot, is_live
from kvsched.spec.system import SystemState
from kvsched.testing.backends import FAULTS, HarnessBackend
from kvsched.testing.ghost import GhostMemory, History
from kvsched.testing.system import SystemConfig, SystemFactory, SystemUnderTest, spec_system

NEW_IDS = st.sampled_from([-1, 0, 0, 1, 1, 2, 2, 3, 4, 2**64])
# How an integer argument is passed: the id rule (`kvsched.spec.domain`) admits any of them.
FORMS = st.sampled_from(["int", "int", "int", "subclass", "numpy", "numpy unsigned"])
PICKS = st.integers(0, 9)  # mostly a live request (see `_request`), sometimes a bad id
IDENTITY_COUNT = 3  # one more than the store's entries, so publishing replaces
UNKNOWN_IDENTITY = PrefixIdentity((99, 99, 99, 99))


class RequestNumber(int):
    """An int subclass, as an `IntEnum` member is: an id the integer rule admits."""

    def __repr__(self) -> str:
        return f"RequestNumber({int(self)})"


def integer_as(value: int, form: str) -> Any:
    """`value` passed in `form`: a plain int, an int subclass, or a numpy integer (as read back
    from an implementation's arrays) where that numpy type can hold it."""
    if form == "subclass":
        return RequestNumber(value)
    if form == "numpy" and -(2**63) <= value < 2**63:
        return np.int64(value)
    if form == "numpy unsigned" and 0 <= value < 2**64:
        return np.uint64(value)
    return value


def prefix_identity(index: int) -> PrefixIdentity:
    """The harness's prefix number `index`."""
    return PrefixIdentity((index + 1, 0, 0, 0))


def prefix_history(index: int, tokens: int) -> History:
    """The tokens prefix `index` holds: the content is fixed by the identity."""
    return tuple(100 + 10 * index + position for position in range(tokens))


@dataclass(slots=True)
class CampaignStats:
    """Counts a campaign reports."""

    examples: int = 0
    steps: int = 0
    invariant_checks: int = 0
    decoded_tokens: int = 0
    failed_operations: int = 0


Outcome = tuple[Any, BaseException | None]


class KvschedMachine(RuleBasedStateMachine):
    """Drives one system under test, in lockstep with the spec unless `reference` is None."""

    def __init__(
        self,
        factory: SystemFactory = spec_system,
        reference: SystemFactory | None = spec_system,
        config: SystemConfig | None = None,
        stats: CampaignStats | None = None,
    ) -> None:
        super().__init__()
        self.config = config or SystemConfig()
        self.sut = factory(self.config)
        self.ref = reference(self.config) if reference is not None else None
        self.ghost = GhostMemory(self.config.page_size)
        self.external: list[int] = []
        self.stats = stats
        self.failed = False  # a check failed: teardown must not bury that failure under its own
        if stats is not None:
            stats.examples += 1

    @initialize(pages=st.sampled_from([2, 1, 0]), keep=st.booleans(), last_page_holds=st.sampled_from([1, 0, 2]))
    def start_with_a_prefix(self, pages: int, keep: bool, last_page_holds: int) -> None:
        """Most programs start with a published prefix, so attach paths are exercised early;
        its last page may carry extra outside holds (a producer still writing it), which makes
        the pages' reference counts uneven."""
        for _ in range(pages):
            self.producer_allocate()
        if pages:
            self.publish(prefix=0, pages=pages, tokens=pages * self.config.page_size - 1)
        if not keep:
            for page in list(self.external):
                self.producer_hold(pick=-1 - page, retain=False)
        if pages:
            for _ in range(last_page_holds):
                self.hold_prefix_page(pick=pages - 1)

    # -- the checked step ------------------------------------------------------------------

    def _step(self, description: str, operation: Callable[[SystemUnderTest, str], Any]) -> Outcome:
        try:
            return self._checked_step(description, operation)
        except AssertionError:
            self.failed = True
            raise

    def _checked_step(self, description: str, operation: Callable[[SystemUnderTest, str], Any]) -> Outcome:
        if currently_in_test_context():
            note(f"# {description}")
        if self.stats is not None:
            self.stats.steps += 1
        before = self.sut.snapshot()
        outcome = _attempt(operation, self.sut, "sut")
        result, error = outcome
        if error is not None and not isinstance(error, KvschedError):
            raise AssertionError(f"{description} raised an untyped {type(error).__name__}: {error}") from error
        if error is not None:
            if self.stats is not None:
                self.stats.failed_operations += 1
            unchanged = post_failure_changes_nothing(SystemState(*before), SystemState(*self.sut.snapshot()))
            assert unchanged, f"{description} raised {type(error).__name__} but changed state"
        else:
            after = SystemState(*self.sut.snapshot())
            assert post_lifo_reuse(SystemState(*before), after), (
                f"{description}: a page left the free stack out of order"
            )
        if self.ref is not None:
            ref_result, ref_error = _attempt(operation, self.ref, "ref")
            assert type(error) is type(ref_error), (
                f"{description}: system raised {type(error).__name__}, spec raised {type(ref_error).__name__}"
            )
            if error is None:
                assert result == ref_result, f"{description}: system returned {result!r}, spec {ref_result!r}"
            else:
                assert ref_error is not None
                mine, spec = error.details(), ref_error.details()
                assert mine == spec, f"{description}: {type(error).__name__} tells {mine}, the spec's {spec}"
            assert self.sut.snapshot() == self.ref.snapshot(), f"{description}: states diverge from the spec"
        return outcome

    def _slot(self, request_id: int) -> Slot | None:
        for slot in self.sut.snapshot()[2].slots:
            if is_live(slot) and slot.request_id == request_id:
                return slot
        return None

    def has_live_request(self) -> bool:
        """Some slot holds a request (the rules that need one wait for it)."""
        return any(is_live(slot) for slot in self.sut.snapshot()[2].slots)

    def _request(self, pick: int) -> int:
        """A live request for picks 0..6 (when any is live), else an unknown or invalid id."""
        live = sorted(slot.request_id for slot in self.sut.snapshot()[2].slots if is_live(slot))
        if live and pick <= 6:
            return live[pick % len(live)]
        return (2**64, -1, 5, 4, 3, 2, 1, 0, 9, 7)[pick]

    def _page(self, pick: int) -> int:
        """A held page for picks 0..5 (when any is held), else any id, in range or not."""
        held = [page for page, count in enumerate(self.sut.snapshot()[0].refs) if count > 0]
        if held and pick <= 5:
            return held[pick % len(held)]
        return (-1, 0, 1, 2, 3, 4, 5, 6, 7, self.config.physical_pages)[pick]

    def _ref_count(self, page: int) -> int | None:
        refs = self.sut.snapshot()[0].refs
        return refs[page] if 0 <= page < len(refs) else None

    # -- requests ---------------------------------------------------------------------------

    @rule(request_id=NEW_IDS, prefix=st.integers(-1, IDENTITY_COUNT), form=FORMS)
    def admit(self, request_id: int, prefix: int, form: str = "int") -> None:
        identity = None if prefix < 0 else UNKNOWN_IDENTITY if prefix == IDENTITY_COUNT else prefix_identity(prefix)
        passed = integer_as(request_id, form)
        result, error = self._step(
            f"admit_with_prefix({passed!r}, {identity!r})",
            lambda s, _: s.scheduler.admit_with_prefix(passed, identity, s.store, s.pool),
        )
        if error is None:
            self.ghost.histories[request_id] = prefix_history(prefix, result.prefix_tokens) if result.prefix_hit else ()

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS, child=NEW_IDS, form=FORMS)
    def fork(self, pick: int, child: int, form: str) -> None:
        parent, passed = integer_as(self._request(pick), form), integer_as(child, form)
        _, error = self._step(f"fork({parent!r}, {passed!r})", lambda s, _: s.scheduler.fork(parent, passed, s.pool))
        if error is None:
            self.ghost.histories[child] = self.ghost.histories.get(parent, ())

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS, logical_page=st.integers(-1, 3), form=FORMS)
    def ensure_writable(self, pick: int, logical_page: int, form: str) -> None:
        self._ensure_writable(self._request(pick), logical_page, form)

    def _ensure_writable(self, request_id: int, logical_page: int, form: str = "int") -> BaseException | None:
        passed, page = integer_as(request_id, form), integer_as(logical_page, form)
        action, error = self._step(
            f"ensure_writable({passed!r}, {page!r})",
            lambda s, _: s.scheduler.ensure_writable(passed, page, s.pool),
        )
        if error is None:
            if isinstance(action, Copy):
                self.ghost.copy_page(action.source, action.destination)
            state = SystemState(*self.sut.snapshot(), tuple(sorted(self.external)))
            assert post_written_page_exclusive(state, request_id, logical_page), (
                f"ensure_writable({request_id}, {logical_page}) left the written page shared"
            )
        return error

    @precondition(lambda self: self.has_live_request())
    @rule(picks=st.lists(PICKS, max_size=3), logical_pages=st.lists(st.integers(-1, 3), max_size=3), form=FORMS)
    def ensure_writable_batch(self, picks: list[int], logical_pages: list[int], form: str) -> None:
        ids = [integer_as(self._request(pick), form) for pick in picks]
        pages = [integer_as(page, form) for page in logical_pages]
        self._apply_plan(
            f"ensure_writable_batch({ids!r}, {pages!r})",
            lambda s, _: s.scheduler.ensure_writable_batch(ids, pages, s.pool),
        )

    @precondition(lambda self: self.has_live_request())
    @rule(page_size=st.sampled_from([0, 2, 2, 2, 1]))
    def prepare_decode_round(self, page_size: int) -> None:
        """The engine's batched form of making room for every decoding request's next token."""
        page_size = page_size and self.config.page_size
        plan = self._apply_plan(
            f"prepare_decode_round(page_size={page_size})",
            lambda s, _: s.scheduler.prepare_decode_round(s.pool, page_size),
        )
        if plan is not None:
            state = SystemState(*self.sut.snapshot(), tuple(sorted(self.external)))
            for slot in state.scheduler.slots:
                if slot.state is RequestState.DECODE:
                    logical = slot.token_count // page_size
                    assert post_written_page_exclusive(state, slot.request_id, logical), "prepared page shared"

    def _apply_plan(self, description: str, operation: Callable[[SystemUnderTest, str], Any]) -> Any:
        plan, error = self._step(description, operation)
        if error is not None:
            return None
        for action in plan:
            if isinstance(action, Copy):
                self.ghost.copy_page(action.source, action.destination)
        return plan

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS, token=st.integers(0, 49))
    def write_token(self, pick: int, token: int) -> None:
        """The engine's prefill write: make the next position's page writable, write, count."""
        request_id = self._request(pick)
        slot = self._slot(request_id)
        if slot is None:
            self._step(f"record_token({request_id})", lambda s, _: s.scheduler.record_token(request_id))
            return
        position = slot.token_count
        if self._ensure_writable(request_id, position // self.config.page_size) is not None:
            return
        page = self.sut.snapshot()[2].slots[self._slot_index(request_id)].table[position // self.config.page_size]
        assert page is not None
        history = self.ghost.histories.get(request_id, ())[:position] + (token,)
        self.ghost.write(page, position, history)
        _, error = self._step(f"record_token({request_id})", lambda s, _: s.scheduler.record_token(request_id))
        assert error is None, f"record_token failed on a live request: {error!r}"
        self.ghost.histories[request_id] = history

    def _slot_index(self, request_id: int) -> int:
        slots = self.sut.snapshot()[2].slots
        return next(i for i, slot in enumerate(slots) if is_live(slot) and slot.request_id == request_id)

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS)
    def record_token(self, pick: int) -> None:
        """A token counted without a write the harness knows of (its slot is never checked)."""
        request_id = self._request(pick)
        _, error = self._step(f"record_token({request_id})", lambda s, _: s.scheduler.record_token(request_id))
        if error is None:
            self.ghost.histories[request_id] = self.ghost.histories.get(request_id, ()) + (None,)

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS, tokens=st.sampled_from([0, 1, 2, 3, 2**32 - 1, 2**32, -1]), form=FORMS)
    def record_tokens(self, pick: int, tokens: int, form: str) -> None:
        """A prefill chunk counted in one call (its writes unknown to the harness, as above)."""
        request_id = self._request(pick)
        passed = integer_as(tokens, form)
        _, error = self._step(
            f"record_tokens({request_id}, {passed!r})", lambda s, _: s.scheduler.record_tokens(request_id, passed)
        )
        if error is None:  # positions past the table never hold a page: the history stops there
            capacity = self.config.logical_pages * self.config.page_size + 1
            history = self.ghost.histories.get(request_id, ())
            self.ghost.histories[request_id] = history + (None,) * min(tokens, max(capacity - len(history), 0))

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS)
    def mark_prefill_complete(self, pick: int) -> None:
        request_id = self._request(pick)
        self._step(f"mark_prefill_complete({request_id})", lambda s, _: s.scheduler.mark_prefill_complete(request_id))

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS, token=st.integers(0, 49))
    def start_decoding(self, pick: int, token: int) -> None:
        """The engine after a prefill: seed the first sampled token, then move to decode."""
        request_id = self._request(pick)
        self._step(
            f"seed_decode_token({request_id}, {token})", lambda s, _: s.scheduler.seed_decode_token(request_id, token)
        )
        slot = self._slot(request_id)
        if slot is not None and slot.state is RequestState.PREFILL:
            self._step(
                f"mark_prefill_complete({request_id})", lambda s, _: s.scheduler.mark_prefill_complete(request_id)
            )

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS, token=st.sampled_from([-1, 0, 3, 3, 7, 7, 2**32 - 1, 2**32]))
    def seed_decode_token(self, pick: int, token: int) -> None:
        request_id = self._request(pick)
        self._step(
            f"seed_decode_token({request_id}, {token})",
            lambda s, _: s.scheduler.seed_decode_token(request_id, token),
        )

    @precondition(lambda self: self.has_live_request())
    @rule(token=st.integers(0, 49))
    def engine_round(self, token: int) -> None:
        """The engine's common step: every request whose prefill is done (it wrote a token)
        gets its first sampled token and moves to decode, then one well-behaved round runs."""
        for slot in self.sut.snapshot()[2].slots:
            prefilled = slot.state is RequestState.PREFILL and slot.token_count > 0
            unseeded = slot.state is RequestState.DECODE and not slot.token_ready
            if prefilled or unseeded:
                self.start_decoding(pick=self._live_pick(slot.request_id), token=token)
        self.decode_round("none", "none")

    def _live_pick(self, request_id: int) -> int:
        live = sorted(slot.request_id for slot in self.sut.snapshot()[2].slots if is_live(slot))
        return live.index(request_id)

    @rule(fault=st.sampled_from(FAULTS), short=st.sampled_from(["none", "none", "items", "tables", "outputs"]))
    def decode_round(self, fault: str, short: str) -> None:
        """The engine's round: make every decoding request's next page writable, then decode.

        An engine that cannot make room for every request (the pool is exhausted) does not
        decode: it would write a page another request still reads (it preempts a request first).
        """
        for slot in self.sut.snapshot()[2].slots:
            logical = slot.token_count // self.config.page_size
            growing = slot.state is RequestState.DECODE and logical < self.config.logical_pages
            if growing and self._ensure_writable(slot.request_id, logical) is not None:
                return
        decoding = sum(1 for slot in self.sut.snapshot()[2].slots if slot.state is RequestState.DECODE)
        width = self.config.logical_pages
        items = decoding - (short == "items")
        tables = decoding * width - (short == "tables")
        outputs = decoding - (short == "outputs")
        backends: dict[str, HarnessBackend] = {}

        def run(system: SystemUnderTest, role: str) -> Any:
            backend = HarnessBackend(fault, self.config.page_size, self.ghost if role == "sut" else None)
            backends[role] = backend
            scratch = system.scratch(max(items, 0), max(tables, 0), max(outputs, 0))
            return system.scheduler.execute_decode_round(backend, *scratch)

        _, error = self._step(f"execute_decode_round(HarnessBackend({fault!r}), short={short!r})", run)
        if "ref" in backends:
            assert backends["sut"].seen == backends["ref"].seen, "the backends saw different batches"
        if error is None and backends["sut"].seen is not None:
            if self.stats is not None:
                self.stats.decoded_tokens += len(backends["sut"].seen[0])
            for request_id, _, token, position, *_ in backends["sut"].seen[0]:
                history = self.ghost.histories.get(request_id, ())
                self.ghost.histories[request_id] = history[:position] + (token,)

    @precondition(lambda self: self.has_live_request())
    @rule(fault=st.sampled_from(["none", "none", "corrupt_identity"]))
    def decode_without_making_room(self, fault: str) -> None:
        """A round the caller did not prepare: it must refuse, or write only pages its requests
        hold alone (the page holding each one's position `token_count`)."""
        pool, _, scheduler = self.sut.snapshot()
        targets = {
            slot.request_id: slot.table[slot.token_count // self.config.page_size]
            for slot in scheduler.slots
            if slot.state is RequestState.DECODE and slot.token_count // self.config.page_size < len(slot.table)
        }
        decoding = sum(1 for slot in scheduler.slots if slot.state is RequestState.DECODE)
        seen: dict[str, Any] = {}

        def run(system: SystemUnderTest, role: str) -> Any:
            backend = HarnessBackend(fault, self.config.page_size, self.ghost if role == "sut" else None)
            receipt = system.scheduler.execute_decode_round(
                backend, *system.scratch(decoding, decoding * self.config.logical_pages, decoding)
            )
            seen[role] = backend.seen
            return receipt

        _, error = self._step(f"execute_decode_round(HarnessBackend({fault!r})) without make-room", run)
        if error is None and seen.get("sut") is not None:
            for request_id, _, token, position, *_ in seen["sut"][0]:
                page = targets.get(request_id)
                assert page is not None and pool.refs[page] == 1, (
                    f"a round wrote request {request_id}'s token into page {page}, which it does not hold alone"
                )
                history = self.ghost.histories.get(request_id, ())
                self.ghost.histories[request_id] = history[:position] + (token,)

    @precondition(lambda self: self.has_live_request() and hasattr(self.sut, "overlapping_scratch"))
    @rule()
    def decode_with_overlapping_scratch(self) -> None:
        """Round buffers that share memory (one allocation carved into two): the round must refuse
        them and change nothing, or the backend reads tables the outputs overwrote."""
        scheduler = self.sut.snapshot()[2]
        decoding = max(1, sum(1 for slot in scheduler.slots if slot.state is RequestState.DECODE))
        width = self.config.logical_pages

        def run(system: SystemUnderTest, _: str) -> Any:
            backend = HarnessBackend("none", self.config.page_size, None)
            scratch = system.overlapping_scratch(decoding, decoding * width, decoding)  # type: ignore[attr-defined]
            return system.scheduler.execute_decode_round(backend, *scratch)

        _, error = self._step("execute_decode_round(HarnessBackend('none')) with overlapping scratch", run)
        assert error is not None, "a round ran on scratch buffers that share memory"

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS, call=st.sampled_from(["finish", "ensure_writable"]))
    def use_another_pool(self, pick: int, call: str) -> None:
        """Hand the scheduler a pool it is not bound to: it must refuse and change nothing."""
        request_id = self._request(pick)

        def run(system: SystemUnderTest, _: str) -> Any:
            other = type(system.pool)(self.config.physical_pages, max_references=self.config.max_references)
            for _page in range(self.config.physical_pages):
                other.allocate()  # every page held there too, so a release in it would succeed
            if call == "finish":
                return system.scheduler.finish(request_id, other)
            return system.scheduler.ensure_writable(request_id, 0, other)

        self._step(f"scheduler.{call}({request_id}, <another pool>)", run)

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS, form=FORMS)
    def finish(self, pick: int, form: str = "int") -> None:
        request_id = self._request(pick)
        passed = integer_as(request_id, form)
        _, error = self._step(f"finish({passed!r})", lambda s, _: s.scheduler.finish(passed, s.pool))
        if error is None:
            self.ghost.histories.pop(request_id, None)

    # -- the producer: an external page holder that publishes prefixes --------------------

    @precondition(lambda self: len(self.external) < 4)
    @rule()
    def producer_allocate(self) -> None:
        page, error = self._step("pool.allocate()", lambda s, _: s.pool.allocate())
        if error is None:
            self.external.append(page)

    @rule(pick=st.integers(0, 9), retain=st.booleans())
    def producer_hold(self, pick: int, retain: bool) -> None:
        """Take one more reference on a page, or drop one of the producer's own."""
        page = -1 - pick if pick < 0 else self._page(pick)  # a negative pick names page -1 - pick
        if retain:
            _, error = self._step(f"pool.retain({page})", lambda s, _: s.pool.retain(page))
            if error is None:
                self.external.append(page)
            return
        if page not in self.external and self._ref_count(page) not in (0, None):
            return  # someone else's reference: the producer may not drop it
        _, error = self._step(f"pool.release({page})", lambda s, _: s.pool.release(page))
        if error is None:
            self.external.remove(page)

    @rule(pick=st.integers(0, 3))
    def hold_prefix_page(self, pick: int) -> None:
        """An external holder (an offload copy in flight, say) takes a reference on a prefix page."""
        pages = sorted({p for entry in self.sut.snapshot()[1].entries if entry for p in entry.page_set.pages})
        if pages:
            self.producer_hold(pick=-1 - pages[pick % len(pages)], retain=True)

    @rule(prefix=st.integers(0, IDENTITY_COUNT - 1), pages=st.integers(1, 3), tokens=st.integers(1, 6))
    def publish(self, prefix: int, pages: int, tokens: int) -> None:
        """Write a prefix into pages the producer alone holds, then publish them."""
        own = sorted({page for page in self.external if self._ref_count(page) == 1})
        chosen = own[:pages]
        if len(chosen) < pages:
            free = [page for page, count in enumerate(self.sut.snapshot()[0].refs) if count == 0]
            chosen += free[: pages - len(chosen)]  # a free page in the set: publish must refuse it
        if len(chosen) < pages:
            return
        token_count = min(tokens, len(chosen) * self.config.page_size)
        history = prefix_history(prefix, token_count)
        for position in range(token_count):
            page = chosen[position // self.config.page_size]
            if page in own:
                self.ghost.write(page, position, history[: position + 1])
        page_set = PrefixPageSet(prefix_identity(prefix), tuple(chosen), token_count)
        self._step(f"store.publish({page_set!r})", lambda s, _: s.store.publish(page_set, s.pool))

    @rule(prefix=st.integers(0, IDENTITY_COUNT))
    def remove(self, prefix: int) -> None:
        identity = UNKNOWN_IDENTITY if prefix == IDENTITY_COUNT else prefix_identity(prefix)
        self._step(f"store.remove({identity!r})", lambda s, _: s.store.remove(identity, s.pool))

    @rule(pages=st.integers(-1, 7))
    def reclaim(self, pages: int) -> None:
        self._step(f"store.reclaim({pages})", lambda s, _: s.store.reclaim(s.pool, pages))

    @rule(prefix=st.integers(0, IDENTITY_COUNT), page=st.integers(-1, 7), size=st.integers(0, 4))
    def query(self, prefix: int, page: int, size: int) -> None:
        """Every read-only operation at once; they must agree and change nothing."""
        identity = prefix_identity(prefix)

        def read(system: SystemUnderTest, _: str) -> tuple[Any, ...]:
            views = [RequestView(0, 0, RequestState.EMPTY, 0, 0)] * size
            return (
                system.store.get(identity),
                system.pool.ref_count(page),
                system.pool.free_count(),
                system.scheduler.active_count(),
                system.scheduler.runnable_into(views),
                views,
            )

        before = self.sut.snapshot()
        self._step(f"queries({identity!r}, page={page}, views={size})", read)
        assert self.sut.snapshot() == before, "a read-only operation changed state"

    # -- checks after every step ------------------------------------------------------------

    @invariant()
    def check_system_invariants(self) -> None:
        state = SystemState(*self.sut.snapshot(), tuple(sorted(self.external)))
        broken = check_invariants(state)
        mismatches = self.ghost.mismatches(state.scheduler)
        self.failed = bool(broken or mismatches)
        assert not broken, f"invariants violated: {', '.join(broken)}"
        assert not mismatches, "wrong KV read: " + "; ".join(mismatches[:3])
        if self.stats is not None:
            self.stats.invariant_checks += len(INVARIANTS) + 1

    def teardown(self) -> None:
        """Liveness: finish everything, remove every prefix, drop own holds; all pages free."""
        if self.failed:
            return
        try:
            live = [slot.request_id for slot in self.sut.snapshot()[2].slots if is_live(slot)]
            for request_id in live:
                self.sut.scheduler.finish(request_id, self.sut.pool)
            for prefix in range(IDENTITY_COUNT):
                self.sut.store.remove(prefix_identity(prefix), self.sut.pool)
            for page in self.external:
                self.sut.pool.release(page)
        except KvschedError as error:
            raise AssertionError(f"cleanup at teardown failed: {type(error).__name__}: {error}") from error
        drained = SystemState(*self.sut.snapshot())
        held = len(drained.pool.refs) - len(drained.pool.free)
        assert post_drained_all_free(drained), f"leak: {held} pages still held"


def _attempt(operation: Callable[[SystemUnderTest, str], Any], system: SystemUnderTest, role: str) -> Outcome:
    try:
        return operation(system, role), None
    except Exception as error:  # every error is compared, typed or not
        return None, error
