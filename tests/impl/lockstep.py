"""Spec and impl in lockstep: every operation, valid or not, applied to both systems.

After every rule the two abstract states must be equal (`to_spec` of impl == spec state), every
call must return equal values or raise the same exception type with the same message, and both
systems must satisfy the representation invariants and (unless ownership is deliberately broken)
every spec invariant. Rules draw from the valid domains; `call_out_of_domain` tries every
out-of-domain value in every argument position. `OwnershipAbuse` lets callers release and write
pages they do not own, which drives the rollback paths; there only lockstep equality is checked.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from typing import Any

from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvsched.impl import ImplSystem, make_impl_system
from kvsched.impl.refinement import check_representation
from kvsched.spec import PrefixIdentity, PrefixPageSet, RequestView, derive_prefix_identity
from kvsched.spec.batch import U32_MAX, RaggedBatchItem, RaggedBatchOutput
from kvsched.spec.invariants import check_invariants
from kvsched.spec.pool import Allocated, Copy
from kvsched.spec.slots import LIVE, RequestState
from tests.impl.support import FAULTS, FaultBackend, Outcome, SpecSystem, make_spec_system, outcome, records

IDENTITIES = (
    PrefixIdentity((1, 2, 3, 4)),
    derive_prefix_identity(7, 1, 2, 3, [(1, 2, 3, 4, 5, 6)]),
    derive_prefix_identity(7, 1, 2, 3, [(1, 2, 3, 4, 5, 6)], tenant_salt=9),
)
any_request_ids = st.integers(0, 4)
identities = st.none() | st.sampled_from(IDENTITIES)
logical = st.integers(-1, 4)
tokens = st.integers(0, 40) | st.just(U32_MAX)
VIEW = RequestView(0, 0, RequestState.EMPTY, 0, 0)

# Out-of-domain values, and every operation with one argument position to put them in.
BAD_VALUES: tuple[object, ...] = (-1, 2**32, 2**64, True, "7", 1.5, None, IDENTITIES[0])
OUT_OF_DOMAIN: dict[str, Callable[[Any, object], object]] = {
    "retain": lambda s, v: s.pool.retain(v),
    "release": lambda s, v: s.pool.release(v),
    "writable": lambda s, v: s.pool.writable(v) if v is not None else None,
    "ref_count": lambda s, v: s.pool.ref_count(v),
    "pool": lambda s, v: type(s.pool)(v),
    "pool_max_references": lambda s, v: type(s.pool)(2, max_references=v),
    "new_table": lambda s, v: s.new_table(v) and None,
    "table_ensure_writable": lambda s, v: s.tables and s.tables[0].ensure_writable(v, s.pool),
    "table_get": lambda s, v: s.tables and s.tables[0].get(v),
    "table_install": lambda s, v: s.tables and s.tables[0].install_shared_prefix([v], s.pool),
    "store": lambda s, v: type(s.store)(v, 1) and None,
    "store_pages": lambda s, v: type(s.store)(1, v) and None,
    "publish": lambda s, v: s.store.publish(v, s.pool),
    "remove": lambda s, v: s.store.remove(v, s.pool),
    "get": lambda s, v: s.store.get(v),
    "attach": lambda s, v: s.tables and s.store.attach(v, s.tables[0], s.pool),
    "reclaim": lambda s, v: s.store.reclaim(s.pool, v),
    "scheduler": lambda s, v: type(s.scheduler)(v, 1) and None,
    "scheduler_pages": lambda s, v: type(s.scheduler)(1, v) and None,
    "admit": lambda s, v: s.scheduler.admit_with_prefix(v, None, s.store, s.pool),
    "admit_identity": lambda s, v: s.scheduler.admit_with_prefix(0, v, s.store, s.pool),
    "fork_parent": lambda s, v: s.scheduler.fork(v, 0, s.pool),
    "fork_child": lambda s, v: s.scheduler.fork(0, v, s.pool),
    "ensure_writable": lambda s, v: s.scheduler.ensure_writable(v, 0, s.pool),
    "ensure_writable_page": lambda s, v: s.scheduler.ensure_writable(0, v, s.pool),
    "mark_prefill_complete": lambda s, v: s.scheduler.mark_prefill_complete(v),
    "seed_decode_token": lambda s, v: s.scheduler.seed_decode_token(v, 0),
    "seed_decode_token_token": lambda s, v: s.scheduler.seed_decode_token(0, v),
    "record_token": lambda s, v: s.scheduler.record_token(v),
    "page_table": lambda s, v: s.scheduler.page_table(v),
    "finish": lambda s, v: s.scheduler.finish(v, s.pool),
}


def publish_set(system: Any, page_set: PrefixPageSet) -> object:
    """`publish` on the system's store."""
    return system.store.publish(page_set, system.pool)


def ensure_page(system: Any, request_id: int, page: int) -> object:
    """`ensure_writable` on one of the system's requests."""
    return system.scheduler.ensure_writable(request_id, page, system.pool)


class Lockstep(RuleBasedStateMachine):
    """Drive a spec system and an impl system with the same calls and compare everything."""

    check_spec_invariants = True

    def __init__(self) -> None:
        super().__init__()
        self.spec: SpecSystem = make_spec_system(1, 1, 0, 0, 1)
        self.impl: ImplSystem = make_impl_system(1, 1, 0, 0, 1)
        self.external: list[int] = []  # one entry per reference the test itself holds

    @initialize(
        requests=st.integers(1, 4),
        logical_pages=st.integers(1, 4),
        physical_pages=st.integers(0, 10),
        store_entries=st.integers(0, 3),
        store_pages=st.integers(1, 3),
        max_references=st.sampled_from([2, 3, U32_MAX]),
    )
    def build(
        self,
        requests: int,
        logical_pages: int,
        physical_pages: int,
        store_entries: int,
        store_pages: int,
        max_references: int,
    ) -> None:
        sizes = (requests, logical_pages, physical_pages, store_entries, store_pages, max_references)
        note(f"make_system{sizes}")
        self.spec = make_spec_system(*sizes)
        self.impl = make_impl_system(*sizes)

    def both(self, call: Callable[[Any], object], *, compare_values: bool = True) -> Outcome:
        """Apply `call` to both systems; equal outcomes or the test fails."""
        expected, actual = outcome(lambda: call(self.spec)), outcome(lambda: call(self.impl))
        self.record(sys._getframe(1).f_code.co_name, expected)
        assert (actual.error, actual.message, actual.details) == (expected.error, expected.message, expected.details), (
            expected,
            actual,
        )
        if compare_values:
            assert actual.value == expected.value, (expected, actual)
        return expected

    def record(self, name: str, result: Outcome) -> None:
        note(f"{name} -> {result}")
        event(f"{name}: {result.error.__name__ if result.error else 'ok'}")

    def live_request_ids(self) -> st.SearchStrategy[int]:
        """Mostly live requests, sometimes any id (so unknown ones too)."""
        live = sorted(slot.request_id for slot in self.spec.scheduler.state.slots if slot.state in LIVE)
        return st.sampled_from(live) | st.sampled_from(live) | any_request_ids if live else any_request_ids

    def prefix_identities(self) -> st.SearchStrategy[PrefixIdentity | None]:
        """Mostly published identities (prefix hits), sometimes any identity or None."""
        published = sorted(
            (entry.page_set.identity for entry in self.spec.store.state.entries if entry is not None),
            key=lambda identity: identity.words,
        )
        return st.sampled_from(published) | st.sampled_from(published) | identities if published else identities

    def pages(self) -> st.SearchStrategy[int]:
        return st.integers(-1, self.spec.pool.physical_pages)

    def held(self, page: object) -> bool:
        return isinstance(page, int) and not isinstance(page, bool) and bool(self.spec.pool.ref_count(page))

    def owned(self, page: object) -> bool:
        """Calling `release`/`writable` on `page` keeps the ownership model intact."""
        return not self.check_spec_invariants or not self.held(page) or page in self.external

    # ---- the pool, as an external holder ------------------------------------------------------

    @rule()
    def allocate(self) -> None:
        result = self.both(lambda system: system.pool.allocate())
        if result.error is None:
            assert isinstance(result.value, int)
            self.external.append(result.value)

    @rule(data=st.data())
    def retain(self, data: st.DataObject) -> None:
        page = data.draw(self.pages())
        if self.both(lambda system: system.pool.retain(page)).error is None:
            self.external.append(page)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        choices = self.pages() | st.sampled_from(sorted(self.external)) if self.external else self.pages()
        page = data.draw(choices)
        released = self.owned(page) and self.both(lambda system: system.pool.release(page)).error is None
        if released and page in self.external:
            self.external.remove(page)

    @rule(data=st.data())
    def writable(self, data: st.DataObject) -> None:
        mine: st.SearchStrategy[int | None] = st.sampled_from(sorted(self.external)) if self.external else st.none()
        current = data.draw(st.none() | mine | self.pages())
        if not self.owned(current):
            return
        result = self.both(lambda system: system.pool.writable(current))
        if isinstance(result.value, Allocated):
            self.external.append(result.value.page)
        if isinstance(result.value, Copy) and result.value.source in self.external:
            self.external.remove(result.value.source)
            self.external.append(result.value.destination)

    @rule(data=st.data())
    def inspect_pool(self, data: st.DataObject) -> None:
        page = data.draw(self.pages())
        self.both(lambda system: (system.pool.ref_count(page), system.pool.free_count(), system.pool.physical_pages))

    # ---- standalone tables --------------------------------------------------------------------

    @rule(width=st.integers(0, 4))
    def new_table(self, width: int) -> None:
        self.both(lambda system: system.new_table(width), compare_values=False)

    def table(self, data: st.DataObject) -> int:
        return data.draw(st.integers(0, len(self.spec.tables) - 1))

    @precondition(lambda self: self.spec.tables)
    @rule(data=st.data(), logical_page=logical)
    def table_ensure_writable(self, data: st.DataObject, logical_page: int) -> None:
        index = self.table(data)
        self.both(lambda system: system.tables[index].ensure_writable(logical_page, system.pool))

    @precondition(lambda self: self.spec.tables)
    @rule(data=st.data())
    def table_fork(self, data: st.DataObject) -> None:
        source, target = self.table(data), self.table(data)
        self.both(lambda system: system.tables[source].fork_into(system.tables[target], system.pool))

    @precondition(lambda self: self.spec.tables)
    @rule(data=st.data())
    def table_install(self, data: st.DataObject) -> None:
        index = self.table(data)
        pages = data.draw(st.lists(self.pages(), max_size=5, unique=True))
        self.both(lambda system: system.tables[index].install_shared_prefix(pages, system.pool))

    @precondition(lambda self: self.spec.tables)
    @rule(data=st.data())
    def table_release(self, data: st.DataObject) -> None:
        index = self.table(data)
        self.both(lambda system: system.tables[index].release_all(system.pool))

    @precondition(lambda self: self.spec.tables)
    @rule(data=st.data(), logical_page=logical)
    def table_read(self, data: st.DataObject, logical_page: int) -> None:
        index = self.table(data)
        self.both(lambda system: (system.tables[index].get(logical_page), system.tables[index].entries()))

    # ---- the prefix store ---------------------------------------------------------------------

    @rule(data=st.data(), identity=st.sampled_from(IDENTITIES), token_count=st.integers(1, 40))
    def publish(self, data: st.DataObject, identity: PrefixIdentity, token_count: int) -> None:
        held = [page for page in range(self.spec.pool.physical_pages) if self.held(page)]
        capacity = self.spec.store.state.page_capacity
        pages: list[int] = data.draw(st.lists(self.pages(), min_size=1, max_size=capacity + 1, unique=True))
        choose_held: int = data.draw(st.integers(0, 3))
        if held and choose_held:  # mostly a set the store can take
            pages = data.draw(st.lists(st.sampled_from(held), min_size=1, max_size=capacity, unique=True))
        page_set = PrefixPageSet(identity, tuple(pages), token_count)
        self.both(lambda system: system.store.publish(page_set, system.pool))

    @rule(token_count=st.integers(1, 40))
    def fill_store(self, token_count: int) -> None:
        """Publish every identity in turn on fresh pages: a small store replaces round-robin."""
        for identity in IDENTITIES:
            allocated = self.both(lambda system: system.pool.allocate())
            if allocated.error is not None:
                return
            page = allocated.value
            assert isinstance(page, int)
            self.external.append(page)
            self.both(partial(publish_set, page_set=PrefixPageSet(identity, (page,), token_count)))

    @rule(identity=identities)
    def remove(self, identity: PrefixIdentity | None) -> None:
        self.both(lambda system: system.store.remove(identity, system.pool))

    @precondition(lambda self: self.spec.tables)
    @rule(data=st.data())
    def attach(self, data: st.DataObject) -> None:
        index, identity = self.table(data), data.draw(self.prefix_identities())
        self.both(lambda system: system.store.attach(identity, system.tables[index], system.pool))

    @rule(identity=identities)
    def get(self, identity: PrefixIdentity | None) -> None:
        self.both(lambda system: system.store.get(identity))

    @rule(pages=st.integers(0, 12))
    def reclaim(self, pages: int) -> None:
        self.both(lambda system: system.store.reclaim(system.pool, pages))

    # ---- the request scheduler ----------------------------------------------------------------

    @rule(data=st.data(), request_id=any_request_ids)
    def admit(self, data: st.DataObject, request_id: int) -> None:
        identity = data.draw(self.prefix_identities())
        self.both(lambda system: system.scheduler.admit_with_prefix(request_id, identity, system.store, system.pool))

    @rule(data=st.data(), request_id=any_request_ids, prompt_pages=st.integers(0, 2), token=tokens)
    def start_decoding(self, data: st.DataObject, request_id: int, prompt_pages: int, token: int) -> None:
        """Admit, prefill `prompt_pages` pages (16 tokens each), complete and seed: a request
        ready for rounds. Every step is compared; it stops at the first refusal."""
        identity = data.draw(self.prefix_identities())
        admitted = self.both(
            lambda system: system.scheduler.admit_with_prefix(request_id, identity, system.store, system.pool)
        )
        if admitted.error is not None:
            return
        event(f"start_decoding: prefix hit {admitted.value.prefix_hit}")  # type: ignore[attr-defined]
        if not admitted.value.prefix_hit:  # type: ignore[attr-defined]
            for page in range(prompt_pages):
                self.both(partial(ensure_page, request_id=request_id, page=page))
                for _ in range(16):
                    self.both(lambda system: system.scheduler.record_token(request_id))
            self.both(lambda system: system.scheduler.mark_prefill_complete(request_id))
        self.both(lambda system: system.scheduler.seed_decode_token(request_id, token))

    @rule(data=st.data(), child=any_request_ids)
    def fork(self, data: st.DataObject, child: int) -> None:
        parent = data.draw(self.live_request_ids())
        self.both(lambda system: system.scheduler.fork(parent, child, system.pool))

    @rule(data=st.data(), logical_page=logical)
    def ensure_writable(self, data: st.DataObject, logical_page: int) -> None:
        request_id = data.draw(self.live_request_ids())
        self.both(lambda system: system.scheduler.ensure_writable(request_id, logical_page, system.pool))

    @rule(data=st.data())
    def mark_prefill_complete(self, data: st.DataObject) -> None:
        request_id = data.draw(self.live_request_ids())
        self.both(lambda system: system.scheduler.mark_prefill_complete(request_id))

    @rule(data=st.data(), token=tokens)
    def seed_decode_token(self, data: st.DataObject, token: int) -> None:
        request_id = data.draw(self.live_request_ids())
        self.both(lambda system: system.scheduler.seed_decode_token(request_id, token))

    @rule(data=st.data())
    def record_token(self, data: st.DataObject) -> None:
        request_id = data.draw(self.live_request_ids())
        self.both(lambda system: system.scheduler.record_token(request_id))

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        request_id = data.draw(self.live_request_ids())
        self.both(lambda system: system.scheduler.finish(request_id, system.pool))

    @rule(request_id=any_request_ids, length=st.integers(0, 5))
    def read_requests(self, request_id: int, length: int) -> None:
        self.both(lambda system: system.scheduler.page_table(request_id))

        def views(system: Any) -> tuple[int, list[RequestView], int]:
            out = [VIEW] * length
            return system.scheduler.runnable_into(out), out, system.scheduler.active_count()

        self.both(views)

    @rule(
        fault=st.sampled_from(FAULTS),
        position=st.integers(0, 3),
        short=st.sampled_from(["", "", "", "items", "tables", "outputs"]),
    )
    def decode_round(self, fault: str, position: int, short: str) -> None:
        decoding = sum(slot.state is RequestState.DECODE for slot in self.spec.scheduler.state.slots)
        width = self.spec.scheduler.logical_pages
        lengths = {"items": decoding + 1, "tables": (decoding + 1) * width, "outputs": decoding + 1}
        if short and decoding:
            lengths[short] = decoding - 1 if short != "tables" else decoding * width - 1
        backends = {"spec": FaultBackend(fault, position), "impl": FaultBackend(fault, position)}
        scratch: dict[str, tuple[Any, Any, Any]] = {}

        def run(system: Any) -> object:
            name = "spec" if system is self.spec else "impl"
            buffers = (
                system.new_item_scratch(lengths["items"]),
                system.new_table_scratch(lengths["tables"]),
                system.new_output_scratch(lengths["outputs"]),
            )
            scratch[name] = buffers
            return system.scheduler.execute_decode_round(backends[name], *buffers)

        result = self.both(run)
        event(f"decode_round with {decoding} decoding: {fault}")
        assert backends["spec"].calls == backends["impl"].calls <= 1
        assert backends["spec"].seen == backends["impl"].seen  # the backend saw the same batch
        expected, actual = scratch["spec"], scratch["impl"]
        assert records(actual[2], RaggedBatchOutput)[:decoding] == records(expected[2], RaggedBatchOutput)[:decoding]
        if result.error is None:  # on an error the spec may have lowered part of the batch
            assert records(actual[0], RaggedBatchItem)[:decoding] == records(expected[0], RaggedBatchItem)[:decoding]
            assert actual[1][: decoding * width].tolist() == list(expected[1][: decoding * width])

    @rule(page_size=st.integers(0, 5) | st.sampled_from([16, 32, 64]))
    def prepare_decode_round(self, page_size: int) -> None:
        expected = outcome(lambda: self.spec.scheduler.prepare_decode_round(self.spec.pool, page_size))
        actual = outcome(lambda: self.impl.scheduler.prepare_decode_round(self.impl.pool, page_size))
        self.compare_plans(expected, actual)

    @rule(data=st.data())
    def ensure_writable_batch(self, data: st.DataObject) -> None:
        pairs = data.draw(st.lists(st.tuples(self.live_request_ids(), logical), max_size=5))
        ids, pages = [pair[0] for pair in pairs], [pair[1] for pair in pairs]
        expected = outcome(lambda: self.spec.scheduler.ensure_writable_batch(ids, pages, self.spec.pool))
        actual = outcome(lambda: self.impl.scheduler.ensure_writable_batch(ids, pages, self.impl.pool))
        self.compare_plans(expected, actual)

    def compare_plans(self, expected: Outcome, actual: Outcome) -> None:
        self.record(sys._getframe(1).f_code.co_name, expected)
        assert (actual.error, actual.message, actual.details) == (expected.error, expected.message, expected.details), (
            expected,
            actual,
        )
        if expected.error is None:
            plan: Any = actual.value
            assert plan == expected.value
            copies = [(copy.source, copy.destination) for copy in plan.copies()]
            assert list(zip(plan.copy_sources.tolist(), plan.copy_destinations.tolist(), strict=True)) == copies

    @rule(operation=st.sampled_from(sorted(OUT_OF_DOMAIN)), value=st.sampled_from(BAD_VALUES))
    def call_out_of_domain(self, operation: str, value: object) -> None:
        call = OUT_OF_DOMAIN[operation]
        result = self.both(lambda system: call(system, value), compare_values=operation not in {"new_table"})
        event(f"out of domain {operation}: {result.error.__name__ if result.error else 'ok'}")

    # ---- after every rule ---------------------------------------------------------------------

    @invariant()
    def states_agree(self) -> None:
        assert self.impl.snapshot(self.external) == self.spec.snapshot(self.external)
        assert [table.to_spec() for table in self.impl.tables] == [table.state for table in self.spec.tables]

    @invariant()
    def invariants_hold(self) -> None:
        assert check_representation(self.impl.pool, self.impl.store, self.impl.scheduler) == ()
        if self.check_spec_invariants:
            assert check_invariants(self.spec.snapshot(self.external)) == ()
            assert self.impl.check(self.external) == ()


class OwnershipAbuse(Lockstep):
    """Lockstep where `release` and `writable` also take pages the caller does not own, so tables
    and store entries end up naming freed pages: the rollback paths of `finish`, `release_all`,
    `publish`, `remove` and the batched writes run, and must still match the spec exactly."""

    check_spec_invariants = False

    @rule(data=st.data())
    def release_from_an_owner(self, data: st.DataObject) -> None:
        """Drop a reference a table, a request or a store entry still counts on."""
        state = self.spec.snapshot()
        requests = [page for slot in state.scheduler.slots for page in slot.table if page is not None]
        others = [page for entry in state.store.entries if entry is not None for page in entry.page_set.pages]
        others += [page for table in self.spec.tables for page in table.state if page is not None]
        if requests or others:
            # mostly a request's page, so that finish's rollback runs
            page = data.draw(st.sampled_from(sorted(requests or others)) | st.sampled_from(sorted(others or requests)))
            self.both(lambda system: system.pool.release(page))

    @rule(data=st.data())
    def free_an_owner_with_a_stolen_page(self, data: st.DataObject) -> None:
        """Free the last page a request, table or store entry maps behind its back, then have the
        owner release everything (or republish the entry): its earlier pages drop to zero
        (pushed) before the stolen one fails, so the whole release must be undone in order."""
        state = self.spec.snapshot()
        owners: list[tuple[str, object, int]] = []
        first_pages: dict[object, int] = {}
        for slot in state.scheduler.slots:
            if slot.state in LIVE and any(page is not None for page in slot.table):
                owners.append(("request", slot.request_id, [p for p in slot.table if p is not None][-1]))
        for index, table in enumerate(self.spec.tables):
            if any(page is not None for page in table.state):
                owners.append(("table", index, [p for p in table.state if p is not None][-1]))
        for entry in state.store.entries:
            if entry is not None:
                owners.append(("entry", entry.page_set.identity, entry.page_set.pages[-1]))
                first_pages[entry.page_set.identity] = entry.page_set.pages[0]
        if not owners:
            return
        kind, owner, page = data.draw(st.sampled_from(owners))
        for _ in range(self.spec.pool.ref_count(page) or 0):  # every reference: the page is free
            self.both(lambda system: system.pool.release(page))
        # republished on its first page (still held when the set has more than one page)
        replacement = PrefixPageSet(owner, (first_pages[owner],), 1) if isinstance(owner, PrefixIdentity) else None
        frees: dict[str, Callable[[Any], object]] = {
            "request": lambda system: system.scheduler.finish(owner, system.pool),
            "table": lambda system: system.tables[owner].release_all(system.pool),
            "entry": lambda system: system.store.remove(owner, system.pool),
            "replaced entry": lambda system: system.store.publish(replacement, system.pool),
        }
        if kind == "entry" and data.draw(st.booleans()):
            kind = "replaced entry"  # publishing over it releases the old set after the retains
        self.both(frees[kind])
