"""numba-CPU twins of the decode kernels: the same computation as the CUDA kernels, run on the host.

numba's CPU target has no float16, so a float16 cache reaches these functions as a `uint16` view
(`cache.view(np.uint16)`, sharing memory, so appends and copies land in the caller's array) and
is converted here: `stage_block` widens a page's rows of one kv head to float32, `store_row`
rounds float32 rows to half (round-to-nearest-even, exactly numpy's `astype`). Both are chosen at
compile time from the cache's dtype, so a float32 cache pays nothing. The conversion uses LLVM's
half type where the host lowers it to instructions (F16C) and exact bit arithmetic elsewhere
(measurements: docs/kernels.md).

`fastmath={'reassoc', 'contract'}` lets LLVM vectorize the dot products and the weighted sums
and fuse their multiply-adds (as CUDA does by default), while keeping infinities and
NaN semantics, which the masking and the online softmax rely on. Half rows are widened eight at a
time (`widen8`): LLVM leaves the scalar conversion loop unvectorized.

The attention twin works on one page and one kv head at a time (a block of `page_size` rows):
four rows' dot products (eight on half blocks) share each load of the query, as many weighted
rows are added to the accumulator in one pass, and the softmax weights come from `exp_nonpositive`, a
polynomial LLVM vectorizes (math.exp is a scalar libm call: 2.4 ms of a 19 ms round). Half caches
prefetch the next block and the page's V (or the next page's K) while a block is computed: their
32 KiB pages defeat the hardware prefetcher. Float32 caches do not: prefetching made them slower.
Queries run `parallel=True`, longest first, one query at a time per core (`ops.paged_attention`
runs it under `parallel_chunksize(1)`): a static split of the queries left one core idle while the
other finished, and on a busy machine waited for a descheduled thread.
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


def stage_block(cache: Any, page: Any, kv_head: Any, rows: Any, block: Any) -> None:
    """Make rows `[0, rows)` of `cache[page, :, kv_head]` readable as float32 through `staged_row`:
    a half cache is widened into `block` (`[page_size, head_dim]` float32), a float32 cache is read
    in place (pure-Python stand-in; numba uses the overload)."""
    raise NotImplementedError("stage_block is only callable from numba-compiled code")


def staged_row(cache: Any, page: Any, row: Any, kv_head: Any, block: Any) -> Any:
    """Row `row` of the block `stage_block` staged: `[head_dim]` float32 (numba-only)."""
    raise NotImplementedError("staged_row is only callable from numba-compiled code")


def eight_rows_per_pass(cache: Any) -> bool:
    """Whether the attention twin takes eight rows per pass over a block of `cache` rather than
    four (numba-only; a compile-time constant): eight for staged half blocks, which sit in L1, four
    for float32 rows read from memory (docs/kernels.md)."""
    raise NotImplementedError("eight_rows_per_pass is only callable from numba-compiled code")


def prefetch_block(cache: Any, page: Any, kv_head: Any) -> None:
    """Hint the CPU to bring `cache[page, :, kv_head]` into L1 (numba-only; a no-op for float32)."""
    raise NotImplementedError("prefetch_block is only callable from numba-compiled code")


def store_row(cache: Any, page: Any, row: Any, head: Any, values: Any) -> None:
    """Write one float32 `[head_dim]` row into the cache (numba-only, see `stage_block`)."""
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


@overload(stage_block, jit_options={"fastmath": FASTMATH})
def _stage_block_overload(cache: Any, page: Any, kv_head: Any, rows: Any, block: Any) -> Any:
    if cache.dtype == types.uint16 and cache.layout == "C":

        def widen_rows(cache: Any, page: Any, kv_head: Any, rows: Any, block: Any) -> None:
            head_dim = block.shape[1]
            for row in range(rows):
                bits = cache[page, row, kv_head]  # contiguous: eight halves per instruction
                target = block[row]
                d = 0
                while d + 8 <= head_dim:
                    widen8(bits, d, target, d)
                    d += 8
                while d < head_dim:
                    target[d] = half_to_float(bits[d])
                    d += 1

        return widen_rows

    if cache.dtype == types.uint16:

        def widen_strided(cache: Any, page: Any, kv_head: Any, rows: Any, block: Any) -> None:
            for row in range(rows):
                for d in range(block.shape[1]):
                    block[row, d] = half_to_float(cache[page, row, kv_head, d])

        return widen_strided

    def read_in_place(cache: Any, page: Any, kv_head: Any, rows: Any, block: Any) -> None:
        pass

    return read_in_place


@overload(staged_row)
def _staged_row_overload(cache: Any, page: Any, row: Any, kv_head: Any, block: Any) -> Any:
    if cache.dtype == types.uint16:

        def widened(cache: Any, page: Any, row: Any, kv_head: Any, block: Any) -> Any:
            return block[row]

        return widened

    def in_place(cache: Any, page: Any, row: Any, kv_head: Any, block: Any) -> Any:
        return cache[page, row, kv_head]

    return in_place


@overload(eight_rows_per_pass)
def _eight_rows_per_pass_overload(cache: Any) -> Any:
    eight = bool(cache.dtype == types.uint16)

    def constant(cache: Any) -> bool:
        return eight

    return constant


@intrinsic
def prefetch(typingctx: Any, array: Any, index: Any) -> Any:
    """`llvm.prefetch` of `array`'s element `index` for reading, into L1 (`prefetcht0` on x86).
    A hint: it never faults and changes nothing the program can observe."""
    if not (isinstance(array, types.Array) and array.layout == "C" and isinstance(index, types.Integer)):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        data = context.make_array(signature.args[0])(context, builder, args[0])
        address = builder.bitcast(builder.gep(data.data, [args[1]]), llvm_ir.IntType(8).as_pointer())
        word = llvm_ir.IntType(32)
        function_type = llvm_ir.FunctionType(llvm_ir.VoidType(), [address.type, word, word, word])
        function = builder.module.declare_intrinsic("llvm.prefetch", [address.type], function_type)
        builder.call(function, [address, word(0), word(3), word(1)])  # read, keep in L1, data
        return context.get_dummy_value()

    return types.void(array, index), codegen


@overload(prefetch_block)
def _prefetch_block_overload(cache: Any, page: Any, kv_head: Any) -> Any:
    if cache.dtype == types.uint16 and cache.layout == "C":

        def prefetch_rows(cache: Any, page: Any, kv_head: Any) -> None:
            for row in range(cache.shape[1]):
                bits = cache[page, row, kv_head]
                for d in range(0, bits.shape[0], 32):  # one 64-byte line holds 32 halves
                    prefetch(bits, d)

        return prefetch_rows

    def leave_to_hardware(cache: Any, page: Any, kv_head: Any) -> None:
        pass

    return leave_to_hardware


LOG2_E = np.float32(1.4426950408889634)
LN2_HIGH = np.float32(0.693359375)  # ln 2 = LN2_HIGH + LN2_LOW; n * LN2_HIGH is exact for |n| < 2**9
LN2_LOW = np.float32(-2.12194440e-4)
ROUNDING = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds to an integer held in the low bits
EXP_FLOOR = np.float32(-87.0)  # exp(-87) ~ 1.6e-38, still a normal float32
FLOAT32_BIAS = np.uint32(127)


@njit(cache=True, fastmath={"contract"})
def exp_nonpositive(x: Any) -> Any:
    """exp(x) for float32 x <= 0 in operations LLVM vectorizes (no libm call, no branch); within
    1.5 ulp over [-87, 0] (tests/kernels/test_twins.py).

    x = n ln2 + r with n an integer and |r| <= ln2 / 2, so exp(x) = 2**n exp(r): exp(r) is the
    Cephes `expf` polynomial and 2**n is built in the exponent bits. n comes from adding
    1.5 * 2**23, which leaves round(x / ln2) in the low mantissa bits (no float-to-int conversion,
    so NaN stays NaN). Inputs below -87 give exp(-87) instead of a subnormal or zero: softmax
    weights that small vanish next to the maximum's 1.
    Not `reassoc` (unlike the kernels that call it): reassociation may fold
    `(y + 1.5 * 2**23) - 1.5 * 2**23` to `y` and merge the two halves of ln 2. LLVM inlines it
    into the callers' loops anyway, keeping these flags, and vectorizes it there.
    """
    x = EXP_FLOOR if x < EXP_FLOOR else x
    shifted = x * LOG2_E + ROUNDING
    n = shifted - ROUNDING
    r = x - n * LN2_HIGH - n * LN2_LOW
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    exponent = (float32_as_bits(shifted) - float32_as_bits(ROUNDING) + FLOAT32_BIAS) << np.uint32(23)
    return p * bits_as_float32(exponent)


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
    context_starts: Any,  # [queries] int32, below context_lens: the first position each reads
    scale: float,
    order: Any,  # [queries] int: the queries in the order to start them (longest first)
    out: Any,  # [queries, q_heads, head_dim] float32, written
) -> None:
    """Page-by-page online softmax, queries spread over the CPU cores.

    For each page: the scores of every row against the query heads (one kv head's block at a time),
    the page's softmax update, then the weighted V rows (again block by block). The running maxima
    rescale the accumulators at page boundaries as the CUDA kernel does at tile boundaries (not at
    all when the maximum did not move). Rows go four at a time (eight for half caches, see
    `eight_rows_per_pass`): four dot products in one pass over the query head (one load of the
    query for four rows; LLVM keeps four vector accumulators), four weighted rows added to the
    accumulator in one pass (one load and store of it for four rows).
    A query reads from its `context_starts` on: its first page's rows before it are skipped
    (staged, never scored or weighed), its earlier pages never touched.
    Queries start in `order`; run under `parallel_chunksize(1)` the cores take the next query when
    they finish one, so the longest-first order balances them.
    """
    queries, q_heads, head_dim = q.shape
    page_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q_heads // kv_heads
    eight = eight_rows_per_pass(k_cache)
    for index in prange(queries):
        query = order[index]
        scaled_q = np.empty((q_heads, head_dim), dtype=np.float32)
        acc = np.zeros((q_heads, head_dim), dtype=np.float32)
        scores = np.empty((q_heads, page_size), dtype=np.float32)
        running_max = np.full(q_heads, -np.inf, dtype=np.float32)
        running_sum = np.zeros(q_heads, dtype=np.float32)
        block = np.empty((page_size, head_dim), dtype=np.float32)  # a half block, widened
        context_len = context_lens[query]
        offset = table_offsets[query]
        for head in range(q_heads):
            for d in range(head_dim):
                scaled_q[head, d] = q[query, head, d] * np.float32(scale)
        pages = (context_len + page_size - 1) // page_size
        first = context_starts[query]
        for logical in range(first // page_size, pages):
            page = block_table[offset + logical]
            following = block_table[offset + logical + 1] if logical + 1 < pages else page
            rows = min(page_size, context_len - logical * page_size)
            low = max(0, first - logical * page_size)  # the rows before the window's start: skipped
            for kv_head in range(kv_heads):
                if kv_head + 1 < kv_heads:
                    prefetch_block(k_cache, page, kv_head + 1)
                prefetch_block(v_cache, page, kv_head)
                stage_block(k_cache, page, kv_head, rows, block)
                row = low
                while eight and row + 8 <= rows:
                    k0 = staged_row(k_cache, page, row, kv_head, block)
                    k1 = staged_row(k_cache, page, row + 1, kv_head, block)
                    k2 = staged_row(k_cache, page, row + 2, kv_head, block)
                    k3 = staged_row(k_cache, page, row + 3, kv_head, block)
                    k4 = staged_row(k_cache, page, row + 4, kv_head, block)
                    k5 = staged_row(k_cache, page, row + 5, kv_head, block)
                    k6 = staged_row(k_cache, page, row + 6, kv_head, block)
                    k7 = staged_row(k_cache, page, row + 7, kv_head, block)
                    for head in range(kv_head * group, (kv_head + 1) * group):
                        s0 = np.float32(0.0)
                        s1 = np.float32(0.0)
                        s2 = np.float32(0.0)
                        s3 = np.float32(0.0)
                        s4 = np.float32(0.0)
                        s5 = np.float32(0.0)
                        s6 = np.float32(0.0)
                        s7 = np.float32(0.0)
                        for d in range(head_dim):
                            qd = scaled_q[head, d]
                            s0 += qd * k0[d]
                            s1 += qd * k1[d]
                            s2 += qd * k2[d]
                            s3 += qd * k3[d]
                            s4 += qd * k4[d]
                            s5 += qd * k5[d]
                            s6 += qd * k6[d]
                            s7 += qd * k7[d]
                        scores[head, row] = s0
                        scores[head, row + 1] = s1
                        scores[head, row + 2] = s2
                        scores[head, row + 3] = s3
                        scores[head, row + 4] = s4
                        scores[head, row + 5] = s5
                        scores[head, row + 6] = s6
                        scores[head, row + 7] = s7
                    row += 8
                while row + 4 <= rows:
                    k0 = staged_row(k_cache, page, row, kv_head, block)
                    k1 = staged_row(k_cache, page, row + 1, kv_head, block)
                    k2 = staged_row(k_cache, page, row + 2, kv_head, block)
                    k3 = staged_row(k_cache, page, row + 3, kv_head, block)
                    for head in range(kv_head * group, (kv_head + 1) * group):
                        s0 = np.float32(0.0)
                        s1 = np.float32(0.0)
                        s2 = np.float32(0.0)
                        s3 = np.float32(0.0)
                        for d in range(head_dim):
                            qd = scaled_q[head, d]
                            s0 += qd * k0[d]
                            s1 += qd * k1[d]
                            s2 += qd * k2[d]
                            s3 += qd * k3[d]
                        scores[head, row] = s0
                        scores[head, row + 1] = s1
                        scores[head, row + 2] = s2
                        scores[head, row + 3] = s3
                    row += 4
                while row < rows:
                    key = staged_row(k_cache, page, row, kv_head, block)
                    for head in range(kv_head * group, (kv_head + 1) * group):
                        score = np.float32(0.0)
                        for d in range(head_dim):
                            score += scaled_q[head, d] * key[d]
                        scores[head, row] = score
                    row += 1
            for head in range(q_heads):
                page_max = running_max[head]
                for row in range(low, rows):
                    page_max = max(page_max, scores[head, row])
                total = running_sum[head]
                if page_max != running_max[head]:
                    rescale = np.float32(math.exp(running_max[head] - page_max))
                    running_max[head] = page_max
                    total *= rescale
                    for d in range(head_dim):
                        acc[head, d] *= rescale
                for row in range(low, rows):
                    weight = exp_nonpositive(scores[head, row] - page_max)
                    scores[head, row] = weight
                    total += weight
                running_sum[head] = total
            for kv_head in range(kv_heads):
                if kv_head + 1 < kv_heads:
                    prefetch_block(v_cache, page, kv_head + 1)
                if following != page:
                    prefetch_block(k_cache, following, kv_head)
                stage_block(v_cache, page, kv_head, rows, block)
                row = low
                while eight and row + 8 <= rows:
                    v0 = staged_row(v_cache, page, row, kv_head, block)
                    v1 = staged_row(v_cache, page, row + 1, kv_head, block)
                    v2 = staged_row(v_cache, page, row + 2, kv_head, block)
                    v3 = staged_row(v_cache, page, row + 3, kv_head, block)
                    v4 = staged_row(v_cache, page, row + 4, kv_head, block)
                    v5 = staged_row(v_cache, page, row + 5, kv_head, block)
                    v6 = staged_row(v_cache, page, row + 6, kv_head, block)
                    v7 = staged_row(v_cache, page, row + 7, kv_head, block)
                    for head in range(kv_head * group, (kv_head + 1) * group):
                        w0 = scores[head, row]
                        w1 = scores[head, row + 1]
                        w2 = scores[head, row + 2]
                        w3 = scores[head, row + 3]
                        w4 = scores[head, row + 4]
                        w5 = scores[head, row + 5]
                        w6 = scores[head, row + 6]
                        w7 = scores[head, row + 7]
                        for d in range(head_dim):
                            near = w0 * v0[d] + w1 * v1[d] + w2 * v2[d] + w3 * v3[d]
                            acc[head, d] += near + (w4 * v4[d] + w5 * v5[d] + w6 * v6[d] + w7 * v7[d])
                    row += 8
                while row + 4 <= rows:
                    v0 = staged_row(v_cache, page, row, kv_head, block)
                    v1 = staged_row(v_cache, page, row + 1, kv_head, block)
                    v2 = staged_row(v_cache, page, row + 2, kv_head, block)
                    v3 = staged_row(v_cache, page, row + 3, kv_head, block)
                    for head in range(kv_head * group, (kv_head + 1) * group):
                        w0 = scores[head, row]
                        w1 = scores[head, row + 1]
                        w2 = scores[head, row + 2]
                        w3 = scores[head, row + 3]
                        for d in range(head_dim):
                            acc[head, d] += w0 * v0[d] + w1 * v1[d] + w2 * v2[d] + w3 * v3[d]
                    row += 4
                while row < rows:
                    value = staged_row(v_cache, page, row, kv_head, block)
                    for head in range(kv_head * group, (kv_head + 1) * group):
                        weight = scores[head, row]
                        for d in range(head_dim):
                            acc[head, d] += weight * value[d]
                    row += 1
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


@njit(cache=True)
def copy_tier_twin(
    source_k: Any,  # [layers, source pages, page_size, kv_heads, head_dim] float32 | uint16
    source_v: Any,  # the same
    destination_k: Any,  # [layers, destination pages, ...] same dtype, written
    destination_v: Any,  # the same, written
    pairs: Any,  # [copies, 2] int32 (source page, destination page)
) -> None:
    """Copy every pair's page from one tier into the other, in every layer, K and V alike."""
    for index in range(pairs.shape[0]):
        source, destination = pairs[index, 0], pairs[index, 1]
        for layer in range(source_k.shape[0]):
            destination_k[layer, destination] = source_k[layer, source]
            destination_v[layer, destination] = source_v[layer, source]
