"""The decisions the spec makes where the originals are lax, and the atomicity of every refusal."""

from __future__ import annotations

import pytest

from kvsched.spec import (
    BlockPool,
    BlockTableBufferTooSmall,
    Exhausted,
    InvalidArgument,
    InvalidConfig,
    InvalidState,
    ItemBufferTooSmall,
    MissingInputToken,
    OutOfRange,
    OutputBufferTooSmall,
    OutputTooSmall,
    PrefixIdentity,
    PrefixKvStore,
    PrefixPageSet,
    RequestScheduler,
    RequestState,
    RequestView,
    UnknownRequest,
)
from kvsched.spec.errors import DuplicateRequest, Full, UnpreparedWrite
from kvsched.spec.pool import Copy
from tests.helpers import OneLaunchBackend, scratch, whole_state


def system() -> tuple[BlockPool, PrefixKvStore, RequestScheduler]:
    return BlockPool(4), PrefixKvStore(1, 2), RequestScheduler(2, 2)


def test_mark_prefill_complete_requires_prefill() -> None:
    pool, store, scheduler = system()
    scheduler.admit_with_prefix(1, None, store, pool)
    scheduler.mark_prefill_complete(1)
    before = whole_state(pool, store, scheduler)
    with pytest.raises(InvalidState, match="request 1 is in decode"):
        scheduler.mark_prefill_complete(1)
    assert whole_state(pool, store, scheduler) == before


def test_prefix_hit_admits_into_decode_without_a_token() -> None:
    pool, store, scheduler = system()
    page = pool.allocate()
    identity = PrefixIdentity((9, 9, 9, 9))
    store.publish(PrefixPageSet(identity, (page,), 3), pool)
    admission = scheduler.admit_with_prefix(5, identity, store, pool)
    assert (admission.slot, admission.prefix_hit, admission.prefix_tokens) == (0, True, 3)
    with pytest.raises(MissingInputToken, match="request 5 in slot 0"):
        scheduler.execute_decode_round(OneLaunchBackend(), *scratch(2, 4, 2))
    scheduler.seed_decode_token(5, 40)
    before = (pool.state, store.state, scheduler.state)
    with pytest.raises(UnpreparedWrite, match="request 5 in slot 0 shares page 0 with another owner") as caught:
        scheduler.execute_decode_round(OneLaunchBackend(), *scratch(2, 4, 2))  # its write would land in page 0
    assert (caught.value.request_id, caught.value.slot, caught.value.page, caught.value.holders) == (5, 0, 0, 3)
    assert (pool.state, store.state, scheduler.state) == before
    (action,) = scheduler.prepare_decode_round(pool, 4)
    assert isinstance(action, Copy) and action.source == page
    items, tables, outputs = scratch(2, 4, 2)
    scheduler.execute_decode_round(OneLaunchBackend(), items, tables, outputs)
    assert items[0].position == 3  # the first decoded token sits right after the prefix
    assert tables[0] == action.destination  # written into the request's own copy


def test_record_token_and_decode_round_count_different_tokens() -> None:
    pool, store, scheduler = system()
    scheduler.admit_with_prefix(1, None, store, pool)
    assert [scheduler.record_token(1) for _ in range(3)] == [1, 2, 3]  # three prefilled tokens
    scheduler.seed_decode_token(1, 7)  # seeding during prefill is allowed
    scheduler.mark_prefill_complete(1)
    items, tables, outputs = scratch(2, 4, 2)
    scheduler.execute_decode_round(OneLaunchBackend(), items, tables, outputs)
    assert items[0].position == 3
    views = [RequestView(0, 0, RequestState.EMPTY, 0, 0)] * 2
    scheduler.runnable_into(views)
    assert views[0].token_count == 4


def test_lowest_empty_slot_is_reused_after_finish() -> None:
    pool, store, scheduler = system()
    scheduler.admit_with_prefix(1, None, store, pool)
    scheduler.admit_with_prefix(2, None, store, pool)
    scheduler.finish(1, pool)
    assert scheduler.admit_with_prefix(1, None, store, pool).slot == 0  # the id is free again


def test_runnable_into_lists_prefill_and_decode_in_slot_order() -> None:
    pool, store, scheduler = system()
    scheduler.admit_with_prefix(8, None, store, pool)
    scheduler.admit_with_prefix(3, None, store, pool)
    scheduler.mark_prefill_complete(3)
    views = [RequestView(0, 0, RequestState.EMPTY, 0, 0)] * 2
    assert scheduler.runnable_into(views) == 2
    assert [(v.request_id, v.slot, v.state) for v in views] == [
        (8, 0, RequestState.PREFILL),
        (3, 1, RequestState.DECODE),
    ]
    with pytest.raises(OutputTooSmall):
        scheduler.runnable_into(views[:1])


def test_empty_round_calls_no_backend() -> None:
    pool, store, scheduler = system()
    scheduler.admit_with_prefix(1, None, store, pool)  # prefill only: nothing decodes
    backend = OneLaunchBackend()
    receipt = scheduler.execute_decode_round(backend, *scratch(0, 0, 0))
    assert (receipt.batch_size, receipt.backend_launches, backend.calls) == (0, 0, 0)


def test_fork_shares_pages_and_copies_on_write() -> None:
    pool, store, scheduler = system()
    scheduler.admit_with_prefix(1, None, store, pool)
    scheduler.ensure_writable(1, 0, pool)
    assert scheduler.fork(1, 2, pool) == 1
    assert scheduler.page_table(2) == scheduler.page_table(1) == (0, None)
    assert pool.ref_count(0) == 2
    scheduler.ensure_writable(2, 0, pool)
    assert scheduler.page_table(2) == (1, None)
    with pytest.raises(DuplicateRequest):
        scheduler.fork(1, 2, pool)
    with pytest.raises(UnknownRequest):
        scheduler.fork(9, 3, pool)


@pytest.mark.parametrize(
    ("operation", "error"),
    [
        (lambda p, s, r: r.admit_with_prefix(1, None, s, p), DuplicateRequest),
        (lambda p, s, r: r.admit_with_prefix(-1, None, s, p), InvalidArgument),
        (lambda p, s, r: r.admit_with_prefix(2**64, None, s, p), InvalidArgument),
        (lambda p, s, r: r.ensure_writable(1, 2, p), OutOfRange),
        (lambda p, s, r: r.ensure_writable(3, 0, p), UnknownRequest),
        (lambda p, s, r: r.seed_decode_token(1, 2**32), InvalidArgument),
        (lambda p, s, r: r.record_token(4), UnknownRequest),
        (lambda p, s, r: r.finish(4, p), UnknownRequest),
        (lambda p, s, r: r.fork(1, 2, p), Full),
        (lambda p, s, r: r.execute_decode_round(OneLaunchBackend(), *scratch(0, 4, 2)), ItemBufferTooSmall),
        (lambda p, s, r: r.execute_decode_round(OneLaunchBackend(), *scratch(2, 4, 0)), OutputBufferTooSmall),
        (lambda p, s, r: r.execute_decode_round(OneLaunchBackend(), *scratch(2, 1, 2)), BlockTableBufferTooSmall),
        (lambda p, s, r: r.ensure_writable(7, 1, p), Exhausted),
    ],
)
def test_every_refusal_changes_nothing(operation: object, error: type[Exception]) -> None:
    pool, store, scheduler = BlockPool(2), PrefixKvStore(1, 2), RequestScheduler(2, 2)
    scheduler.admit_with_prefix(1, None, store, pool)
    scheduler.admit_with_prefix(7, None, store, pool)
    scheduler.ensure_writable(1, 0, pool)
    scheduler.ensure_writable(7, 0, pool)
    scheduler.mark_prefill_complete(1)
    scheduler.seed_decode_token(1, 5)
    before = whole_state(pool, store, scheduler)
    assert callable(operation)
    with pytest.raises(error):
        operation(pool, store, scheduler)
    assert whole_state(pool, store, scheduler) == before


def test_constructors_refuse_impossible_sizes() -> None:
    with pytest.raises(InvalidConfig):
        RequestScheduler(0, 4)
    with pytest.raises(InvalidConfig):
        RequestScheduler(2, 0)
    with pytest.raises(InvalidConfig):
        BlockPool(-1)
    with pytest.raises(InvalidConfig):
        PrefixKvStore(1, 0)


def test_prepare_decode_round_is_the_single_calls_in_slot_order() -> None:
    pool, store, scheduler = BlockPool(6), PrefixKvStore(1, 2), RequestScheduler(3, 3)
    for request_id in (5, 6):
        scheduler.admit_with_prefix(request_id, None, store, pool)
        scheduler.ensure_writable(request_id, 0, pool)
        scheduler.mark_prefill_complete(request_id)
    scheduler.fork(5, 7, pool)  # shares page 0 with request 5
    for _ in range(2):
        scheduler.record_token(6)
    actions = scheduler.prepare_decode_round(pool, 2)
    # request 5: page 0 shared with 7 -> copy; request 6: token 2 -> logical page 1 -> fresh;
    # request 7: page 0 now exclusive after 5 copied away.
    assert [type(action).__name__ for action in actions] == ["Copy", "Allocated", "Existing"]
    assert scheduler.page_table(5)[0] != scheduler.page_table(7)[0]


def test_batched_writes_are_all_or_nothing() -> None:
    pool, store, scheduler = BlockPool(2), PrefixKvStore(1, 2), RequestScheduler(2, 2)
    scheduler.admit_with_prefix(1, None, store, pool)
    scheduler.admit_with_prefix(2, None, store, pool)
    before = whole_state(pool, store, scheduler)
    with pytest.raises(Exhausted):
        scheduler.ensure_writable_batch([1, 2, 1], [0, 0, 1], pool)  # the third write has no page
    assert whole_state(pool, store, scheduler) == before
    with pytest.raises(InvalidArgument, match="2 request ids but 1 logical pages"):
        scheduler.ensure_writable_batch([1, 2], [0], pool)
    with pytest.raises(InvalidArgument, match="page_size"):
        scheduler.prepare_decode_round(pool, 0)
    assert whole_state(pool, store, scheduler) == before
