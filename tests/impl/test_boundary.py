"""The certified core's boundary, on the spec and impl alike: a scheduler and a store work with
the pool (and store) they are bound to and refuse any other, or an object of the wrong kind,
with `InvalidArgument` and no change; a decode round never writes a page another owner reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvsched.spec import InvalidArgument, PrefixIdentity, PrefixPageSet, UnknownRequest
from kvsched.spec.errors import UnpreparedWrite
from kvsched.testing.backends import HarnessBackend
from tests.impl.support import Flavor, flavors

FLAVORS = flavors()
IDS = [flavor.name for flavor in FLAVORS]
PREFIX = PrefixIdentity((1, 2, 3, 4))


def _whole(*objects: Any) -> tuple[object, ...]:
    return tuple(thing.state for thing in objects)


def _decoding_on_a_shared_prefix(flavor: Flavor, page_size: int | None) -> Any:
    """Request 7 attached a one-page prefix of 3 tokens (page 0, which the store holds too) and
    decodes: its next token, at position 3, belongs in the shared page."""
    system = flavor.system(2, 2, 4, 1, 1, page_size=page_size)
    page = system.pool.allocate()
    system.store.publish(PrefixPageSet(PREFIX, (page,), 3), system.pool)
    system.pool.release(page)
    system.scheduler.admit_with_prefix(7, PREFIX, system.store, system.pool)
    system.scheduler.seed_decode_token(7, 40)
    return system


@pytest.mark.parametrize("page_size", [4, None])
@pytest.mark.parametrize("flavor", FLAVORS, ids=IDS)
def test_a_round_refuses_to_write_a_shared_page(flavor: Flavor, page_size: int | None) -> None:
    """Without `prepare_decode_round`, the round wrote the token's KV into the page the store
    (and every later request attaching the prefix) reads, and committed."""
    system = _decoding_on_a_shared_prefix(flavor, page_size)
    backend, before = HarnessBackend(), system.snapshot()
    with pytest.raises(UnpreparedWrite, match="request 7 in slot 0") as caught:
        system.scheduler.execute_decode_round(backend, *flavor.scratch(2, 4, 2))
    assert backend.calls == 0 and system.snapshot() == before
    error = caught.value
    assert (error.request_id, error.slot, error.page, error.holders) == (7, 0, 0, 2)
    assert error.logical_page == (None if page_size is None else 0)
    system.scheduler.prepare_decode_round(system.pool, 4)  # copies page 0 for request 7
    assert system.scheduler.execute_decode_round(backend, *flavor.scratch(2, 4, 2)).batch_size == 1


@pytest.mark.parametrize("flavor", FLAVORS, ids=IDS)
def test_a_round_refuses_an_unmapped_write_target(flavor: Flavor) -> None:
    system = flavor.system(2, 2, 4, 1, 1, page_size=2)
    system.scheduler.admit_with_prefix(3, None, system.store, system.pool)
    system.scheduler.mark_prefill_complete(3)
    system.scheduler.seed_decode_token(3, 1)
    with pytest.raises(UnpreparedWrite, match="writes position 0 into logical page 0, which is unmapped"):
        system.scheduler.execute_decode_round(HarnessBackend(), *flavor.scratch(2, 4, 2))
    for _ in range(4):
        system.scheduler.record_token(3)  # position 4: logical page 2, past a 2-page table
    with pytest.raises(UnpreparedWrite, match="into logical page 2, past its table of 2"):
        system.scheduler.execute_decode_round(HarnessBackend(), *flavor.scratch(2, 4, 2))


@pytest.mark.parametrize("flavor", FLAVORS, ids=IDS)
def test_another_pool_is_refused_and_nothing_changes(flavor: Flavor) -> None:
    """`finish(request, other_pool)` succeeded and left both pools breaking refcount = owners."""
    system = flavor.system(2, 2, 4, 1, 1)
    system.scheduler.admit_with_prefix(1, None, system.store, system.pool)
    system.scheduler.ensure_writable(1, 0, system.pool)
    other = flavor.module.BlockPool(4)
    before = (system.snapshot(), other.state)
    calls: list[Callable[[], object]] = [
        lambda: system.scheduler.finish(1, other),
        lambda: system.scheduler.ensure_writable(1, 1, other),
        lambda: system.scheduler.fork(1, 2, other),
        lambda: system.scheduler.prepare_decode_round(other, 2),
        lambda: system.scheduler.ensure_writable_batch([1], [1], other),
        lambda: system.scheduler.admit_with_prefix(2, None, system.store, other),
        lambda: system.store.publish(PrefixPageSet(PREFIX, (0,), 1), other),
        lambda: system.store.reclaim(other, 1),
        lambda: system.store.remove(PREFIX, other),
    ]
    for call in calls:
        with pytest.raises(InvalidArgument, match="another BlockPool than the one this"):
            call()
        assert (system.snapshot(), other.state) == before


@pytest.mark.parametrize("flavor", FLAVORS, ids=IDS)
def test_objects_of_the_wrong_kind_are_refused(flavor: Flavor) -> None:
    """A store or a scheduler where a pool belongs raised `AttributeError` (impl) or returned
    normally with the request still live (the spec's `finish(5, scheduler)`)."""
    system = flavor.system(2, 2, 4, 1, 1)
    system.scheduler.admit_with_prefix(5, None, system.store, system.pool)
    before = system.snapshot()
    for wrong in (system.store, system.scheduler, None, 3):
        with pytest.raises(InvalidArgument, match=f"pool must be a BlockPool, not {type(wrong).__name__}"):
            system.scheduler.finish(5, wrong)
    with pytest.raises(InvalidArgument, match="prefixes must be a PrefixKvStore, not BlockPool"):
        system.scheduler.admit_with_prefix(6, None, system.pool, system.pool)
    with pytest.raises(InvalidArgument, match="table must be a SequenceBlockTable, not NoneType"):
        system.store.attach(PREFIX, None, system.pool)
    assert system.snapshot() == before


@pytest.mark.parametrize("flavor", FLAVORS, ids=IDS)
def test_a_refused_call_binds_nothing(flavor: Flavor) -> None:
    """Bindings are made by calls that succeed: a refused first call leaves the scheduler free."""
    module = flavor.module
    first, second = module.BlockPool(2), module.BlockPool(2)
    store = module.PrefixKvStore(1, 1)
    scheduler = module.RequestScheduler(2, 2)
    with pytest.raises(UnknownRequest):
        scheduler.ensure_writable(9, 0, first)
    scheduler.admit_with_prefix(9, None, store, second)  # binds `second`, and the store to it
    with pytest.raises(InvalidArgument, match="than the one this scheduler is bound to"):
        scheduler.ensure_writable(9, 0, first)
    with pytest.raises(InvalidArgument, match="than the one this prefix store is bound to"):
        store.reclaim(first, 1)
    assert scheduler.ensure_writable(9, 0, second) == module.Allocated(0)


@pytest.mark.parametrize("flavor", FLAVORS, ids=IDS)
def test_a_store_bound_to_another_pool_cannot_be_used_with_this_one(flavor: Flavor) -> None:
    module = flavor.module
    first, second = module.BlockPool(2), module.BlockPool(2)
    store = module.PrefixKvStore(1, 1, pool=first)
    scheduler = module.RequestScheduler(2, 2, pool=second)
    with pytest.raises(InvalidArgument, match="than the one this prefix store is bound to"):
        scheduler.admit_with_prefix(1, None, store, second)
    with pytest.raises(InvalidArgument, match="than the one this prefix store is bound to"):
        module.RequestScheduler(2, 2, pool=second, prefixes=store)
    assert scheduler.active_count() == 0
