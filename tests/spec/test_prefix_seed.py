"""Seed A's prefix-store and graph-assist tests, ported, plus the store's reclaim."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsched.spec import (
    BlockPool,
    Copy,
    PrefixIdentity,
    PrefixKvStore,
    PrefixPageSet,
    RegistryFull,
    SequenceBlockTable,
    derive_prefix_identity,
)
from kvsched.spec.errors import EmptyPageSet, InvalidArgument, PageCapacity

IDENTITY = PrefixIdentity((1, 2, 3, 4))
OTHER = PrefixIdentity((5, 6, 7, 8))


def test_registry_ownership_survives_request_attach_and_eviction() -> None:
    pool = BlockPool(4)
    page = pool.allocate()
    store = PrefixKvStore(2, 2)
    store.publish(PrefixPageSet(IDENTITY, (page,), 16), pool)
    assert pool.ref_count(page) == 2
    request = SequenceBlockTable(2)
    assert store.attach(IDENTITY, request, pool) == 16
    assert pool.ref_count(page) == 3
    assert store.remove(IDENTITY, pool)
    assert pool.ref_count(page) == 2
    request.release_all(pool)
    assert pool.ref_count(page) == 1
    assert not store.remove(IDENTITY, pool)


def test_attached_prefix_writes_use_copy_on_write() -> None:
    pool = BlockPool(4)
    page = pool.allocate()
    store = PrefixKvStore(1, 1)
    store.publish(PrefixPageSet(IDENTITY, (page,), 8), pool)
    table = SequenceBlockTable(2)
    store.attach(IDENTITY, table, pool)
    assert table.ensure_writable(0, pool) == Copy(page, 1)
    assert store.get(IDENTITY) == PrefixPageSet(IDENTITY, (page,), 8)


def test_attach_miss_changes_nothing() -> None:
    pool, store, table = BlockPool(2), PrefixKvStore(1, 1), SequenceBlockTable(2)
    before = (pool.state, store.state, table.entries())
    assert store.attach(OTHER, table, pool) is None
    assert (pool.state, store.state, table.entries()) == before


def test_registry_replaces_round_robin_when_full() -> None:
    pool = BlockPool(4)
    first, second = pool.allocate(), pool.allocate()
    store = PrefixKvStore(1, 1)
    store.publish(PrefixPageSet(IDENTITY, (first,), 4), pool)
    store.publish(PrefixPageSet(OTHER, (second,), 4), pool)
    assert store.get(IDENTITY) is None
    assert store.get(OTHER) is not None
    assert pool.ref_count(first) == 1  # the replaced entry's reference went back after
    assert pool.ref_count(second) == 2


def test_same_identity_updates_in_place_and_releases_after() -> None:
    pool = BlockPool(4)
    page = pool.allocate()
    store = PrefixKvStore(2, 1)
    store.publish(PrefixPageSet(IDENTITY, (page,), 4), pool)
    store.publish(PrefixPageSet(IDENTITY, (page,), 5), pool)
    assert pool.ref_count(page) == 2
    assert store.get(IDENTITY) == PrefixPageSet(IDENTITY, (page,), 5)


def test_publish_errors_change_nothing() -> None:
    pool = BlockPool(4)
    page = pool.allocate()
    empty = PrefixKvStore(0, 1)
    before = (pool.state, empty.state)
    with pytest.raises(RegistryFull):
        empty.publish(PrefixPageSet(IDENTITY, (page,), 4), pool)
    assert (pool.state, empty.state) == before
    small = PrefixKvStore(1, 1)
    with pytest.raises(PageCapacity):
        small.publish(PrefixPageSet(IDENTITY, (page, 2), 4), pool)
    with pytest.raises(EmptyPageSet):
        PrefixPageSet(IDENTITY, (), 4)
    with pytest.raises(InvalidArgument):
        PrefixPageSet(IDENTITY, (page, page), 4)


def test_reclaim_evicts_idle_entries_least_recently_used_first() -> None:
    pool = BlockPool(4)
    store = PrefixKvStore(3, 1)
    pages = [pool.allocate() for _ in range(3)]
    identities = [PrefixIdentity((index, 0, 0, 0)) for index in range(3)]
    for page, identity in zip(pages, identities, strict=True):
        store.publish(PrefixPageSet(identity, (page,), 4), pool)
        pool.release(page)  # the producer hands its reference over to the store
    reader = SequenceBlockTable(1)
    store.attach(identities[0], reader, pool)  # entry 0 is in use, and now most recent
    assert pool.free_count() == 1
    assert store.reclaim(pool, 2) == 1
    assert store.get(identities[1]) is None  # least recently used idle entry went first
    assert store.get(identities[2]) is not None
    assert store.reclaim(pool, 4) == 1  # entry 0 is attached: never evicted
    assert store.get(identities[0]) is not None
    assert pool.free_count() == 3


def test_identity_depends_on_fact_order_and_revision() -> None:
    facts = [(1, 2, 3, 4, 5, 6), (7, 8, 9, 10, 11, 12)]
    base = derive_prefix_identity(1, 2, 3, 4, facts)
    assert derive_prefix_identity(1, 2, 3, 4, facts) == base
    assert derive_prefix_identity(1, 2, 3, 4, list(reversed(facts))) != base
    assert derive_prefix_identity(1, 2, 3, 5, facts) != base


@given(
    st.tuples(*[st.integers(0, 2**64 - 1)] * 4),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
)
def test_two_tenants_never_share_an_identity(inputs: tuple[int, int, int, int], salt: int, other: int) -> None:
    if salt == other:
        other ^= 1
    mine = derive_prefix_identity(*inputs, [(1, 2, 3, 4, 5, 6)], tenant_salt=salt)
    theirs = derive_prefix_identity(*inputs, [(1, 2, 3, 4, 5, 6)], tenant_salt=other)
    assert all(a != b for a, b in zip(mine.words, theirs.words, strict=True))
