"""Properties the spec's docstrings promise, tested at their boundaries rather than at random
points: the tenant-salt bijection for salts one bit apart at every position, and every guard at
exactly its threshold and one step past it."""

from __future__ import annotations

import pytest

from kvsched.spec import BatchConfig, BlockPool, InvalidConfig, PrefixIdentity, PrefixPageSet, derive_prefix_identity
from kvsched.spec.batching import CHUNK_SIZE_LIMIT, can_admit_new
from kvsched.spec.errors import EmptyPageSet, InvalidArgument, PageCapacity, ReferenceOverflow
from kvsched.spec.prefix import MAX_SET_PAGES
from kvsched.spec.slots import MAX_REQUESTS, initial_scheduler

FACTS = [(1, 2, 3, 4, 5, 6), (7, 8, 9, 10, 11, 12)]


@pytest.mark.parametrize("base", [0, 2**64 - 1, 0x5555_5555_5555_5555])
def test_tenants_one_bit_apart_never_share_a_word(base: int) -> None:
    """For the same other inputs, salts that differ in any single bit give identities that differ
    in all four words (the salt enters every starting word; every later step is a bijection)."""
    reference = derive_prefix_identity(11, 12, 13, 14, FACTS, tenant_salt=base).words
    for bit in range(64):
        other = derive_prefix_identity(11, 12, 13, 14, FACTS, tenant_salt=base ^ (1 << bit)).words
        assert all(mine != theirs for mine, theirs in zip(reference, other, strict=True)), bit


def test_the_salt_is_a_u64() -> None:
    assert derive_prefix_identity(1, 2, 3, 4, [], tenant_salt=2**64 - 1)
    with pytest.raises(InvalidArgument, match="tenant_salt 18446744073709551616 is outside"):
        derive_prefix_identity(1, 2, 3, 4, [], tenant_salt=2**64)


def test_the_chunk_size_limit_is_inclusive() -> None:
    assert BatchConfig(chunk_size=CHUNK_SIZE_LIMIT).chunk_size == 512
    with pytest.raises(InvalidConfig, match="exceeds 512-token safety limit"):
        BatchConfig(chunk_size=CHUNK_SIZE_LIMIT + 1)
    with pytest.raises(InvalidConfig, match="chunk_size must be > 0"):
        BatchConfig(chunk_size=0)


def test_the_memory_guard_admits_at_exactly_the_reserve() -> None:
    config = BatchConfig(prefill_reserve_pages=8)
    assert can_admit_new(config, active=3, kv_free_pages=8)
    assert not can_admit_new(config, active=3, kv_free_pages=7)
    assert can_admit_new(config, active=0, kv_free_pages=0)  # an empty batch is never starved


def test_a_page_takes_exactly_max_references() -> None:
    pool = BlockPool(1, max_references=3)
    page = pool.allocate()
    pool.retain(page)
    pool.retain(page)  # the third reference: exactly the maximum
    assert pool.ref_count(page) == 3
    with pytest.raises(ReferenceOverflow, match="already has 3 references, the maximum"):
        pool.retain(page)
    assert pool.ref_count(page) == 3


def test_a_page_set_holds_up_to_its_limits() -> None:
    identity = PrefixIdentity((1, 2, 3, 4))
    assert len(PrefixPageSet(identity, tuple(range(MAX_SET_PAGES)), 2**32 - 1).pages) == MAX_SET_PAGES
    with pytest.raises(PageCapacity):
        PrefixPageSet(identity, tuple(range(MAX_SET_PAGES + 1)), 1)
    with pytest.raises(EmptyPageSet):
        PrefixPageSet(identity, (0,), 2**32)
    with pytest.raises(EmptyPageSet):
        PrefixPageSet(identity, (0,), 0)


def test_the_scheduler_holds_up_to_max_requests() -> None:
    assert len(initial_scheduler(MAX_REQUESTS, 1).slots) == MAX_REQUESTS
    with pytest.raises(InvalidConfig, match=r"requests 65537 is outside 1\.\.65536"):
        initial_scheduler(MAX_REQUESTS + 1, 1)
