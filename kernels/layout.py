"""The paged KV layout and the checks every kernel wrapper runs before it launches anything.

A query token at position `t` finds its key and value through its slice of the flat block table:

    block_table:  [ ... | e0 e1 e2 e3 | ... ]        uint32, INVALID_BLOCK where unmapped
                          ^ table_offset of this query
    position t  ->  logical page t // page_size  ->  entry block_table[table_offset + t // page_size]
                ->  physical page p = that entry  ->  row t % page_size
    k_cache[p, t % page_size, kv_head, :]           [pages, page_size, kv_heads, head_dim]

    e.g. page_size 4, t = 9: logical page 2, entry e2, row 1.

The invariant kept here: no kernel ever receives a table in which a position it will touch maps
to an entry outside the table, to `INVALID_BLOCK`, or to a page id at or beyond the cache size.
A bad table would otherwise read (or overwrite) another request's KV, so every wrapper calls
`check_reachable_pages` on the host and raises `ValueError` naming the query and the table entry.

Every index check runs in int64 against explicit bounds (a position, length or offset below
`MAX_INDEX`, so `position + 1` and `offset + logical page` never wrap in a kernel's int32), in
memory proportional to the arrays passed, never to a number inside them, and every array a
kernel writes is checked writable before anything is written. A refusal is a `ValueError`
(a `TypeError` for a scale that is not a real number) naming the argument.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import numpy.typing as npt

from kvsched.spec.batch import INVALID_BLOCK

__all__ = [
    "CACHE_DTYPES",
    "INVALID_BLOCK",
    "MAX_GROUP",
    "MAX_HEAD_DIM",
    "check_array",
    "check_block_table",
    "check_cache_pair",
    "check_index_vector",
    "check_reachable_pages",
    "check_writable",
]

# Compile-time limits shared by the CUDA kernels (shared-memory tiles are sized by them) and
# enforced for every device so the three implementations accept exactly the same inputs.
MAX_HEAD_DIM = 128  # head_dim in [1, 128]: one shared-memory row per staged token
MAX_GROUP = 8  # q_heads // kv_heads in [1, 8]: the q heads one block serves per kv head

CACHE_DTYPES = (np.dtype(np.float16), np.dtype(np.float32))
# Every position, context length, table offset and table entry index stays below this, so the
# kernels' int32 arithmetic on them (position + 1, offset + logical page) cannot overflow.
MAX_INDEX = 2**31 - 1


def check_array(name: str, array: Any, dtypes: tuple[np.dtype[Any], ...], ndim: int) -> None:
    """Reject anything but a C-contiguous array of one of `dtypes` with `ndim` axes.

    Device arrays (numba-cuda) pass too: they carry the same `dtype`, `shape` and contiguity flag.
    """
    dtype = getattr(array, "dtype", None)
    shape = getattr(array, "shape", None)
    if dtype is None or shape is None:
        raise ValueError(f"{name} must be an array, got {type(array).__name__}")
    if np.dtype(dtype) not in dtypes:
        allowed = " or ".join(str(d) for d in dtypes)
        raise ValueError(f"{name} must have dtype {allowed}, got {np.dtype(dtype)}")
    if len(shape) != ndim:
        raise ValueError(f"{name} must have {ndim} axes, got shape {tuple(shape)}")
    if not _is_c_contiguous(array):
        raise ValueError(f"{name} must be C-contiguous (pass np.ascontiguousarray({name}))")


def _is_c_contiguous(array: Any) -> bool:
    flags = getattr(array, "flags", None)
    if flags is not None and not callable(flags):
        return bool(flags["C_CONTIGUOUS"])
    is_c = getattr(array, "is_c_contiguous", None)
    return bool(is_c()) if callable(is_c) else False


def check_cache_pair(k_cache: Any, v_cache: Any, ndim: int = 4) -> tuple[int, int, int, int]:
    """Validate the K and V caches together; returns `(pages, page_size, kv_heads, head_dim)`.

    `ndim=5` accepts caches with a leading layer axis, `[layers, pages, page_size, kv_heads, head_dim]`.
    """
    check_array("k_cache", k_cache, CACHE_DTYPES, ndim)
    check_array("v_cache", v_cache, CACHE_DTYPES, ndim)
    if np.dtype(k_cache.dtype) != np.dtype(v_cache.dtype):
        raise ValueError(f"k_cache is {np.dtype(k_cache.dtype)} but v_cache is {np.dtype(v_cache.dtype)}")
    if tuple(k_cache.shape) != tuple(v_cache.shape):
        raise ValueError(f"k_cache shape {tuple(k_cache.shape)} != v_cache shape {tuple(v_cache.shape)}")
    pages, page_size, kv_heads, head_dim = (int(n) for n in tuple(k_cache.shape)[-4:])
    if page_size < 1 or kv_heads < 1:
        raise ValueError(f"caches need page_size >= 1 and kv_heads >= 1, got shape {tuple(k_cache.shape)}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be in [1, {MAX_HEAD_DIM}], got {head_dim}")
    return pages, page_size, kv_heads, head_dim


def check_index_vector(name: str, values: Any, count: int, *, low: int, high: int = MAX_INDEX) -> npt.NDArray[np.int32]:
    """A length-`count` vector of integers in `[low, high)`, as the int32 array the kernels index
    with (compared as Python ints: no dtype can wrap the bounds)."""
    if not isinstance(values, np.ndarray) or values.ndim != 1 or values.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a 1-D integer numpy array")
    if values.shape[0] != count:
        raise ValueError(f"{name} has {values.shape[0]} entries, expected one per query ({count})")
    if count and (int(values.min()) < low or int(values.max()) >= high):
        bad = next(index for index, value in enumerate(values.tolist()) if not low <= value < high)
        raise ValueError(f"{name}[{bad}] = {int(values[bad])} is out of range [{low}, {high})")
    return np.ascontiguousarray(values, dtype=np.int32)


def check_block_table(block_table: Any) -> None:
    """A C-contiguous uint32 vector whose every entry index is below `MAX_INDEX`."""
    check_array("block_table", block_table, (np.dtype(np.uint32),), 1)
    if int(block_table.shape[0]) > MAX_INDEX:
        raise ValueError(f"block_table has {int(block_table.shape[0])} entries, more than 2**31 - 1")


def check_writable(name: str, array: Any) -> None:
    """Reject a host array that cannot be written (device arrays always can: a native numba-cuda
    array's `flags` has no WRITEABLE entry at all)."""
    if isinstance(array, np.ndarray) and not array.flags.writeable:
        raise ValueError(f"{name} is read-only: the kernel writes it")


def check_scale(scale: Any) -> float:
    """`scale` as a float: a finite real number."""
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number, got {type(scale).__name__}")
    value = float(scale)
    if not np.isfinite(value):
        raise ValueError(f"scale must be finite, got {scale}")
    return value


def check_reachable_pages(
    block_table: npt.NDArray[np.uint32],  # [entries] uint32
    table_offsets: npt.NDArray[np.int32],  # [queries] int32
    first_positions: npt.NDArray[np.integer[Any]],  # [queries], first position each query touches
    end_positions: npt.NDArray[np.integer[Any]],  # [queries], one past the last position it touches
    page_size: int,
    pages: int,
    table_lengths: npt.NDArray[np.int32] | None = None,  # [queries] int32, entries each query owns
) -> None:
    """Raise `ValueError` unless every table entry a query reaches names a page of the cache.

    Query `i` touches positions `[first_positions[i], end_positions[i])`, hence logical pages
    `first // page_size .. (end - 1) // page_size`: a contiguous run of table entries from
    `table_offsets[i] + first // page_size`. With `table_lengths`, a query may not reach past
    its own slice of the table (that would be the next request's table). Runs in int64, in
    O(entries + queries) memory: each run is checked against a prefix count of bad entries.
    """
    first = first_positions.astype(np.int64)
    end = end_positions.astype(np.int64)
    first_page = first // page_size
    spans = np.where(end > first, (end - 1) // page_size + 1 - first_page, 0)
    if table_lengths is not None:
        over = np.flatnonzero(first_page + spans > table_lengths)
        if over.size:
            i = int(over[0])
            raise ValueError(
                f"query {i} reaches logical page {int(first_page[i] + spans[i] - 1)} "
                f"but owns only {int(table_lengths[i])} table entries"
            )
    start = table_offsets.astype(np.int64) + first_page
    stop = start + spans  # one past the last entry each query reaches
    entries = int(block_table.shape[0])
    outside = np.flatnonzero((spans > 0) & (stop > entries))
    if outside.size:
        i = int(outside[0])
        entry = max(entries, int(start[i]))
        raise ValueError(
            f"query {i} reaches table entry {entry} (logical page {entry - int(start[i]) + int(first_page[i])}), "
            f"past the end of block_table ({entries} entries)"
        )
    bad = block_table >= pages
    before = np.concatenate(([0], np.cumsum(bad, dtype=np.int64)))  # bad entries before each index
    hit = np.flatnonzero((spans > 0) & (before[np.minimum(stop, entries)] > before[np.minimum(start, entries)]))
    if hit.size:
        i = int(hit[0])
        entry = int(start[i]) + int(np.flatnonzero(bad[int(start[i]) : int(stop[i])])[0])
        page = int(block_table[entry])
        what = "INVALID_BLOCK (unmapped)" if page == INVALID_BLOCK else f"page {page}"
        raise ValueError(
            f"query {i} reaches table entry {entry} (logical page "
            f"{entry - int(start[i]) + int(first_page[i])}) holding {what}, outside the cache of {pages} pages"
        )


def check_attention(
    q: Any,  # [queries, q_heads, head_dim] float32
    k_cache: Any,  # [pages, page_size, kv_heads, head_dim] float16 | float32
    v_cache: Any,  # [pages, page_size, kv_heads, head_dim] same dtype as k_cache
    block_table: Any,  # [entries] uint32
    table_offsets: Any,  # [queries] integer
    context_lens: Any,  # [queries] integer >= 1
    scale: float,
    table_lengths: Any = None,  # [queries] integer, or None
    context_starts: Any = None,  # [queries] integer in [0, context_len), or None (all 0)
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """Validate a paged-attention call; returns `(table_offsets, context_lens, context_starts)` as
    int32. Only the entries of positions `[context_start, context_len)` must name pages: a
    window's entries before its start (the null page, or anything) are never read."""
    check_array("q", q, (np.dtype(np.float32),), 3)
    pages, page_size, kv_heads, head_dim = check_cache_pair(k_cache, v_cache)
    queries, q_heads, q_dim = (int(n) for n in q.shape)
    if q_dim != head_dim:
        raise ValueError(f"q has head_dim {q_dim} but the caches have {head_dim}")
    if q_heads % kv_heads or not 1 <= q_heads // kv_heads <= MAX_GROUP:
        raise ValueError(f"q_heads ({q_heads}) must be a multiple of kv_heads ({kv_heads}) at most {MAX_GROUP} times")
    check_scale(scale)
    check_block_table(block_table)
    offsets = check_index_vector("table_offsets", table_offsets, queries, low=0)
    lens = check_index_vector("context_lens", context_lens, queries, low=1)
    lengths = None if table_lengths is None else check_index_vector("table_lengths", table_lengths, queries, low=0)
    starts = (
        np.zeros(queries, dtype=np.int32)
        if context_starts is None
        else check_index_vector("context_starts", context_starts, queries, low=0)
    )
    empty = np.flatnonzero(starts.astype(np.int64) >= lens.astype(np.int64))
    if empty.size:
        i = int(empty[0])
        raise ValueError(
            f"context_starts[{i}] = {int(starts[i])} is not below context_lens[{i}] = {int(lens[i])}: "
            "the query would read no position"
        )
    check_reachable_pages(block_table, offsets, starts, lens, page_size, pages, lengths)
    return offsets, lens, starts


def check_append(
    k: Any,  # [queries, kv_heads, head_dim] float32
    v: Any,  # [queries, kv_heads, head_dim] float32
    k_cache: Any,  # [pages, page_size, kv_heads, head_dim] float16 | float32
    v_cache: Any,  # [pages, page_size, kv_heads, head_dim] same dtype as k_cache
    block_table: Any,  # [entries] uint32
    table_offsets: Any,  # [queries] integer
    positions: Any,  # [queries] integer >= 0
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """Validate a KV append; returns `(table_offsets, positions)` as int32.

    Two queries writing the same cache row would race on a GPU, so that is refused too.
    """
    check_array("k", k, (np.dtype(np.float32),), 3)
    check_array("v", v, (np.dtype(np.float32),), 3)
    pages, page_size, kv_heads, head_dim = check_cache_pair(k_cache, v_cache)
    if tuple(k.shape) != tuple(v.shape) or tuple(k.shape[1:]) != (kv_heads, head_dim):
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must both be [queries, {kv_heads}, {head_dim}]")
    queries = int(k.shape[0])
    check_writable("k_cache", k_cache)
    check_writable("v_cache", v_cache)
    check_block_table(block_table)
    offsets = check_index_vector("table_offsets", table_offsets, queries, low=0)
    where = check_index_vector("positions", positions, queries, low=0)
    check_reachable_pages(block_table, offsets, where, where.astype(np.int64) + 1, page_size, pages)
    slots = block_table[offsets.astype(np.int64) + where // page_size].astype(np.int64) * page_size
    slots += where % page_size
    unique, counts = np.unique(slots, return_counts=True)
    if unique.shape[0] != queries:
        twice = int(unique[np.flatnonzero(counts > 1)[0]])
        hits = np.flatnonzero(slots == twice)
        raise ValueError(
            f"queries {int(hits[0])} and {int(hits[1])} both write page {twice // page_size} row {twice % page_size}"
        )
    return offsets, where


def check_copy(
    k_cache: Any,  # [pages, page_size, kv_heads, head_dim] or [layers, pages, ...] float16 | float32
    v_cache: Any,  # same shape and dtype as k_cache
    pairs: Any,  # [copies, 2] integer (source, destination), or a sequence of pairs
) -> npt.NDArray[np.int32]:
    """Validate a batched page copy; returns the pairs as a contiguous int32 `[copies, 2]` array.

    A destination may appear once and never as another pair's source: the copies of one launch
    run concurrently, so any overlap would make the result depend on their order.
    """
    layered = len(getattr(k_cache, "shape", ())) == 5
    pages = check_cache_pair(k_cache, v_cache, 5 if layered else 4)[0]
    check_writable("k_cache", k_cache)
    check_writable("v_cache", v_cache)
    table = _pair_table(pairs)
    for index, (source, destination) in enumerate(table.tolist()):
        if not (0 <= source < pages and 0 <= destination < pages):
            raise ValueError(f"pair {index} ({source} -> {destination}) names a page outside [0, {pages})")
        if source == destination:
            raise ValueError(f"pair {index} copies page {source} onto itself")
    checked = _written_once(table)
    overlap = set(table[:, 1].tolist()) & set(table[:, 0].tolist())
    if overlap:
        raise ValueError(f"pages {sorted(overlap)} are both a source and a destination in one copy batch")
    return checked


def _pair_table(pairs: Any) -> npt.NDArray[Any]:
    """`pairs` as a `[copies, 2]` integer array, as given (its pages are the caller's to check,
    against its tiers, before `_written_once` narrows it)."""
    table = np.asarray(pairs)
    if table.size == 0:
        return np.zeros((0, 2), dtype=np.int32)
    if table.ndim != 2 or table.shape[1] != 2 or table.dtype.kind not in "iu":
        raise ValueError(f"pairs must be integer (source, destination) pairs, got shape {table.shape}")
    return table


def _written_once(table: npt.NDArray[Any]) -> npt.NDArray[np.int32]:
    """The checked pairs as a contiguous int32 array, once no destination is named twice (the
    copies of one launch run concurrently)."""
    destinations = table[:, 1].tolist()
    if len(set(destinations)) != len(destinations):
        raise ValueError(f"pairs write a destination page twice: {destinations}")
    return np.ascontiguousarray(table, dtype=np.int32)


def check_tier_copy(
    source: tuple[Any, Any],  # K and V, [layers, pages, page_size, kv_heads, head_dim] float16 | float32
    destination: tuple[Any, Any],  # the other tier's K and V: the same but for the page count
    pairs: Any,  # [copies, 2] integer (source page, destination page), or a sequence of pairs
) -> npt.NDArray[np.int32]:
    """Validate a batched copy of pages from one tier's caches into another's; returns the pairs
    as a contiguous int32 `[copies, 2]` array. Every page is checked against its own tier's page
    count (in Python's integers: no overflow), and a destination page may appear once (the copies
    of one launch run concurrently)."""
    source_pages = check_cache_pair(*source, 5)[0]
    destination_pages = check_cache_pair(*destination, 5)[0]
    shapes = tuple(source[0].shape), tuple(destination[0].shape)
    if shapes[0][:1] + shapes[0][2:] != shapes[1][:1] + shapes[1][2:]:
        raise ValueError(f"tiers of different page shapes: {shapes[0]} and {shapes[1]}")
    if np.dtype(source[0].dtype) != np.dtype(destination[0].dtype):
        raise ValueError(f"tiers of different dtypes: {np.dtype(source[0].dtype)} and {np.dtype(destination[0].dtype)}")
    check_writable("destination k_cache", destination[0])
    check_writable("destination v_cache", destination[1])
    table = _pair_table(pairs)
    for index, (page, target) in enumerate(table.tolist()):
        if not 0 <= page < source_pages:
            raise ValueError(f"pair {index} reads page {page}, outside the source tier's [0, {source_pages})")
        if not 0 <= target < destination_pages:
            raise ValueError(
                f"pair {index} writes page {target}, outside the destination tier's [0, {destination_pages})"
            )
    return _written_once(table)
