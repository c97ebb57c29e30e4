"""A sliding window's (or a chunk's) decode: every query reads from its `context_starts` on, the
numpy oracle, the numba twin and the CUDA kernel (the simulator here, natively in
`gpu_check.sh`) agree, the entries before a window's start may hold the null page or nothing, and
the wrapper refuses a start past the context or an unmapped entry inside the window before any
launch."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.kernels import INVALID_BLOCK, paged_attention
from tests.kernels.kernel_batches import Batch, ragged_batch

SHAPES = st.fixed_dictionaries(
    {
        "kv_heads": st.sampled_from([1, 2]),
        "group": st.sampled_from([1, 4]),
        "head_dim": st.sampled_from([4, 12, 16]),
        "page_size": st.sampled_from([1, 3, 4, 16]),
        "dtype": st.sampled_from([np.float16, np.float32]),
        "requests": st.integers(1, 5),
        "max_context": st.integers(1, 40),
        "chunk": st.sampled_from([1, 3]),
    }
)


def windowed(rng: np.random.Generator, shape: dict[str, Any]) -> tuple[Batch, npt.NDArray[np.int32]]:
    """A ragged batch of the drawn shape and a start per query: 0, the middle of a page, a page's
    first row or the last position, at random."""
    batch = ragged_batch(
        rng,
        requests=shape["requests"],
        q_heads=shape["kv_heads"] * shape["group"],
        kv_heads=shape["kv_heads"],
        head_dim=shape["head_dim"],
        page_size=shape["page_size"],
        dtype=shape["dtype"],
        max_context=shape["max_context"],
        chunk=shape["chunk"],
        share_prefix=False,
    )
    lens = batch.context_lens.astype(np.int64)
    size = shape["page_size"]
    starts = [
        int(rng.choice([0, rng.integers(0, n), (rng.integers(0, n) // size) * size, n - 1])) for n in lens.tolist()
    ]
    return batch, np.array(starts, dtype=np.int32)


def unmapped_before(batch: Batch, starts: npt.NDArray[np.int32], page_size: int) -> None:
    """Every table entry before every query's window holds nothing (INVALID_BLOCK), as a released
    window's table does, unless a query of the same table still reads it (a chunk's earlier query)."""
    read: set[int] = set()
    behind: set[int] = set()
    for offset, start, length in zip(batch.table_offsets, starts, batch.context_lens, strict=True):
        read.update(range(int(offset) + int(start) // page_size, int(offset) + (int(length) - 1) // page_size + 1))
        behind.update(range(int(offset), int(offset) + int(start) // page_size))
    for entry in behind - read:
        batch.block_table[entry] = INVALID_BLOCK


@settings(max_examples=8, deadline=None)
@given(shape=SHAPES, seed=st.integers(0, 2**32 - 1))
def test_a_window_is_read_from_its_start_on_every_device(shape: dict[str, Any], seed: int, cuda_mode: str) -> None:
    batch, starts = windowed(np.random.default_rng(seed), shape)
    unmapped_before(batch, starts, shape["page_size"])
    expected = paged_attention(*batch.attention_args(), scale=batch.scale, device="numpy", context_starts=starts)
    for device in ("cpu", "cuda"):
        got = paged_attention(*batch.attention_args(), scale=batch.scale, device=device, context_starts=starts)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-6)


def test_a_window_is_not_the_full_context() -> None:
    """The oracle's window differs from full attention: the start is not ignored anywhere."""
    batch, _ = windowed(np.random.default_rng(3), {**dict.fromkeys(("kv_heads", "group"), 1), **BIG})
    starts = (batch.context_lens // 2).astype(np.int32)
    full = paged_attention(*batch.attention_args(), scale=batch.scale, device="numpy")
    for device in ("numpy", "cpu"):
        window = paged_attention(*batch.attention_args(), scale=batch.scale, device=device, context_starts=starts)
        assert not np.allclose(window, full)


BIG = {"head_dim": 16, "page_size": 4, "dtype": np.float32, "requests": 3, "max_context": 40, "chunk": 1}


@pytest.mark.parametrize("device", ["numpy", "cpu", "cuda"])
def test_a_start_the_context_does_not_reach_is_refused(device: str) -> None:
    batch, starts = windowed(np.random.default_rng(5), {**dict.fromkeys(("kv_heads", "group"), 1), **BIG})
    last = len(starts) - 1
    starts[last] = batch.context_lens[last]  # the last query would read nothing
    with pytest.raises(ValueError, match=rf"context_starts\[{last}\] = \d+ is not below context_lens\[{last}\]"):
        paged_attention(*batch.attention_args(), scale=batch.scale, device=device, context_starts=starts)
    starts[last] = -1
    with pytest.raises(ValueError, match=rf"context_starts\[{last}\] = -1 is out of range"):
        paged_attention(*batch.attention_args(), scale=batch.scale, device=device, context_starts=starts)


@pytest.mark.parametrize("device", ["numpy", "cpu", "cuda"])
def test_an_unmapped_entry_inside_the_window_is_refused(device: str) -> None:
    """The window's first entry is checked, where the one before it is not: the check starts at
    the window's page, not one past it."""
    batch, _ = windowed(np.random.default_rng(9), {**dict.fromkeys(("kv_heads", "group"), 1), **BIG})
    last = len(batch.context_lens) - 1
    starts = np.zeros(len(batch.context_lens), dtype=np.int32)
    starts[last] = int(batch.context_lens[last]) - 1
    entry = int(batch.table_offsets[last]) + int(starts[last]) // 4
    batch.block_table[entry] = INVALID_BLOCK
    with pytest.raises(ValueError, match=rf"query {last} reaches table entry {entry} .*INVALID_BLOCK"):
        paged_attention(*batch.attention_args(), scale=batch.scale, device=device, context_starts=starts)
