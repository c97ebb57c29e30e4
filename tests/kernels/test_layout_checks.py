"""Bad inputs raise ValueError, naming the query and the table entry, before anything is written
or launched, on every device."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kvsched.kernels import INVALID_BLOCK, append_kv, copy_pages, ops, paged_attention
from tests.kernels.kernel_batches import Batch, kv_rows, ragged_batch

DEVICES = ["numpy", "cpu", "cuda"]


def small_batch(dtype: Any = np.float32) -> Batch:
    return ragged_batch(
        np.random.default_rng(5),
        requests=3,
        q_heads=4,
        kv_heads=2,
        head_dim=8,
        page_size=4,
        dtype=dtype,
        max_context=20,
        share_prefix=False,
    )


class LaunchSpy:
    """Stands in for a kernel object and records any launch: validation must prevent them all."""

    def __init__(self) -> None:
        self.launches = 0

    def __getitem__(self, config: object) -> Any:
        self.launches += 1
        raise AssertionError(f"kernel launched with {config} despite invalid input")


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each device; for "cuda", every kernel is replaced by a spy that fails the test if launched."""
    name: str = request.param
    if name != "cuda":
        yield name
        return
    request.getfixturevalue("cuda_mode")
    from kvsched.kernels import cuda_attention, cuda_cache

    spies = [LaunchSpy() for _ in range(4)]
    monkeypatch.setattr(cuda_attention, "paged_attention_kernel", spies[0])
    monkeypatch.setattr(cuda_cache, "append_kv_kernel", spies[1])
    monkeypatch.setattr(cuda_cache, "copy_pages_kernel", spies[2])
    monkeypatch.setattr(cuda_cache, "copy_tier_kernel", spies[3])
    yield name
    assert sum(spy.launches for spy in spies) == 0


def first_entry(batch: Batch, query: int) -> int:
    return int(batch.table_offsets[query])


def test_page_id_past_the_cache_names_query_and_entry(device: str) -> None:
    batch = small_batch()
    query = int(np.argmax(batch.context_lens))
    entry = first_entry(batch, query) + (int(batch.context_lens[query]) - 1) // 4
    batch.block_table[entry] = batch.k_cache.shape[0]
    with pytest.raises(ValueError, match=rf"query {query} reaches table entry {entry} .*page {batch.k_cache.shape[0]}"):
        paged_attention(*batch.attention_args(), scale=batch.scale, device=device)


def test_unmapped_entry_inside_the_context_is_refused(device: str) -> None:
    batch = small_batch()
    entry = first_entry(batch, 1)
    batch.block_table[entry] = INVALID_BLOCK
    with pytest.raises(ValueError, match=rf"query 1 reaches table entry {entry} .*INVALID_BLOCK"):
        paged_attention(*batch.attention_args(), scale=batch.scale, device=device)


def test_unmapped_entries_past_the_context_are_never_read() -> None:
    batch = small_batch()
    query = 0
    past = first_entry(batch, query) + (int(batch.context_lens[query]) - 1) // 4 + 1
    assert batch.block_table[past] == INVALID_BLOCK  # the factory pads every table with one
    out = paged_attention(*batch.attention_args(), scale=batch.scale, device="cpu")
    assert np.isfinite(out).all()


def test_reaching_past_the_block_table_is_refused(device: str) -> None:
    batch = small_batch()
    batch.table_offsets[2] = batch.block_table.shape[0] - 1
    batch.context_lens[2] = 9  # three pages from the last entry
    with pytest.raises(ValueError, match=r"query 2 reaches table entry \d+ .*past the end of block_table"):
        paged_attention(*batch.attention_args(), scale=batch.scale, device=device)


def test_reaching_into_the_next_requests_table_is_refused(device: str) -> None:
    batch = small_batch()
    query = int(np.argmax(batch.context_lens))
    assert batch.context_lens[query] > 4
    lengths = batch.table_lengths.copy()
    lengths[query] = 1
    with pytest.raises(ValueError, match=rf"query {query} reaches logical page \d+ but owns only 1"):
        paged_attention(*batch.attention_args(), scale=batch.scale, device=device, table_lengths=lengths)


@pytest.mark.parametrize(
    ("field", "bad", "message"),
    [
        ("q", lambda b: b.q.astype(np.float64), "q must have dtype float32"),
        ("q", lambda b: np.asfortranarray(b.q), "q must be C-contiguous"),
        ("q", lambda b: np.ascontiguousarray(b.q[:, :3]), "multiple of kv_heads"),
        ("k_cache", lambda b: b.k_cache.astype(np.int16), "k_cache must have dtype"),
        ("k_cache", lambda b: b.k_cache[:, :, :, ::2], "k_cache must be C-contiguous"),
        ("v_cache", lambda b: b.v_cache.astype(np.float16), "k_cache is float32 but v_cache is float16"),
        ("block_table", lambda b: b.block_table.astype(np.int64), "block_table must have dtype uint32"),
        ("table_offsets", lambda b: b.table_offsets[:-1], "one per query"),
        ("context_lens", lambda b: b.context_lens * 0, r"context_lens\[0\] = 0 is out of range"),
        ("table_offsets", lambda b: b.table_offsets.astype(np.float32), "1-D integer"),
    ],
)
def test_malformed_attention_inputs_are_refused(device: str, field: str, bad: Any, message: str) -> None:
    batch = small_batch()
    setattr(batch, field, bad(batch))
    with pytest.raises(ValueError, match=message):
        paged_attention(*batch.attention_args(), scale=batch.scale, device=device)


def test_too_wide_groups_and_heads_are_refused(device: str) -> None:
    one: dict[str, Any] = {"requests": 1, "kv_heads": 1, "page_size": 4, "dtype": np.float32, "max_context": 5}
    wide = ragged_batch(np.random.default_rng(1), q_heads=16, head_dim=8, **one)
    with pytest.raises(ValueError, match="at most 8 times"):
        paged_attention(*wide.attention_args(), scale=wide.scale, device=device)
    tall = ragged_batch(np.random.default_rng(1), q_heads=1, head_dim=129, **one)
    with pytest.raises(ValueError, match=r"head_dim must be in \[1, 128\]"):
        paged_attention(*tall.attention_args(), scale=tall.scale, device=device)


def test_a_bad_append_writes_nothing(device: str) -> None:
    batch = small_batch(np.float16)
    k, v = kv_rows(np.random.default_rng(2), batch)
    positions = batch.context_lens - 1
    entry = first_entry(batch, 2) + int(positions[2]) // 4
    batch.block_table[entry] = INVALID_BLOCK
    k_before, v_before = batch.k_cache.copy(), batch.v_cache.copy()
    with pytest.raises(ValueError, match=rf"query 2 reaches table entry {entry}"):
        append_kv(k, v, batch.k_cache, batch.v_cache, batch.block_table, batch.table_offsets, positions, device=device)
    np.testing.assert_array_equal(batch.k_cache, k_before)
    np.testing.assert_array_equal(batch.v_cache, v_before)


def test_two_appends_to_one_cache_row_are_refused(device: str) -> None:
    batch = small_batch()
    k, v = kv_rows(np.random.default_rng(2), batch)
    offsets = np.zeros_like(batch.table_offsets)
    positions = np.array([5, 6, 5], dtype=np.int32)
    with pytest.raises(ValueError, match="queries 0 and 2 both write page"):
        append_kv(k, v, batch.k_cache, batch.v_cache, batch.block_table, offsets, positions, device=device)


def test_append_rows_must_match_the_cache(device: str) -> None:
    batch = small_batch()
    k, v = kv_rows(np.random.default_rng(2), batch)
    with pytest.raises(ValueError, match=r"must both be \[queries, 2, 8\]"):
        append_kv(
            np.ascontiguousarray(k[:, :1]),
            np.ascontiguousarray(v[:, :1]),
            batch.k_cache,
            batch.v_cache,
            batch.block_table,
            batch.table_offsets,
            batch.context_lens - 1,
            device=device,
        )


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        ([(0, 40)], r"pair 0 \(0 -> 40\) names a page outside"),
        ([(1, 2), (3, 3)], "pair 1 copies page 3 onto itself"),
        ([(1, 2), (3, 2)], "write a destination page twice"),
        ([(1, 2), (2, 4)], r"pages \[2\] are both a source and a destination"),
        ([(1, 2, 3)], "pairs must be integer"),
    ],
)
def test_bad_copies_copy_nothing(device: str, pairs: Any, message: str) -> None:
    batch = small_batch()
    k_before = batch.k_cache.copy()
    with pytest.raises(ValueError, match=message):
        copy_pages(batch.k_cache, batch.v_cache, pairs, device=device)
    np.testing.assert_array_equal(batch.k_cache, k_before)


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        ([(0, 7)], "outside the destination tier"),
        ([(2**40, 0)], "outside the source tier"),
        ([(0, 1), (2, 1)], "destination page twice"),
    ],
)
def test_bad_tier_copies_copy_nothing_and_launch_nothing(device: str, pairs: Any, message: str) -> None:
    shape = (2, 5, 4, 1, 8)
    source = (np.ones(shape, np.float32), np.ones(shape, np.float32))
    host = (np.zeros((2, 7, *shape[2:]), np.float32), np.zeros((2, 7, *shape[2:]), np.float32))
    with pytest.raises(ValueError, match=message):
        ops.copy_tier(source, host, np.asarray(pairs, dtype=np.int64), device=device)
    assert not host[0].any() and not host[1].any()


def test_unknown_device_is_refused() -> None:
    batch = small_batch()
    with pytest.raises(ValueError, match="device must be one of numpy, cpu, cuda; got 'tpu'"):
        paged_attention(*batch.attention_args(), scale=batch.scale, device="tpu")


class _NativeDeviceArray:
    """What the checks see of a native numba-cuda `DeviceNDArray` (which needs a GPU to build):
    its `flags` is a dict of the contiguity flags alone, with no WRITEABLE entry."""

    def __init__(self, array: Any) -> None:
        self.shape, self.dtype = array.shape, array.dtype
        self.flags = {"C_CONTIGUOUS": True, "F_CONTIGUOUS": array.ndim <= 1}


def test_a_native_device_array_is_writable_and_a_read_only_host_array_is_not() -> None:
    from kvsched.kernels.layout import check_writable

    check_writable("k_cache", _NativeDeviceArray(np.zeros((2, 3), np.float16)))
    frozen = np.zeros((2, 3), np.float16)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="k_cache is read-only"):
        check_writable("k_cache", frozen)
