"""Seed A's example tests with their exact expected values, run on the spec and on impl alike.

Every ordering the spec defines (page hand-out order, LIFO reuse, round-robin victims, LRU
eviction, lowest empty slot, slot order of views and round items) is pinned here for impl.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvsched.spec import (
    Admission,
    Allocated,
    BackendFailed,
    Copy,
    DoubleRelease,
    DuplicateRequest,
    Exhausted,
    Existing,
    Full,
    InvalidArgument,
    InvalidBlock,
    InvalidConfig,
    InvalidState,
    OutOfRange,
    OutputIdentityMismatch,
    PageCapacity,
    PrefixIdentity,
    PrefixPageSet,
    RaggedBatchItem,
    RaggedBatchReceipt,
    ReferenceOverflow,
    RegistryFull,
    RequestState,
    RequestView,
    TargetNotEmpty,
)
from kvsched.spec.batch import INVALID_BLOCK
from kvsched.spec.events import Fault
from kvsched.testing.backends import HarnessBackend
from tests.impl.support import Flavor, records

IDENTITY = PrefixIdentity((1, 2, 3, 4))
OTHER = PrefixIdentity((5, 6, 7, 8))
EMPTY_VIEW = RequestView(0, 0, RequestState.EMPTY, 0, 0)


def test_fresh_pool_hands_out_pages_in_order_and_reuses_lifo(kv: Flavor) -> None:
    pool = kv.module.BlockPool(4)
    assert [pool.allocate() for _ in range(3)] == [0, 1, 2]
    pool.release(1)
    pool.release(0)
    assert [pool.allocate(), pool.allocate(), pool.allocate()] == [0, 1, 3]
    with pytest.raises(Exhausted, match="no free page: all 4 pages are held"):
        pool.allocate()


def test_fork_and_partial_page_write_use_copy_on_write(kv: Flavor) -> None:
    pool = kv.module.BlockPool(8)
    parent, child = kv.module.SequenceBlockTable(4), kv.module.SequenceBlockTable(4)
    assert parent.ensure_writable(0, pool) == Allocated(0)
    parent.fork_into(child, pool)
    assert pool.ref_count(0) == 2
    assert child.ensure_writable(0, pool) == Copy(0, 1)
    assert (parent.get(0), child.get(0), pool.ref_count(0)) == (0, 1, 1)
    assert parent.ensure_writable(0, pool) == Existing(0)
    assert child.entries() == (1, None, None, None)


def test_release_is_bounded_and_detects_double_release(kv: Flavor) -> None:
    pool = kv.module.BlockPool(2)
    page = pool.allocate()
    pool.release(page)
    with pytest.raises(DoubleRelease, match="page 0 is already free"):
        pool.release(page)
    with pytest.raises(InvalidBlock, match="page 2 is out of range for a pool of 2 pages"):
        pool.release(2)
    with pytest.raises(InvalidBlock, match="only a held page can be retained"):
        pool.retain(page)
    assert pool.free_count() == 2
    assert (pool.ref_count(5), pool.ref_count(True), pool.ref_count(1)) == (None, None, 0)


def test_shared_prefix_installs_with_refcounts_all_or_nothing(kv: Flavor) -> None:
    pool = kv.module.BlockPool(8)
    prefix = [pool.allocate(), pool.allocate()]
    table = kv.module.SequenceBlockTable(4)
    before = pool.state
    with pytest.raises(InvalidBlock):
        table.install_shared_prefix([prefix[0], 5], pool)  # page 5 is free: nothing retained
    assert (pool.state, table.entries()) == (before, (None,) * 4)
    with pytest.raises(OutOfRange):
        table.install_shared_prefix([0] * 5, pool)
    with pytest.raises(InvalidArgument, match="repeat a page"):
        table.install_shared_prefix([prefix[1], prefix[0], prefix[1]], pool)  # before any retain
    assert (pool.state, table.entries()) == (before, (None,) * 4)
    table.install_shared_prefix(prefix, pool)
    assert [pool.ref_count(page) for page in prefix] == [2, 2]
    assert table.entries() == (0, 1, None, None)
    with pytest.raises(TargetNotEmpty):
        table.install_shared_prefix(prefix, pool)
    assert table.ensure_writable(1, pool) == Copy(1, 2)
    assert [pool.ref_count(page) for page in prefix] == [2, 1]


def test_reference_overflow_and_copy_allocating_first_change_nothing(kv: Flavor) -> None:
    pool = kv.module.BlockPool(1, max_references=2)
    page = pool.allocate()
    pool.retain(page)
    before = pool.state
    with pytest.raises(ReferenceOverflow, match="page 0 already has 2 references, the maximum"):
        pool.retain(page)
    with pytest.raises(Exhausted):
        pool.writable(page)  # no copy can be made: the shared source stays
    assert pool.state == before


def test_registry_ownership_survives_attach_and_eviction(kv: Flavor) -> None:
    pool = kv.module.BlockPool(4)
    page = pool.allocate()
    store = kv.module.PrefixKvStore(2, 2)
    store.publish(PrefixPageSet(IDENTITY, (page,), 16), pool)
    request = kv.module.SequenceBlockTable(2)
    assert store.attach(IDENTITY, request, pool) == 16
    assert pool.ref_count(page) == 3
    assert store.remove(IDENTITY, pool)
    request.release_all(pool)
    assert pool.ref_count(page) == 1
    assert not store.remove(IDENTITY, pool)
    assert store.attach(IDENTITY, request, pool) is None


def test_registry_replaces_round_robin_and_updates_in_place(kv: Flavor) -> None:
    pool = kv.module.BlockPool(4)
    pages = [pool.allocate() for _ in range(3)]
    store = kv.module.PrefixKvStore(2, 1)
    third = PrefixIdentity((9, 9, 9, 9))
    for page, identity in zip(pages, (IDENTITY, OTHER, third), strict=True):
        store.publish(PrefixPageSet(identity, (page,), 4), pool)
    assert (store.get(IDENTITY), store.get(OTHER)) == (None, PrefixPageSet(OTHER, (1,), 4))  # victim: entry 0
    assert [pool.ref_count(page) for page in pages] == [1, 2, 2]
    store.publish(PrefixPageSet(OTHER, (pages[1],), 5), pool)
    assert pool.ref_count(pages[1]) == 2
    assert store.state.next_victim == 1 and store.state.clock == 4
    assert [entry.page_set.identity for entry in store.state.entries if entry] == [third, OTHER]


def test_publish_errors_change_nothing(kv: Flavor) -> None:
    pool = kv.module.BlockPool(4)
    page = pool.allocate()
    empty = kv.module.PrefixKvStore(0, 1)
    before = (pool.state, empty.state)
    with pytest.raises(RegistryFull):
        empty.publish(PrefixPageSet(IDENTITY, (page,), 4), pool)  # the retains are undone
    assert (pool.state, empty.state) == before
    with pytest.raises(PageCapacity, match="2 pages exceed this store's 1-page entries"):
        kv.module.PrefixKvStore(1, 1).publish(PrefixPageSet(IDENTITY, (page, 2), 4), pool)


def test_reclaim_evicts_idle_entries_least_recently_used_first(kv: Flavor) -> None:
    pool = kv.module.BlockPool(4)
    store = kv.module.PrefixKvStore(3, 1)
    identities = [PrefixIdentity((index, 0, 0, 0)) for index in range(3)]
    for identity in identities:
        page = pool.allocate()
        store.publish(PrefixPageSet(identity, (page,), 4), pool)
        pool.release(page)  # the producer hands its reference to the store
    reader = kv.module.SequenceBlockTable(1)
    store.attach(identities[0], reader, pool)  # entry 0 is in use, and now the most recent
    assert store.reclaim(pool, 2) == 1
    assert [store.get(identity) is None for identity in identities] == [False, True, False]
    assert store.reclaim(pool, 4) == 1  # entry 0 is attached: never evicted
    assert store.get(identities[0]) is not None
    assert pool.state.free == (3, 1, 2)


def test_prefix_admission_copy_on_write_and_cancellation(kv: Flavor) -> None:
    pool = kv.module.BlockPool(8)
    page = pool.allocate()  # the producer's own reference
    store = kv.module.PrefixKvStore(2, 4)
    store.publish(PrefixPageSet(IDENTITY, (page,), 16), pool)
    scheduler = kv.module.RequestScheduler(2, 4)
    assert scheduler.admit_with_prefix(100, IDENTITY, store, pool) == Admission(0, True, 16)
    assert pool.ref_count(page) == 3  # producer, registry, request
    assert scheduler.ensure_writable(100, 0, pool) == Copy(page, 1)
    assert scheduler.page_table(100) == (1, None, None, None)
    scheduler.finish(100, pool)
    assert scheduler.active_count() == 0
    assert pool.ref_count(page) == 2
    assert pool.state.free[-1] == 1  # the copy went back on top


def test_admission_checks_duplicates_before_capacity_and_reuses_lowest_slot(kv: Flavor) -> None:
    pool, store = kv.module.BlockPool(4), kv.module.PrefixKvStore(1, 1)
    scheduler = kv.module.RequestScheduler(3, 1)
    assert [scheduler.admit_with_prefix(rid, None, store, pool).slot for rid in (7, 8, 9)] == [0, 1, 2]
    before = scheduler.state
    with pytest.raises(DuplicateRequest, match="request 8 is already live"):
        scheduler.admit_with_prefix(8, None, store, pool)
    with pytest.raises(Full, match="all 3 request slots are occupied; request 10 refused"):
        scheduler.admit_with_prefix(10, None, store, pool)
    assert scheduler.state == before
    scheduler.finish(9, pool)
    scheduler.finish(7, pool)
    assert scheduler.admit_with_prefix(11, None, store, pool).slot == 0
    assert scheduler.admit_with_prefix(12, None, store, pool).slot == 2
    views = [EMPTY_VIEW] * 3
    assert scheduler.runnable_into(views) == 3
    assert [(view.request_id, view.slot) for view in views] == [(11, 0), (8, 1), (12, 2)]


def test_lifecycle_decisions(kv: Flavor) -> None:
    pool, store = kv.module.BlockPool(4), kv.module.PrefixKvStore(1, 1)
    scheduler = kv.module.RequestScheduler(2, 2)
    scheduler.admit_with_prefix(5, None, store, pool)
    assert scheduler.record_token(5) == 1
    scheduler.mark_prefill_complete(5)
    with pytest.raises(InvalidState, match="request 5 is in decode, not prefill"):
        scheduler.mark_prefill_complete(5)
    child = scheduler.fork(5, 6, pool)
    views = [EMPTY_VIEW] * 2
    scheduler.runnable_into(views)
    assert child == 1 and views[1] == RequestView(6, 1, RequestState.DECODE, 1, 0)


def _two_decoding_requests(kv: Flavor) -> tuple[object, object, object]:
    pool, store = kv.module.BlockPool(8), kv.module.PrefixKvStore(1, 1)
    scheduler = kv.module.RequestScheduler(3, 4)
    for request_id, token in ((11, 11), (22, 22)):
        scheduler.admit_with_prefix(request_id, None, store, pool)
        scheduler.mark_prefill_complete(request_id)
        scheduler.seed_decode_token(request_id, token)
        scheduler.ensure_writable(request_id, 0, pool)
    return pool, store, scheduler


def test_decode_round_lowers_ragged_tables_and_calls_backend_once(kv: Flavor) -> None:
    _, _, scheduler = _two_decoding_requests(kv)
    backend = HarnessBackend()
    items, tables, outputs = kv.scratch(3, 12, 3)
    receipt = scheduler.execute_decode_round(backend, items, tables, outputs)  # type: ignore[attr-defined]
    assert (receipt.batch_size, receipt.backend_launches, backend.calls) == (2, 1, 1)
    lowered = [
        (item.request_id, item.slot, item.token_id, item.position, item.block_table_offset)
        for item in records(items, RaggedBatchItem)
    ]
    assert lowered[:2] == [(11, 0, 11, 0, 0), (22, 1, 22, 0, 4)]
    unmapped = [INVALID_BLOCK] * 3
    assert list(tables[:8]) == [0, *unmapped, 1, *unmapped]
    views = [EMPTY_VIEW] * 3
    assert scheduler.runnable_into(views) == 2  # type: ignore[attr-defined]
    assert [view.token_count for view in views[:2]] == [1, 1]


def test_decode_round_refusals_change_nothing(kv: Flavor) -> None:
    pool, store, scheduler = _two_decoding_requests(kv)
    before = (pool.state, store.state, scheduler.state)  # type: ignore[attr-defined]
    with pytest.raises(OutputIdentityMismatch, match="output 0 answers request 10 slot 0, expected request 11"):
        scheduler.execute_decode_round(HarnessBackend(Fault.CORRUPT_IDENTITY), *kv.scratch(3, 12, 3))  # type: ignore[attr-defined]
    with pytest.raises(BackendFailed, match="backend raised RuntimeError: injected backend fault") as caught:
        scheduler.execute_decode_round(HarnessBackend(Fault.RAISE), *kv.scratch(3, 12, 3))  # type: ignore[attr-defined]
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert (pool.state, store.state, scheduler.state) == before  # type: ignore[attr-defined]


class SilentBackend:
    """Launches once and writes no output at all."""

    def execute_ragged(self, items: Any, block_tables: Any, out: Any) -> RaggedBatchReceipt:
        return RaggedBatchReceipt(batch_size=len(items), backend_launches=1)


def test_an_unwritten_output_never_passes_even_for_request_0_in_slot_0(kv: Flavor) -> None:
    pool, store, scheduler = kv.module.BlockPool(4), kv.module.PrefixKvStore(1, 1), kv.module.RequestScheduler(2, 2)
    scheduler.admit_with_prefix(0, None, store, pool)  # request 0 in slot 0: what a zeroed record would claim
    scheduler.mark_prefill_complete(0)
    scheduler.seed_decode_token(0, 7)
    scheduler.ensure_writable(0, 0, pool)
    before = (pool.state, store.state, scheduler.state)
    items, tables, outputs = kv.scratch(1, 2, 1)
    with pytest.raises(OutputIdentityMismatch, match="output 0 answers request 0 slot 4294967295"):
        scheduler.execute_decode_round(SilentBackend(), items, tables, outputs)
    assert (pool.state, store.state, scheduler.state) == before


def test_empty_round_calls_no_backend(kv: Flavor) -> None:
    scheduler = kv.module.RequestScheduler(2, 2)
    backend = HarnessBackend()
    assert scheduler.execute_decode_round(backend, *kv.scratch(0, 0, 0)) == kv.module.RaggedBatchReceipt()
    assert backend.calls == 0


@pytest.mark.parametrize(
    ("construct", "message"),
    [
        (lambda m: m.BlockPool(-1), "physical_pages -1 is outside 0..4294967295"),
        (lambda m: m.BlockPool(2, max_references=0), "max_references 0 is outside 1..4294967295"),
        (lambda m: m.SequenceBlockTable(0), "logical_pages 0 is outside 1..4294967295"),
        (lambda m: m.PrefixKvStore(2**16 + 1, 0), "entries 65537 is outside 0..65536"),
        (lambda m: m.PrefixKvStore(1, 0), "pages 0 is outside 1..65535"),
        (lambda m: m.RequestScheduler(0, 0), "requests 0 is outside 1..65536"),
        (lambda m: m.RequestScheduler(1, 0), "logical_pages 0 is outside 1..4294967295"),
        (lambda m: m.RequestScheduler(True, 1), "requests must be an integer, got bool"),
    ],
)
def test_constructors_refuse_impossible_sizes(kv: Flavor, construct: object, message: str) -> None:
    with pytest.raises(InvalidConfig, match=message):
        construct(kv.module)  # type: ignore[operator]
