"""The two kernels that write the paged KV cache: appending each query token's K and V at its
position, and copying whole pages for copy-on-write.

Both are one thread per element written, so consecutive threads write consecutive addresses. The
wrappers refuse inputs under which two threads would write the same element (two queries at one
cache row; a page that is both a copy's source and another's destination), because threads of one
launch run in no defined order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from kvsched.kernels.device import cuda, is_host, jit, kernel_options, on_device
from kvsched.kernels.layout import check_append, check_copy, check_tier_copy

THREADS = 256  # threads per block for both kernels: a multiple of the warp size


@jit(device=True)
def row_of(
    block_table: Any,  # [entries] uint32
    table_offset: int,
    position: int,
    page_size: int,
) -> tuple[int, int]:
    """(physical page, row) of `position` in a query's table (see `kvsched.kernels.layout`)."""
    logical = position // page_size
    return block_table[table_offset + logical], position - logical * page_size


@jit(**kernel_options((THREADS,)))
def append_kv_kernel(
    k: Any,  # [queries, kv_heads, head_dim] float32
    v: Any,  # [queries, kv_heads, head_dim] float32
    k_cache: Any,  # [pages, page_size, kv_heads, head_dim] float16 | float32, written
    v_cache: Any,  # [pages, page_size, kv_heads, head_dim] same dtype as k_cache, written
    block_table: Any,  # [entries] uint32, each query's entry validated < pages
    table_offsets: Any,  # [queries] int32
    positions: Any,  # [queries] int32
) -> None:
    """Thread i writes element i of `k` and of `v` (flattened) into its query's cache row."""
    i = cuda.grid(1)
    kv_heads, head_dim = k.shape[1], k.shape[2]
    if i >= k.shape[0] * kv_heads * head_dim:
        return
    query = i // (kv_heads * head_dim)
    rest = i - query * kv_heads * head_dim
    kv_head = rest // head_dim
    d = rest - kv_head * head_dim
    page, row = row_of(block_table, table_offsets[query], positions[query], k_cache.shape[1])
    k_cache[page, row, kv_head, d] = k[query, kv_head, d]
    v_cache[page, row, kv_head, d] = v[query, kv_head, d]


@jit(**kernel_options((THREADS,)))
def copy_pages_kernel(
    k_cache: Any,  # [layers, pages, page_elements] float16 | float32, written
    v_cache: Any,  # [layers, pages, page_elements] same dtype as k_cache, written
    pairs: Any,  # [copies, 2] int32 (source, destination), validated
) -> None:
    """Thread i copies one element of one layer of one pair's page, in K and in V."""
    i = cuda.grid(1)
    layers, page_elements = k_cache.shape[0], k_cache.shape[2]
    if i >= pairs.shape[0] * layers * page_elements:
        return
    pair = i // (layers * page_elements)
    rest = i - pair * layers * page_elements
    layer = rest // page_elements
    e = rest - layer * page_elements
    source, destination = pairs[pair, 0], pairs[pair, 1]
    k_cache[layer, destination, e] = k_cache[layer, source, e]
    v_cache[layer, destination, e] = v_cache[layer, source, e]


@jit(**kernel_options((THREADS,)))
def copy_tier_kernel(
    source_k: Any,  # [layers, source pages, page_elements] float16 | float32
    source_v: Any,  # the same
    destination_k: Any,  # [layers, destination pages, page_elements] same dtype, written
    destination_v: Any,  # the same, written
    pairs: Any,  # [copies, 2] int32 (source page, destination page), validated
) -> None:
    """Thread i copies one element of one layer of one pair's page from one tier to the other,
    in K and in V."""
    i = cuda.grid(1)
    layers, page_elements = source_k.shape[0], source_k.shape[2]
    if i >= pairs.shape[0] * layers * page_elements:
        return
    pair = i // (layers * page_elements)
    rest = i - pair * layers * page_elements
    layer = rest // page_elements
    e = rest - layer * page_elements
    source, destination = pairs[pair, 0], pairs[pair, 1]
    destination_k[layer, destination, e] = source_k[layer, source, e]
    destination_v[layer, destination, e] = source_v[layer, source, e]


def launch_append_kv(
    k: Any,  # [queries, kv_heads, head_dim] float32, host
    v: Any,  # [queries, kv_heads, head_dim] float32, host
    k_cache: Any,  # [pages, page_size, kv_heads, head_dim] float16 | float32, host or device, written
    v_cache: Any,  # [pages, page_size, kv_heads, head_dim] same dtype as k_cache, written
    block_table: Any,  # [entries] uint32, host
    table_offsets: Any,  # [queries] integer, host
    positions: Any,  # [queries] integer >= 0, host
) -> None:
    """Validate, launch, and (for host caches) copy the written caches back.

    Raises `ValueError` before any transfer or launch on a bad input.
    """
    offsets, where = check_append(k, v, k_cache, v_cache, block_table, table_offsets, positions)
    elements = int(np.prod(k.shape))
    if elements == 0:
        return
    threads_per_block = THREADS
    blocks_per_grid = (elements + THREADS - 1) // THREADS
    device_k, device_v = on_device(k_cache), on_device(v_cache)
    append_kv_kernel[blocks_per_grid, threads_per_block](
        cuda.to_device(k),
        cuda.to_device(v),
        device_k,
        device_v,
        cuda.to_device(block_table),
        cuda.to_device(offsets),
        cuda.to_device(where),
    )
    _copy_back(device_k, k_cache)
    _copy_back(device_v, v_cache)


def launch_copy_pages(
    k_cache: Any,  # [pages, ...] or [layers, pages, ...] float16 | float32, host or device, written
    v_cache: Any,  # same shape and dtype as k_cache, written
    pairs: Any,  # [copies, 2] integer (source, destination), host
) -> None:
    """Validate, launch one copy of every pair's page in every layer, and (for host caches) copy
    the caches back. Raises `ValueError` before any transfer or launch on a bad input."""
    table = check_copy(k_cache, v_cache, pairs)
    shape = tuple(int(n) for n in k_cache.shape)
    layers = shape[0] if len(shape) == 5 else 1
    pages = shape[-4]
    page_elements = shape[-3] * shape[-2] * shape[-1]
    elements = table.shape[0] * layers * page_elements
    if elements == 0:
        return
    threads_per_block = THREADS
    blocks_per_grid = (elements + THREADS - 1) // THREADS
    device_k, device_v = on_device(k_cache), on_device(v_cache)
    copy_pages_kernel[blocks_per_grid, threads_per_block](
        device_k.reshape(layers, pages, page_elements),
        device_v.reshape(layers, pages, page_elements),
        cuda.to_device(table),
    )
    _copy_back(device_k, k_cache)
    _copy_back(device_v, v_cache)


def launch_copy_tier(source: tuple[Any, Any], destination: tuple[Any, Any], pairs: Any) -> None:
    """Validate, launch one copy of every pair's page in every layer from the `source` tier's K
    and V into the `destination` tier's (host or device arrays). Only the pages moved cross the
    bus: a host source's pages are gathered before the launch, a host destination's are staged on
    the device and scattered after it. Raises `ValueError` before any transfer or launch on bad input."""
    table = check_tier_copy(source, destination, pairs)
    for name, tier in (("source", source), ("destination", destination)):
        if is_host(tier[0]) != is_host(tier[1]):
            raise ValueError(f"the {name} tier's K and V must both be host arrays or both device arrays")
    layers = int(source[0].shape[0])
    page_elements = int(np.prod(source[0].shape[2:]))
    elements = table.shape[0] * layers * page_elements
    if elements == 0:
        return
    blocks_per_grid = (elements + THREADS - 1) // THREADS
    source_k, source_v, reads = _read_side(source, table[:, 0])
    destination_k, destination_v, writes = _write_side(destination, table[:, 1])
    copy_tier_kernel[blocks_per_grid, THREADS](
        source_k.reshape(layers, source_k.shape[1], page_elements),
        source_v.reshape(layers, source_v.shape[1], page_elements),
        destination_k.reshape(layers, destination_k.shape[1], page_elements),
        destination_v.reshape(layers, destination_v.shape[1], page_elements),
        cuda.to_device(np.ascontiguousarray(np.stack([reads, writes], axis=1))),
    )
    if is_host(destination[0]):
        pages = table[:, 1]
        destination[0][:, pages] = destination_k.copy_to_host()
        destination[1][:, pages] = destination_v.copy_to_host()


def _read_side(tier: tuple[Any, Any], pages: npt.NDArray[np.int32]) -> tuple[Any, Any, npt.NDArray[np.int32]]:
    """The tier's K and V as the kernel reads them, and the page each copy reads there: a device
    tier as it is; a host tier's moved pages alone, gathered and sent (copy i reads page i)."""
    if not is_host(tier[0]):
        return tier[0], tier[1], pages
    staged = np.arange(pages.shape[0], dtype=np.int32)
    return (
        cuda.to_device(np.ascontiguousarray(tier[0][:, pages])),
        cuda.to_device(np.ascontiguousarray(tier[1][:, pages])),
        staged,
    )


def _write_side(tier: tuple[Any, Any], pages: npt.NDArray[np.int32]) -> tuple[Any, Any, npt.NDArray[np.int32]]:
    """The tier's K and V as the kernel writes them, and the page each copy writes there: a device
    tier as it is; for a host tier, a device staging buffer of one page per copy."""
    if not is_host(tier[0]):
        return tier[0], tier[1], pages
    shape = (tier[0].shape[0], pages.shape[0], *tier[0].shape[2:])
    staged = np.arange(pages.shape[0], dtype=np.int32)
    return cuda.device_array(shape, tier[0].dtype), cuda.device_array(shape, tier[1].dtype), staged


def _copy_back(device_array: Any, original: Any) -> None:
    if is_host(original):
        device_array.copy_to_host(original)
