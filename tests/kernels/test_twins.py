"""The numba-CPU twins against the numpy oracles on random ragged batches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.kernels import copy_pages, paged_attention, twins
from kvsched.kernels.jit import njit
from kvsched.testing.patching import patch_source
from tests.kernels.kernel_batches import Batch, appended, kv_rows, ragged_batch

SHAPES = st.fixed_dictionaries(
    {
        "kv_heads": st.sampled_from([1, 2]),
        "group": st.sampled_from([1, 2, 4]),
        "head_dim": st.sampled_from([4, 12, 16, 64]),  # 12: eight-wide loads and a tail
        "page_size": st.sampled_from([1, 3, 4, 16]),
        "dtype": st.sampled_from([np.float16, np.float32]),
        "requests": st.integers(1, 5),
        "max_context": st.integers(1, 70),
        "chunk": st.sampled_from([1, 1, 3]),
    }
)


def drawn_batch(rng: np.random.Generator, shape: dict[str, Any], group: int, **options: Any) -> Batch:
    """A ragged batch of a drawn shape, with `group` query heads per KV head."""
    sizes = {name: shape[name] for name in ("requests", "kv_heads", "head_dim", "page_size", "dtype", "max_context")}
    return ragged_batch(rng, q_heads=shape["kv_heads"] * group, **sizes, **options)


@settings(max_examples=60, deadline=None)
@given(shape=SHAPES, seed=st.integers(0, 2**32 - 1))
def test_attention_twin_matches_oracle(shape: dict[str, int], seed: int) -> None:
    batch = drawn_batch(np.random.default_rng(seed), shape, group=shape["group"], chunk=shape["chunk"])
    expected = paged_attention(*batch.attention_args(), scale=batch.scale, device="numpy")
    got = paged_attention(*batch.attention_args(), scale=batch.scale, device="cpu", table_lengths=batch.table_lengths)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-6)


def test_attention_survives_scores_that_overflow_a_naive_softmax() -> None:
    """exp(score) overflows float32 past ~88; the online softmax subtracts the running max."""
    rng = np.random.default_rng(7)
    batch = ragged_batch(
        rng, requests=3, q_heads=4, kv_heads=2, head_dim=16, page_size=4, dtype=np.float32, max_context=40
    )
    batch.q *= 400.0
    expected = paged_attention(*batch.attention_args(), scale=batch.scale, device="numpy")
    got = paged_attention(*batch.attention_args(), scale=batch.scale, device="cpu")
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@settings(max_examples=30, deadline=None)
@given(shape=SHAPES, seed=st.integers(0, 2**32 - 1))
def test_append_twin_matches_oracle(shape: dict[str, int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    batch = drawn_batch(rng, shape, group=1, share_prefix=False)
    k, v = kv_rows(rng, batch)
    k *= 1000.0  # exercises float16 rounding, overflow to infinity and subnormals alike
    got = appended(batch, k, v, "cpu")
    assert got == appended(batch, k, v, "numpy")
    assert got[0] != batch.k_cache.tobytes()


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("layered", [False, True])
def test_copy_twin_matches_oracle(dtype: type, layered: bool) -> None:
    rng = np.random.default_rng(3)
    shape = (2, 9, 4, 2, 8) if layered else (9, 4, 2, 8)
    k_cache: npt.NDArray[Any] = rng.standard_normal(shape).astype(dtype)
    v_cache: npt.NDArray[Any] = rng.standard_normal(shape).astype(dtype)
    pairs = [(0, 5), (0, 6), (3, 1), (8, 2)]
    results = {}
    for device in ("numpy", "cpu"):
        k, v = k_cache.copy(), v_cache.copy()
        copy_pages(k, v, pairs, device=device)
        results[device] = (k, v)
    np.testing.assert_array_equal(results["cpu"][0], results["numpy"][0])
    np.testing.assert_array_equal(results["cpu"][1], results["numpy"][1])
    per_layer = (-1, *shape[-4:])  # [layers, pages, ...], a single layer when not layered
    for layer_k, original in zip(results["cpu"][0].reshape(per_layer), k_cache.reshape(per_layer), strict=True):
        np.testing.assert_array_equal(layer_k[6], original[0])  # copied
        np.testing.assert_array_equal(layer_k[7], original[7])  # untouched


@njit(cache=True)
def _widen_all(bits: npt.NDArray[np.uint16], out: npt.NDArray[np.float32]) -> None:
    for i in range(bits.shape[0]):
        out[i] = twins.half_to_float(bits[i])
        out[bits.shape[0] + i] = twins.half_to_float_software(bits[i])
    for i in range(0, bits.shape[0], 8):  # eight at a time: the row loads of float16 caches
        twins.widen8(bits, i, out, 2 * bits.shape[0] + i)
        twins.widen8_software(bits, i, out, 3 * bits.shape[0] + i)


@njit(cache=True)
def _narrow_all(values: npt.NDArray[np.float32], out: npt.NDArray[np.uint16]) -> None:
    for i in range(values.shape[0]):
        out[i] = twins.float_to_half(values[i])
        out[values.shape[0] + i] = twins.float_to_half_software(values[i])


@njit(cache=True, fastmath=twins.FASTMATH)
def _exp_all(x: npt.NDArray[np.float32], out: npt.NDArray[np.float32]) -> None:
    for i in range(x.shape[0]):
        out[i] = twins.exp_nonpositive(x[i])


EXP_GRID = np.concatenate([-np.logspace(-8, np.log10(87.0), 100_000), np.linspace(-87.0, 0.0, 100_001)])


def _worst_ulps(run: Any) -> float:
    """The largest error of `run(x, out)` (an exp over arrays) over `EXP_GRID`, in ulp of the result."""
    x = EXP_GRID.astype(np.float32)
    out = np.empty_like(x)
    run(x, out)
    exact = np.exp(x.astype(np.float64))
    return float((np.abs(out - exact) / np.spacing(exact.astype(np.float32)).astype(np.float64)).max())


def test_exp_nonpositive_is_within_one_and_a_half_ulp_down_to_its_floor() -> None:
    """The softmax weights' exp: within 1.5 ulp of exp over [-87, 0] (measured: 1.002 ulp); below
    the floor it gives exp(-87) (a weight of 1.6e-38 next to the maximum's 1); NaN stays NaN."""
    assert _worst_ulps(_exp_all) <= 1.5
    specials = np.array([0.0, -0.0, -87.0, -87.5, -1000.0, -np.inf, np.nan], dtype=np.float32)
    got = np.empty_like(specials)
    _exp_all(specials, got)
    assert got[0] == got[1] == 1.0
    floor = np.float32(np.exp(np.float64(-87.0)))
    np.testing.assert_allclose(got[2:6], floor, rtol=2e-7)
    assert np.isnan(got[6])


def test_the_exp_bound_fails_an_exp_without_the_low_half_of_ln2() -> None:
    """The 1.5 ulp bound can fail: dropping the Cody-Waite correction (what `reassoc` may do by
    merging the two halves of ln 2) costs many ulp far from 0."""
    broken = njit(fastmath={"contract"})(
        patch_source(twins.exp_nonpositive, (("x - n * LN2_HIGH - n * LN2_LOW", "x - n * LN2_HIGH"),), "no LN2_LOW")
    )

    @njit(fastmath=twins.FASTMATH)
    def run(x: npt.NDArray[np.float32], out: npt.NDArray[np.float32]) -> None:
        for i in range(x.shape[0]):
            out[i] = broken(x[i])

    assert _worst_ulps(run) > 1.5


def test_half_to_float_is_exact_for_every_bit_pattern() -> None:
    bits = np.arange(2**16, dtype=np.uint16)
    out = np.empty(4 * bits.size, dtype=np.float32)
    _widen_all(bits, out)
    expected = bits.view(np.float16).astype(np.float32)
    for half in out.reshape(4, bits.size):
        finite = ~np.isnan(expected)
        np.testing.assert_array_equal(half[finite].view(np.uint32), expected[finite].view(np.uint32))
        assert np.isnan(half[~finite]).all()


def test_float_to_half_rounds_like_numpy() -> None:
    rng = np.random.default_rng(11)
    patterns = [rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)]
    for edge in (0x33000000, 0x38000000, 0x387FC000, 0x477FE000, 0x7F800000):  # underflow .. overflow
        patterns.append(np.arange(edge - 3000, edge + 3000, dtype=np.uint32))
    words = np.concatenate(patterns)
    values = np.concatenate([words, words | np.uint32(0x80000000)]).view(np.float32)
    out = np.empty(2 * values.size, dtype=np.uint16)
    _narrow_all(values, out)
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16)
    for half in (out[: values.size], out[values.size :]):
        nan = np.isnan(expected)
        np.testing.assert_array_equal(half[~nan], expected[~nan].view(np.uint16))
        assert np.isnan(half[nan].view(np.float16)).all()


def test_bench_quick_run_writes_its_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvsched.kernels import bench

    target, chart = tmp_path / "bench.json", tmp_path / "decode.svg"
    assert bench.main(["--quick", "--repeats", "1", "--no-torch", "--json", str(target), "--plot", str(chart)]) == 0
    report = json.loads(target.read_text())
    drawn = chart.read_text()
    assert "float16" in drawn and "numba twin" in drawn and "measured copy bandwidth" in drawn
    rows = {(row["cache_dtype"], row["implementation"]) for row in report["rows"]}
    assert rows == {(d, i) for d in ("float32", "float16") for i in ("numba twin", "numpy oracle")}
    assert all(row["max_abs_error"] < 1e-5 and row["gbps"] > 0 for row in report["rows"])
    assert "numba twin" in capsys.readouterr().out
