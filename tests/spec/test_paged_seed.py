"""Seed A's paged-KV tests (`kv/paged/tests.rs`), ported with their exact expected values."""

from __future__ import annotations

import pytest

from kvsched.spec import (
    INVALID_BLOCK,
    Allocated,
    BlockPool,
    Copy,
    DoubleRelease,
    Exhausted,
    Existing,
    InvalidArgument,
    InvalidBlock,
    OutOfRange,
    PagedKvConfig,
    ReferenceOverflow,
    SequenceBlockTable,
    TargetNotEmpty,
    fill_identity_block_table,
)
from kvsched.spec.errors import TableOutputTooSmall


def test_fresh_pool_hands_out_pages_in_order_and_reuses_lifo() -> None:
    pool = BlockPool(4)
    assert [pool.allocate() for _ in range(3)] == [0, 1, 2]
    pool.release(1)
    pool.release(0)
    assert pool.allocate() == 0
    assert pool.allocate() == 1
    assert pool.allocate() == 3
    with pytest.raises(Exhausted):
        pool.allocate()


def test_fork_and_partial_page_write_use_copy_on_write() -> None:
    pool = BlockPool(8)
    parent, child = SequenceBlockTable(4), SequenceBlockTable(4)
    first = parent.ensure_writable(0, pool)
    assert first == Allocated(0)
    parent.fork_into(child, pool)
    assert pool.ref_count(0) == 2
    action = child.ensure_writable(0, pool)
    assert action == Copy(0, 1)
    assert parent.get(0) == 0
    assert child.get(0) == 1
    assert pool.ref_count(0) == 1
    assert parent.ensure_writable(0, pool) == Existing(0)


def test_release_is_bounded_and_detects_double_release() -> None:
    pool = BlockPool(2)
    page = pool.allocate()
    pool.release(page)
    with pytest.raises(DoubleRelease):
        pool.release(page)
    with pytest.raises(InvalidBlock):
        pool.release(2)
    with pytest.raises(InvalidBlock):
        pool.retain(page)  # a free page cannot be retained
    assert pool.free_count() == 2


def test_graph_prefix_pages_install_with_refcounts_and_cow() -> None:
    pool = BlockPool(8)
    prefix = [pool.allocate(), pool.allocate()]
    table = SequenceBlockTable(4)
    table.install_shared_prefix(prefix, pool)
    assert [pool.ref_count(page) for page in prefix] == [2, 2]
    assert table.entries() == (0, 1, None, None)
    with pytest.raises(TargetNotEmpty):
        table.install_shared_prefix(prefix, pool)
    assert table.ensure_writable(1, pool) == Copy(1, 2)
    assert [pool.ref_count(page) for page in prefix] == [2, 1]


def test_install_shared_prefix_is_all_or_nothing() -> None:
    pool = BlockPool(4)
    held = pool.allocate()
    table = SequenceBlockTable(3)
    before = pool.state
    with pytest.raises(InvalidBlock):
        table.install_shared_prefix([held, 3], pool)  # page 3 is free
    assert pool.state == before
    assert table.entries() == (None, None, None)
    with pytest.raises(OutOfRange):
        table.install_shared_prefix([held] * 4, pool)
    with pytest.raises(InvalidArgument, match="repeat a page"):
        table.install_shared_prefix([held, held], pool)  # one page cannot hold two positions
    assert (pool.state, table.entries()) == (before, (None, None, None))


def test_reference_overflow_is_refused() -> None:
    pool = BlockPool(2, max_references=2)
    page = pool.allocate()
    pool.retain(page)
    with pytest.raises(ReferenceOverflow):
        pool.retain(page)
    assert pool.ref_count(page) == 2


def test_copy_on_write_allocates_before_releasing() -> None:
    pool = BlockPool(1)
    page = pool.allocate()
    pool.retain(page)
    before = pool.state
    with pytest.raises(Exhausted):
        pool.writable(page)  # the source must not be released when no copy can be made
    assert pool.state == before


def test_identity_gpu_table_matches_dense_page_order() -> None:
    config = PagedKvConfig.new(2, 2, 8, 40)
    assert config is not None
    assert config.logical_blocks_per_layer() == 3
    out = [INVALID_BLOCK] * config.required_single_sequence_blocks()
    assert fill_identity_block_table(config, out) == 6
    assert out == list(range(6))


def test_caller_buffer_rejects_short_table() -> None:
    config = PagedKvConfig.new(2, 2, 8, 40)
    assert config is not None
    out = [INVALID_BLOCK] * 5
    with pytest.raises(TableOutputTooSmall):
        fill_identity_block_table(config, out)
    assert out == [INVALID_BLOCK] * 5


def test_paged_config_validation() -> None:
    assert PagedKvConfig.new(0, 2, 8, 40) is None
    config = PagedKvConfig(24, 1, 1, 1, 16, 1)
    assert not config.is_valid()  # block size not a power of two
    assert PagedKvConfig(16, 1, 2, 4, 16, 1).block_elems() == 16 * 2 * 4 * 2
