"""numba-CPU twins of the decode kernels: the same arithmetic as the CUDA kernels, run on the host.

numba's CPU target has no float16, so a float16 cache reaches these functions as a `uint16` view
(`cache.view(np.uint16)`, sharing memory, so appends and copies land in the caller's array) and
is converted here: `load_row` widens half rows to float32, `store_row` rounds float32 rows to half
(round-to-nearest-even, exactly numpy's `astype`). Both are chosen at compile time from the cache's
dtype, so a float32 cache pays nothing. The conversion uses LLVM's half type where the host lowers
it to instructions (F16C: 10x faster than the bit arithmetic) and exact bit arithmetic elsewhere.

`fastmath={'reassoc', 'contract'}` lets LLVM vectorize the dot products and the weighted sums
(about 2.4x) and fuse their multiply-adds (as CUDA does by default), while keeping infinities and
NaN semantics, which the masking and the online softmax rely on. Half rows are widened eight at a
time (`widen8`): LLVM leaves the scalar conversion loop unvectorized.
The attention twin is `parallel=True` over queries, longest first, one query at a time per core
(`ops.paged_attention` runs it under `parallel_chunksize(1)`): a static split of the queries left
one core idle while the other finished, and on a busy machine waited for a descheduled thread.
Inputs are assumed validated (`kvsched.kernels.layout.check_*`).
"""

from __future__ import annotations

import math
import platform
from typing import Any

import numpy as np

from kvsched.kernels.jit import intrinsic, llvm_binding, llvm_ir, njit, overload, prange, types

FASTMATH = {"reassoc", "contract"}
TWO_POW_112 = np.float32(2.0**112)  # rebiases a half exponent (bias 15) to float32's (bias 127)


def load_row(cache: Any, page: Any, row: Any, head: Any, scratch: Any) -> Any:
    """One `[head_dim]` float32 cache row (pure-Python stand-in; numba uses the overload)."""
    raise NotImplementedError("load_row is only callable from numba-compiled code")


def store_row(cache: Any, page: Any, row: Any, head: Any, values: Any) -> None:
    """Write one float32 `[head_dim]` row into the cache (numba-only, see `load_row`)."""
    raise NotImplementedError("store_row is only callable from numba-compiled code")


@intrinsic
def bits_as_float32(typingctx: Any, word: Any) -> Any:
    """Reinterpret the low 32 bits of an integer as float32 (a register bitcast: numba's `view`
    would go through memory and stop the loops around it from vectorizing)."""
    if not isinstance(word, types.Integer):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        low = args[0] if word.bitwidth == 32 else builder.trunc(args[0], llvm_ir.IntType(32))
        return builder.bitcast(low, llvm_ir.FloatType())

    return types.float32(word), codegen


@intrinsic
def float32_as_bits(typingctx: Any, value: Any) -> Any:
    """Reinterpret a float32 as uint32."""
    if value != types.float32:
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], llvm_ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def half_to_float_hardware(typingctx: Any, bits: Any) -> Any:
    """Widen half bits with LLVM's `fpext half` (F16C `vcvtph2ps` on x86, `fcvt` on Arm)."""
    if bits != types.uint16:
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.fpext(builder.bitcast(args[0], llvm_ir.HalfType()), llvm_ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def float_to_half_hardware(typingctx: Any, value: Any) -> Any:
    """Round float32 to half bits with LLVM's `fptrunc` (round-to-nearest-even)."""
    if value != types.float32:
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(builder.fptrunc(args[0], llvm_ir.HalfType()), llvm_ir.IntType(16))

    return types.uint16(types.float32), codegen


@intrinsic
def widen8_hardware(typingctx: Any, src: Any, start: Any, dst: Any, at: Any) -> Any:
    """`dst[at:at+8] = src[start:start+8]` widened from half bits: one `fpext <8 x half>` (one
    `vcvtph2ps ymm` with F16C). LLVM does not vectorize the scalar conversion loop by itself.
    Both arrays must be contiguous 1-d (uint16 source, float32 target); bounds are the caller's."""
    if not (
        isinstance(src, types.Array)
        and isinstance(dst, types.Array)
        and src.dtype == types.uint16
        and dst.dtype == types.float32
        and src.ndim == dst.ndim == 1
        and src.layout == dst.layout == "C"
    ):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        source = context.make_array(signature.args[0])(context, builder, args[0])
        target = context.make_array(signature.args[2])(context, builder, args[2])
        halves = llvm_ir.VectorType(llvm_ir.IntType(16), 8)
        floats = llvm_ir.VectorType(llvm_ir.FloatType(), 8)
        bits = builder.load(builder.bitcast(builder.gep(source.data, [args[1]]), halves.as_pointer()), align=2)
        widened = builder.fpext(builder.bitcast(bits, llvm_ir.VectorType(llvm_ir.HalfType(), 8)), floats)
        builder.store(widened, builder.bitcast(builder.gep(target.data, [args[3]]), floats.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(src, start, dst, at), codegen


@njit(cache=True)
def half_to_float_software(bits: np.uint16) -> Any:
    """Widen half bits to float32 exactly (subnormals, infinities and NaN included).

    Shifting the half's exponent and mantissa into float32 position leaves the exponent biased by
    15 instead of 127; multiplying by 2**112 fixes that exactly for normal and subnormal values
    alike, so the only special case is the all-ones exponent (infinity, NaN), forced to float32's.
    """
    h = np.uint32(bits)
    word = ((h & np.uint32(0x8000)) << np.uint32(16)) | ((h & np.uint32(0x7FFF)) << np.uint32(13))
    if (h & np.uint32(0x7C00)) == np.uint32(0x7C00):
        word |= np.uint32(0x7F800000)
    return bits_as_float32(word) * TWO_POW_112


@njit(cache=True)
def float_to_half_software(value: np.float32) -> np.uint16:
    """Round float32 to the nearest-even half's bits (numpy's `npy_floatbits_to_halfbits`)."""
    f = float32_as_bits(value)
    sign = np.uint32((f & np.uint32(0x80000000)) >> np.uint32(16))
    f_exp = f & np.uint32(0x7F800000)
    if f_exp >= np.uint32(0x47800000):  # overflow, infinity or NaN
        f_sig = f & np.uint32(0x007FFFFF)
        if f_exp == np.uint32(0x7F800000) and f_sig != 0:
            nan = np.uint32(0x7C00) + (f_sig >> np.uint32(13))
            return np.uint16(sign + (nan if nan != np.uint32(0x7C00) else np.uint32(0x7C01)))
        return np.uint16(sign + np.uint32(0x7C00))
    if f_exp <= np.uint32(0x38000000):  # half subnormal or zero
        if f_exp < np.uint32(0x33000000):
            return np.uint16(sign)
        shift = np.uint32(113) - (f_exp >> np.uint32(23))
        f_sig = (np.uint32(0x00800000) + (f & np.uint32(0x007FFFFF))) >> shift
        if (f_sig & np.uint32(0x3FFF)) != np.uint32(0x1000) or (f & np.uint32(0x7FF)) != 0:
            f_sig += np.uint32(0x1000)
        return np.uint16(sign + (f_sig >> np.uint32(13)))
    h_exp = (f_exp - np.uint32(0x38000000)) >> np.uint32(13)
    f_sig = f & np.uint32(0x007FFFFF)
    # Add half an ulp of the half (round to nearest) unless that would round an exact tie up from
    # an even mantissa (kept bits even, dropped bits exactly one half): ties go to even.
    if (f_sig & np.uint32(0x3FFF)) != np.uint32(0x1000):
        f_sig += np.uint32(0x1000)
    return np.uint16(sign + h_exp + (f_sig >> np.uint32(13)))


def _host_converts_half() -> bool:
    """Whether LLVM lowers `fpext`/`fptrunc half` to instructions here (64-bit Arm always, x86
    with F16C); elsewhere it would call compiler-rt helpers that numba's JIT does not link."""
    machine = platform.machine().lower()
    if machine in {"aarch64", "arm64"}:
        return True
    if machine in {"x86_64", "amd64"}:
        return "+f16c" in llvm_binding.get_host_cpu_features().flatten().split(",")
    return False


@njit(cache=True)
def widen8_software(src: Any, start: Any, dst: Any, at: Any) -> None:
    """`widen8_hardware` in exact bit arithmetic."""
    for d in range(8):
        dst[at + d] = half_to_float_software(src[start + d])


if _host_converts_half():
    half_to_float, float_to_half, widen8 = half_to_float_hardware, float_to_half_hardware, widen8_hardware
else:  # pragma: no cover - x86 without F16C (pre-2012) and other architectures
    half_to_float, float_to_half, widen8 = half_to_float_software, float_to_half_software, widen8_software


@overload(load_row, jit_options={"fastmath": FASTMATH})
def _load_row_overload(cache: Any, page: Any, row: Any, head: Any, scratch: Any) -> Any:
    if cache.dtype == types.uint16 and cache.layout == "C":

        def load_half_rows(cache: Any, page: Any, row: Any, head: Any, scratch: Any) -> Any:
            bits = cache[page, row, head]  # contiguous: eight halves per instruction
            d = 0
            while d + 8 <= scratch.shape[0]:
                widen8(bits, d, scratch, d)
                d += 8
            while d < scratch.shape[0]:
                scratch[d] = half_to_float(bits[d])
                d += 1
            return scratch

        return load_half_rows

    if cache.dtype == types.uint16:

        def load_half(cache: Any, page: Any, row: Any, head: Any, scratch: Any) -> Any:
            for d in range(scratch.shape[0]):
                scratch[d] = half_to_float(cache[page, row, head, d])
            return scratch

        return load_half

    def load_float(cache: Any, page: Any, row: Any, head: Any, scratch: Any) -> Any:
        return cache[page, row, head]

    return load_float


@overload(store_row)
def _store_row_overload(cache: Any, page: Any, row: Any, head: Any, values: Any) -> Any:
    if cache.dtype == types.uint16:

        def store_half(cache: Any, page: Any, row: Any, head: Any, values: Any) -> None:
            for d in range(values.shape[0]):
                cache[page, row, head, d] = float_to_half(values[d])

        return store_half

    def store_float(cache: Any, page: Any, row: Any, head: Any, values: Any) -> None:
        cache[page, row, head, :] = values

    return store_float


@njit(cache=True, fastmath=FASTMATH, parallel=True)
def paged_attention_twin(
    q: Any,  # [queries, q_heads, head_dim] float32
    k_cache: Any,  # [pages, page_size, kv_heads, head_dim] float32 | uint16 (float16 bits)
    v_cache: Any,  # [pages, page_size, kv_heads, head_dim] same dtype as k_cache
    block_table: Any,  # [entries] uint32
    table_offsets: Any,  # [queries] int32
    context_lens: Any,  # [queries] int32
    scale: float,
    order: Any,  # [queries] int: the queries in the order to start them (longest first)
    out: Any,  # [queries, q_heads, head_dim] float32, written
) -> None:
    """Page-by-page online softmax, queries spread over the CPU cores.

    Each page's K block, then its V block, is read once front to back for all kv heads (reading
    head by head instead strides through the page and ran at half the speed). The running maxima rescale the
    accumulators at page boundaries as the CUDA kernel does at tile boundaries (not at all when
    the maximum did not move). Queries start in `order`; run under `parallel_chunksize(1)` the
    cores take the next query when they finish one, so the longest-first order balances them.
    """
    queries, q_heads, head_dim = q.shape
    page_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q_heads // kv_heads
    for index in prange(queries):
        query = order[index]
        scaled_q = np.empty((q_heads, head_dim), dtype=np.float32)
        acc = np.zeros((q_heads, head_dim), dtype=np.float32)
        scores = np.empty((q_heads, page_size), dtype=np.float32)
        running_max = np.full(q_heads, -np.inf, dtype=np.float32)
        running_sum = np.zeros(q_heads, dtype=np.float32)
        scratch = np.empty(head_dim, dtype=np.float32)
        context_len = context_lens[query]
        offset = table_offsets[query]
        for head in range(q_heads):
            for d in range(head_dim):
                scaled_q[head, d] = q[query, head, d] * np.float32(scale)
        for logical in range((context_len + page_size - 1) // page_size):
            page = block_table[offset + logical]
            rows = min(page_size, context_len - logical * page_size)
            for row in range(rows):
                for kv_head in range(kv_heads):
                    key = load_row(k_cache, page, row, kv_head, scratch)
                    for head in range(kv_head * group, (kv_head + 1) * group):
                        score = np.float32(0.0)
                        for d in range(head_dim):
                            score += scaled_q[head, d] * key[d]
                        scores[head, row] = score
            for head in range(q_heads):
                page_max = running_max[head]
                for row in range(rows):
                    page_max = max(page_max, scores[head, row])
                total = running_sum[head]
                if page_max != running_max[head]:
                    rescale = np.float32(math.exp(running_max[head] - page_max))
                    running_max[head] = page_max
                    total *= rescale
                    for d in range(head_dim):
                        acc[head, d] *= rescale
                for row in range(rows):
                    weight = np.float32(math.exp(scores[head, row] - page_max))
                    scores[head, row] = weight
                    total += weight
                running_sum[head] = total
            for row in range(rows):
                for kv_head in range(kv_heads):
                    value = load_row(v_cache, page, row, kv_head, scratch)
                    for head in range(kv_head * group, (kv_head + 1) * group):
                        weight = scores[head, row]
                        for d in range(head_dim):
                            acc[head, d] += weight * value[d]
        for head in range(q_heads):
            inverse = np.float32(1.0) / running_sum[head]
            for d in range(head_dim):
                out[query, head, d] = acc[head, d] * inverse


@njit(cache=True)
def append_kv_twin(
    k: Any,  # [queries, kv_heads, head_dim] float32
    v: Any,  # [queries, kv_heads, head_dim] float32
    k_cache: Any,  # [pages, page_size, kv_heads, head_dim] float32 | uint16, written
    v_cache: Any,  # [pages, page_size, kv_heads, head_dim] same dtype as k_cache, written
    block_table: Any,  # [entries] uint32
    table_offsets: Any,  # [queries] int32
    positions: Any,  # [queries] int32
) -> None:
    """Store each query's K and V row at its position's page and row."""
    page_size = k_cache.shape[1]
    for query in range(k.shape[0]):
        position = positions[query]
        page = block_table[table_offsets[query] + position // page_size]
        row = position % page_size
        for kv_head in range(k.shape[1]):
            store_row(k_cache, page, row, kv_head, k[query, kv_head])
            store_row(v_cache, page, row, kv_head, v[query, kv_head])


@njit(cache=True)
def copy_pages_twin(
    k_cache: Any,  # [pages, page_size, kv_heads, head_dim] float32 | uint16, written
    v_cache: Any,  # [pages, page_size, kv_heads, head_dim] same dtype as k_cache, written
    pairs: Any,  # [copies, 2] int32 (source, destination)
) -> None:
    """Copy every source page onto its destination, K and V alike."""
    for index in range(pairs.shape[0]):
        source, destination = pairs[index, 0], pairs[index, 1]
        k_cache[destination] = k_cache[source]
        v_cache[destination] = v_cache[source]
