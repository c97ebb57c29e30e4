"""The kernel wrappers at the edges: ids, positions, lengths and offsets near 2**31 and 2**32,
page ids past the cache, empty batches, read-only and non-contiguous arrays. On numpy, the numba
CPU twin and the CUDA simulator alike, every call either refuses with a `ValueError` or
`TypeError` and leaves both caches exactly as they were, or returns what the numpy oracle returns;
no input crashes the process or touches memory outside its arrays."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kvsched.kernels import INVALID_BLOCK, append_kv, copy_pages, paged_attention

HEAD_DIM = 4
EDGES = (2**31 - 2, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**33)


@dataclass
class Call:
    """One wrapper call's inputs, drawn at the edges."""

    operation: str
    pages: int
    page_size: int
    block_table: npt.NDArray[np.uint32]
    offsets: npt.NDArray[np.int64]
    positions: npt.NDArray[np.int64]  # context lengths for attention, positions for an append
    pairs: npt.NDArray[np.int64]
    read_only: str  # "", "k_cache" or "v_cache"
    strided_table: bool
    scale: Any


def _index(limit: int) -> st.SearchStrategy[int]:
    """Mostly in range `[0, limit]`, a quarter of the time at an edge."""
    usual = st.integers(0, limit)
    return st.one_of(usual, usual, usual, st.sampled_from((-1, *EDGES)))


@st.composite
def calls(draw: st.DrawFn) -> Call:
    pages, page_size = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    entries = draw(st.integers(0, 6))
    valid = st.integers(0, pages - 1)
    page_ids = st.one_of(valid, valid, valid, st.sampled_from((pages, INVALID_BLOCK, 2**31 - 1, 2**31)))
    table = np.array(draw(st.lists(page_ids, min_size=entries, max_size=entries)), dtype=np.uint32)
    queries = draw(st.integers(0, 3))
    offsets = st.lists(_index(max(entries - 1, 0)), min_size=queries, max_size=queries)
    positions = st.lists(_index(entries * page_size), min_size=queries, max_size=queries)
    pair = st.tuples(_index(pages - 1), _index(pages - 1))
    return Call(
        operation=draw(st.sampled_from(("attention", "append", "copy"))),
        pages=pages,
        page_size=page_size,
        block_table=table,
        offsets=np.array(draw(offsets), dtype=np.int64),
        positions=np.array(draw(positions), dtype=np.int64),
        pairs=np.array(draw(st.lists(pair, max_size=3)), dtype=np.int64).reshape(-1, 2),
        read_only=draw(st.sampled_from(("", "", "", "", "", "k_cache", "v_cache"))),
        strided_table=draw(st.sampled_from((False, False, False, True))),
        scale=draw(st.sampled_from((0.5, 0.5, 0.5, 0.5, 0.5, 0.5, float("inf"), None, 1j, True))),
    )


def _caches(call: Call) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    rng = np.random.default_rng(0)
    shape = (call.pages, call.page_size, 1, HEAD_DIM)
    return rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)


def _run(call: Call, device: str) -> tuple[str, Any, npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """("ok", the result) or ("refused", the error), with the caches after the call."""
    k_cache, v_cache = _caches(call)
    rng = np.random.default_rng(1)
    queries = call.offsets.shape[0]
    q = rng.standard_normal((queries, 1, HEAD_DIM)).astype(np.float32)
    k = rng.standard_normal((queries, 1, HEAD_DIM)).astype(np.float32)
    table = np.repeat(call.block_table, 2)[::2] if call.strided_table else call.block_table.copy()
    if call.read_only:
        {"k_cache": k_cache, "v_cache": v_cache}[call.read_only].flags.writeable = False
    try:
        if call.operation == "attention":
            arguments = (q, k_cache, v_cache, table, call.offsets, call.positions)
            result: Any = paged_attention(*arguments, scale=call.scale, device=device)
        elif call.operation == "append":
            append_kv(k, k * 2, k_cache, v_cache, table, call.offsets, call.positions, device=device)
            result = None
        else:
            copy_pages(k_cache, v_cache, call.pairs, device=device)
            result = None
    except (ValueError, TypeError) as error:
        return "refused", f"{type(error).__name__}: {error}", k_cache, v_cache
    return "ok", result, k_cache, v_cache


def _check(call: Call, device: str) -> None:
    expected, actual = _run(call, "numpy"), _run(call, device)
    event(f"{call.operation}: {expected[0]}")
    assert actual[0] == expected[0], (expected[1], actual[1])
    if expected[0] == "refused":
        assert actual[1] == expected[1]
        for before, after in zip(_caches(call), actual[2:], strict=True):
            assert after.tobytes() == before.tobytes()  # a refusal changes nothing
        return
    if call.operation == "attention":
        np.testing.assert_allclose(actual[1], expected[1], rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(actual[2], expected[2])
    np.testing.assert_array_equal(actual[3], expected[3])


@settings(max_examples=5 * settings().max_examples)
@given(call=calls())
def test_the_cpu_twin_refuses_cleanly_or_agrees_with_the_oracle(call: Call) -> None:
    _check(call, "cpu")


@settings(max_examples=5 * settings().max_examples)
@given(call=calls())
def test_the_cuda_kernels_refuse_cleanly_or_agree_with_the_oracle(call: Call, cuda_mode: str) -> None:
    _check(call, "cuda")


def test_the_numpy_oracle_refuses_what_escapes_its_arrays() -> None:
    """The oracle's own refusals, which the other devices are held to: the wrap at 2**31 - 1, a
    context near 2**31 over a 4-entry table (refused without materializing its entries), a
    read-only V cache (refused before K is written), a scale that is not a real number."""
    call = Call(
        "append",
        4,
        4,
        np.arange(4, dtype=np.uint32),
        np.zeros(1, np.int64),
        np.array([2**31 - 1]),
        np.zeros((0, 2), np.int64),
        "",
        False,
        0.5,
    )
    assert _run(call, "numpy")[1] == "ValueError: positions[0] = 2147483647 is out of range [0, 2147483647)"
    long = Call(**{**vars(call), "operation": "attention", "positions": np.array([2**31 - 2])})
    assert "past the end of block_table (4 entries)" in _run(long, "numpy")[1]
    read_only = Call(**{**vars(call), "positions": np.array([1]), "read_only": "v_cache"})
    _, error, k_cache, _ = _run(read_only, "numpy")
    assert error == "ValueError: v_cache is read-only: the kernel writes it"
    assert k_cache.tobytes() == _caches(call)[0].tobytes()
    for scale in (None, 1j, True):
        complex_scale = Call(**{**vars(call), "operation": "attention", "positions": np.array([3]), "scale": scale})
        assert _run(complex_scale, "numpy")[1].startswith("TypeError: scale must be a real number")
