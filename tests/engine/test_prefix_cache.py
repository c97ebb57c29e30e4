"""The automatic prefix cache on its own: page keys (chained, salted, the same bytes in spec and
impl), the eviction order exactly (least recently used, ties to the deeper page, then the lower
id), reset refused while a page is held, impl's cache in lockstep with the spec's on random
operation sequences, and what a truncated hash does: real collisions serve the wrong KV, and
the engine machine's checks catch it, while the full-width hash passes the same search."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsched.impl.page_hash import PageHasher
from kvsched.impl.pool import BlockPool as ImplPool
from kvsched.impl.pool import get_arrays
from kvsched.impl.prefix_cache import Mark, PrefixCache
from kvsched.spec import pool as pool_ops
from kvsched.spec import prefix_cache as cache_ops
from kvsched.spec.batch import INVALID_BLOCK
from kvsched.spec.errors import CacheInUse
from kvsched.spec.page_keys import CacheSalt, pack_tokens, page_keys, register_page_hash, sha256
from kvsched.testing.checks import CheckFailed, FailureKind
from kvsched.testing.engine_machine import engine_machine, shape, spec_engine
from kvsched.testing.safety_search import seed_alone
from tests.engine.support import SEARCH


def test_a_key_names_the_whole_chain_and_the_salt() -> None:
    tokens = (1, 2, 3, 4, 5, 6, 7, 8)
    base = page_keys(tokens, 4, CacheSalt(), sha256)
    assert len(base) == 2 and len(set(base)) == 2
    assert page_keys((9, 2, 3, 4, 5, 6, 7, 8), 4, CacheSalt(), sha256)[1] != base[1]  # an earlier page differs
    for salt in (CacheSalt(tenant=1), CacheSalt(adapter=3), CacheSalt(model="other")):
        assert set(page_keys(tokens, 4, salt, sha256)).isdisjoint(base)
    hasher = PageHasher(4, sha256)
    assert hasher.keys_of(pack_tokens(tokens), 2, CacheSalt()) == list(base)  # impl: the same bytes


def cached(pages: int) -> tuple[cache_ops.CacheState, pool_ops.PoolState]:
    """`pages` pages, each allocated by a request and cached at depth = its id, request released."""
    cache, pool = cache_ops.EMPTY_CACHE, pool_ops.initial_pool(pages)
    for page in range(pages):
        pool, allocated = pool_ops.allocate(pool)
        cache, pool = cache_ops.insert(cache, pool, bytes([page]), allocated, depth=page)
    return cache, pool


def test_eviction_is_least_recently_used_then_deepest_then_lowest_page() -> None:
    cache, pool = cached(5)
    cache = cache_ops.stamp(cache, [3])  # each request releases its pages: 3 first,
    cache = cache_ops.stamp(cache, [0, 4, 1])  # then 0, 4 and 1 together,
    cache = cache_ops.stamp(cache, [2])  # then 2
    for page in range(5):
        pool = pool_ops.release(pool, page)
    order = [entry.page for entry in cache_ops.evictable(cache, pool)]
    assert order == [3, 4, 1, 0, 2]
    cache, pool, evicted = cache_ops.evict(cache, pool, 2)
    assert evicted == 2 and pool.free == (3, 4) and cache.stats.evictions == 2
    assert [entry.page for entry in cache.pages] == [0, 1, 2]


def test_eviction_spares_held_pages_and_the_pages_asked_to_keep() -> None:
    cache, pool = cached(3)
    pool = pool_ops.release(pool_ops.release(pool, 0), 1)  # page 2 is still held by its request
    cache, pool, evicted = cache_ops.evict(cache, pool, 3, keep=[0])
    assert evicted == 1 and [entry.page for entry in cache.pages] == [0, 2]


def test_reset_is_refused_while_a_page_is_held_and_then_drops_everything() -> None:
    cache, pool = cached(2)
    with pytest.raises(CacheInUse):
        cache_ops.reset(cache, pool)
    pool = pool_ops.release(pool_ops.release(pool, 0), 1)
    cache, pool = cache_ops.reset(cache, pool)
    assert cache.pages == () and len(pool.free) == 2


OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("allocate")),
        st.tuples(st.just("release"), st.integers(0, 5)),
        st.tuples(st.just("insert"), st.integers(0, 5), st.integers(0, 3), st.integers(0, 4)),
        st.tuples(  # requests release their pages, one after the other: one row each
            st.just("stamp"), st.lists(st.lists(st.integers(0, 5), max_size=3, unique=True), min_size=1, max_size=3)
        ),
        st.tuples(st.just("evict"), st.integers(0, 3), st.lists(st.integers(0, 5), max_size=2)),
        st.tuples(st.just("reset")),
        st.tuples(st.just("mark")),
        st.tuples(st.just("undo")),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPERATIONS)
def test_impl_cache_in_lockstep_with_the_spec(operations: list[tuple[Any, ...]]) -> None:
    pages = 6
    cache, pool = cache_ops.EMPTY_CACHE, pool_ops.initial_pool(pages)
    impl_cache, impl_pool = PrefixCache(pages), ImplPool(pages)
    marks: list[tuple[cache_ops.CacheState, pool_ops.PoolState, Mark]] = []
    for operation in operations:
        name = operation[0]
        if name == "allocate" and pool.free:
            pool, page = pool_ops.allocate(pool)
            assert impl_pool.allocate() == page
        elif name == "release" and pool.refs[operation[1]] > int(cache_ops.is_cached(cache, operation[1])):
            pool = pool_ops.release(pool, operation[1])  # an owner other than the cache lets go
            impl_pool.release(operation[1])
        elif name == "insert" and pool.refs[operation[1]] > 0:
            key = bytes([operation[2]])
            cache, pool = cache_ops.insert(cache, pool, key, operation[1], operation[3])
            impl_cache.insert(impl_pool, [key], [operation[1]], [operation[3]], [None])
        elif name == "stamp":
            for row in operation[1]:
                cache = cache_ops.stamp(cache, row)
            rows = np.full((len(operation[1]), 3), INVALID_BLOCK, dtype=np.uint32)
            for index, row in enumerate(operation[1]):
                rows[index, : len(row)] = row
            impl_cache.stamp(rows)
        elif name == "evict":
            cache, pool, evicted = cache_ops.evict(cache, pool, operation[1], operation[2])
            assert impl_cache.evict(impl_pool, operation[1], operation[2]) == evicted
        elif name == "reset":
            try:
                cache, pool = cache_ops.reset(cache, pool)
            except CacheInUse:
                with pytest.raises(CacheInUse):
                    impl_cache.reset(impl_pool)
            else:
                impl_cache.reset(impl_pool)
        elif name == "mark":
            impl_cache.settle()
            marks = [(cache, pool, impl_cache.mark())]
        elif name == "undo" and marks:
            cache, pool, mark = marks[0]
            impl_cache.undo(mark)
            impl_pool = ImplPool(pages)  # the pool's own rollback is the engine checkpoint's
            _replay_pool(impl_pool, pool)
        assert impl_cache.to_spec() == cache
        assert impl_pool.to_spec() == pool


def _replay_pool(target: ImplPool, state: pool_ops.PoolState) -> None:
    """Bring a fresh impl pool to `state` (the engine restores its pool from a checkpoint)."""
    arrays = get_arrays(target)
    arrays.refs[:] = state.refs
    arrays.free[: len(state.free)] = state.free
    arrays.top[0] = len(state.free)


def truncated(data: bytes) -> bytes:
    """SHA-256 cut to one byte: 256 keys, so different pages collide."""
    return sha256(data)[:1]


register_page_hash("sha256-1byte", truncated)


@pytest.mark.proof  # a search until it catches the broken system: make proofs (CI) runs it
def test_a_truncated_hash_collides_and_the_machine_catches_the_wrong_kv() -> None:
    machine = engine_machine(factory=spec_engine, reference=None, config=shape("cached", page_hash="sha256-1byte"))
    machine.TestCase.settings = SEARCH
    with pytest.raises(CheckFailed) as caught, seed_alone():  # programs independent of what was imported
        machine.TestCase().runTest()
    # A collision either serves another prompt's KV (read, sampled, cached or shared across tenants)
    # or names one cached page for two pages of a sequence, which no table may hold twice: that
    # admission is refused at every step, and the request never runs.
    caught_by = {FailureKind.GHOST, FailureKind.DETERMINISM, FailureKind.CACHE, FailureKind.ISOLATION}
    caught_by.add(FailureKind.LIVENESS)
    assert caught.value.failure.kind in caught_by


@pytest.mark.proof  # a search until it catches the broken system: make proofs (CI) runs it
def test_the_full_hash_passes_the_same_search() -> None:
    machine = engine_machine(factory=spec_engine, reference=None, config=shape("cached"))
    machine.TestCase.settings = SEARCH
    machine.TestCase().runTest()


ATTACHES = [
    ("aligned", [0, 1]),  # the donor's two full pages after an empty table
    ("repeated", [0, 0]),
    ("free page", [5]),
    ("out of pool", [99]),
    ("too many", [0, 1, 2, 3]),
    ("not a page", ["0"]),
]


def attach_outcome(flavour: Any, pages: list[Any]) -> tuple[Any, ...]:
    """Request 2 (empty) attaches `pages` after request 1 computed pages 0 and 1: the outcome,
    and whether a refusal left the pool and scheduler as they were."""
    from kvsched.testing.checks import capture

    pool = flavour.BlockPool(6)
    store = flavour.PrefixKvStore(0, 1, pool=pool)
    scheduler = flavour.RequestScheduler(3, 3, pool=pool, prefixes=store, page_size=2)
    scheduler.admit_with_prefix(1, None, store, pool)
    scheduler.record_chunk(1, 4, pool)
    scheduler.admit_with_prefix(2, None, store, pool)

    def state() -> tuple[Any, Any]:
        return pool.to_spec() if hasattr(pool, "to_spec") else pool.state, scheduler.state

    before = state()
    outcome = capture(lambda: scheduler.attach_pages(2, pages, pool))
    return outcome.summary(), state(), outcome.error is None or state() == before


@pytest.mark.parametrize(("name", "pages"), ATTACHES, ids=[name for name, _ in ATTACHES])
def test_attach_pages_refuses_alike_in_spec_and_impl_and_changes_nothing(name: str, pages: list[Any]) -> None:
    from kvsched import impl, spec

    mine, theirs = attach_outcome(impl, pages), attach_outcome(spec, pages)
    assert mine == theirs and mine[2]  # the same outcome and state; a refusal changed nothing
    assert (mine[0][0] == "returns") == (name == "aligned")


def test_attach_pages_needs_the_count_to_end_the_mapped_pages() -> None:
    from kvsched import spec
    from kvsched.spec.errors import InvalidState

    pool = spec.BlockPool(6)
    scheduler = spec.RequestScheduler(2, 3, pool=pool, page_size=2)
    store = spec.PrefixKvStore(0, 1, pool=pool)
    scheduler.admit_with_prefix(1, None, store, pool)
    scheduler.record_chunk(1, 3, pool)  # 3 tokens: the second page is not full
    scheduler.admit_with_prefix(2, None, store, pool)
    scheduler.record_chunk(2, 1, pool)
    with pytest.raises(InvalidState):
        scheduler.attach_pages(2, [0], pool)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 40), st.lists(st.integers(0, 3), max_size=12), st.integers(0, 1), st.integers(0, 13)),
        min_size=1,
        max_size=12,
    )
)
def test_impl_keys_reuse_a_shared_start_and_equal_the_spec_keys(sequences: list[tuple[Any, ...]]) -> None:
    base = tuple(range(40))
    hasher = PageHasher(4, sha256)
    for shared, tail, tenant, pages in sequences:
        tokens = base[:shared] + tuple(tail)
        count = min(pages, len(tokens) // 4)
        salt = CacheSalt(tenant=tenant)
        assert hasher.keys_of(pack_tokens(tokens), count, salt) == list(page_keys(tokens, 4, salt, sha256, count))


def test_the_cached_content_check_fails_on_a_page_cached_before_its_kv_is_written() -> None:
    from kvsched.spec import EngineRequest
    from kvsched.spec import events as ev
    from kvsched.testing.engine_machine import SHAPES, EngineMachine, impl_engine
    from kvsched.testing.engine_variants import ENGINE_VARIANTS

    variant = next(variant for variant in ENGINE_VARIANTS if variant.name == "publish_on_allocation")
    program: list[ev.Event] = [ev.Submit(EngineRequest(1, (3, 1, 4), 2)), ev.Step()]  # chunk 1: page 0 half written
    broken = EngineMachine(variant.factory(), None, SHAPES["cached_tight"])
    with pytest.raises(CheckFailed) as caught:
        for event in program:
            broken.run(event)
    assert caught.value.failure.kind is FailureKind.CACHE
    correct = EngineMachine(impl_engine, None, SHAPES["cached_tight"])
    for event in program:
        correct.run(event)
