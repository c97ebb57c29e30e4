"""The host tier serving the real paged model: a conversation's pages are evicted from the device
by other conversations, copied to host pages first, and copied back for its next turn; every
token equals a dense run of each request alone, with the tier on and off, on numpy (spec) and
cpu (impl). A backend that reports its copies back done without making them serves other
tokens (the check fails on it). The tier copy itself: the CUDA kernel (in numba-cuda's simulator
here, natively under gpu_check.sh) and the CPU twin equal the oracle, and bad pairs change
nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from kvsched import impl, spec
from kvsched.kernels import ModelConfig, PagedBackend, init_weights, ops
from kvsched.kernels.model import greedy_reference
from kvsched.spec import EngineConfig, EngineRequest
from kvsched.spec.model import HostCopy

PAGE_SIZE = 4
CONFIG = EngineConfig(
    requests=2,
    pages=12,
    page_size=PAGE_SIZE,
    logical_pages=8,
    max_batch_size=2,
    max_batched_tokens=12,
    chunk_size=8,
    prefill_reserve_pages=2,
    max_queue=8,
    max_seq_len=32,
    prefix_caching=True,
    host_pages=16,
)
FLAVOURS = [pytest.param(spec, "numpy", id="spec-numpy"), pytest.param(impl, "cpu", id="impl-cpu")]
WEIGHTS = init_weights(ModelConfig(q_heads=4, kv_heads=1, page_size=PAGE_SIZE, cache_dtype="float32"), seed=7)
FIRST = (11, 3, 57, 20, 8, 41, 9, 30, 2, 17, 44, 6, 5)  # three full pages and one token
OTHERS = [tuple((7 * n + k) % 60 for k in range(14)) for n in range(1, 4)]  # they evict the first


class NoCopyBack(PagedBackend):
    """Broken: a copy from the host is reported done without being made."""

    def start_copies(self, to_device: Sequence[HostCopy], to_host: Sequence[HostCopy]) -> None:
        super().start_copies([], to_host)
        for copy in to_device:
            self.done[copy.transfer_id] = True


def serve(flavour: Any, backend: PagedBackend, config: EngineConfig) -> tuple[dict[int, list[int]], int, int]:
    """The first conversation's turn, three others, then its next turn: every request's tokens,
    and the tokens served from host pages and the pages demoted."""
    engine = flavour.Engine(config, backend)
    tokens: dict[int, list[int]] = {}
    host_hits = demoted = 0

    def run(*requests: EngineRequest) -> None:
        nonlocal host_hits, demoted
        for request in requests:
            engine.submit(request)
        while engine.has_work():
            output = engine.step()
            host_hits += output.host.hit_tokens
            demoted += output.host.demoted
            for request_id, new in output.tokens.items():
                tokens.setdefault(request_id, []).extend(new)

    run(EngineRequest(1, FIRST, 4))
    for index, prompt in enumerate(OTHERS):
        run(EngineRequest(2 + index, prompt, 4))
    run(EngineRequest(9, FIRST + tuple(tokens[1]) + (13, 14), 3))
    return tokens, host_hits, demoted


def expected(tokens: dict[int, list[int]]) -> dict[int, list[int]]:
    prompts = {1: FIRST, **{2 + index: prompt for index, prompt in enumerate(OTHERS)}}
    prompts[9] = FIRST + tuple(tokens[1]) + (13, 14)
    counts = {request_id: 4 for request_id in prompts} | {9: 3}
    return {rid: greedy_reference(WEIGHTS, prompt, counts[rid])[0] for rid, prompt in prompts.items()}


@pytest.mark.parametrize(("flavour", "device"), FLAVOURS)
def test_a_conversation_comes_back_from_the_host_tier_with_its_own_tokens(flavour: Any, device: str) -> None:
    tokens, host_hits, demoted = serve(flavour, PagedBackend(WEIGHTS, CONFIG.pages, device, CONFIG.host_pages), CONFIG)
    assert tokens == expected(tokens)
    assert host_hits >= 3 * PAGE_SIZE and demoted > 0  # the turn came back from the host
    without, host_hits, _ = serve(flavour, PagedBackend(WEIGHTS, CONFIG.pages, device), replace(CONFIG, host_pages=0))
    assert without == tokens and host_hits == 0


@pytest.mark.parametrize(("flavour", "device"), FLAVOURS)
def test_a_backend_that_skips_the_copy_back_serves_other_tokens(flavour: Any, device: str) -> None:
    tokens, host_hits, _ = serve(flavour, NoCopyBack(WEIGHTS, CONFIG.pages, device, CONFIG.host_pages), CONFIG)
    assert host_hits > 0 and tokens[9] != expected(tokens)[9]


def tiers(dtype: str, device_pages: int = 5, host_pages: int = 7) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    rng = np.random.default_rng(3)
    shape = (2, device_pages, PAGE_SIZE, 1, 8)
    device = tuple(rng.standard_normal(shape).astype(dtype) for _ in range(2))
    host = tuple(rng.standard_normal((2, host_pages, *shape[2:])).astype(dtype) for _ in range(2))
    return (device[0], device[1]), (host[0], host[1])


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_tier_copy_equals_the_oracle_both_ways(device: str, dtype: str, request: pytest.FixtureRequest) -> None:
    if device == "cuda":
        request.getfixturevalue("cuda_mode")  # skips where device "cuda" cannot run
    pairs = np.asarray([(4, 0), (0, 6), (2, 3)])
    for forward in (True, False):
        got_device, got_host = tiers(dtype)
        want_device, want_host = tiers(dtype)
        source, destination = (got_device, got_host) if forward else (got_host, got_device)
        oracle_source, oracle_destination = (want_device, want_host) if forward else (want_host, want_device)
        moved = pairs if forward else pairs[:, ::-1][[0, 2]]  # host 0 -> device 4, host 3 -> device 2
        ops.copy_tier(source, destination, moved, device=device)
        ops.copy_tier(oracle_source, oracle_destination, moved, device="numpy")
        for got, want in zip((*got_device, *got_host), (*want_device, *want_host), strict=True):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("device", ["numpy", "cpu", "cuda"])
@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        ([(5, 0)], "outside the source tier"),
        ([(0, 7)], "outside the destination tier"),
        ([(0, 1), (2, 1)], "destination page twice"),
        ([(2**40, 0)], "outside the source tier"),
        ([(-1, 0)], "outside the source tier"),
    ],
)
def test_a_bad_tier_copy_is_refused_and_copies_nothing(
    device: str, pairs: Any, message: str, request: pytest.FixtureRequest
) -> None:
    if device == "cuda":
        request.getfixturevalue("cuda_mode")
    source, destination = tiers("float32")
    before = [array.copy() for array in destination]
    with pytest.raises(ValueError, match=message):
        ops.copy_tier(source, destination, np.asarray(pairs, dtype=np.int64), device=device)
    for array, kept in zip(destination, before, strict=True):
        np.testing.assert_array_equal(array, kept)


def test_tiers_of_different_page_shapes_are_refused() -> None:
    source, _ = tiers("float32")
    other = tuple(np.zeros((2, 3, PAGE_SIZE, 1, 4), dtype=np.float32) for _ in range(2))
    with pytest.raises(ValueError, match="different page shapes"):
        ops.copy_tier(source, (other[0], other[1]), [(0, 0)], device="cpu")
    with pytest.raises(ValueError, match="host_pages"):
        PagedBackend(WEIGHTS, 4, "cpu", -1)


def test_a_tier_split_between_host_and_device_is_refused(cuda_mode: str) -> None:
    from kvsched.kernels.device import cuda

    (device_k, device_v), host = tiers("float32", host_pages=5)
    split = (device_k, cuda.to_device(device_v))
    before = [array.copy() for array in host]
    with pytest.raises(ValueError, match="must both be host arrays or both device arrays"):
        ops.copy_tier(split, host, [(0, 0)], device="cuda")
    for array, kept in zip(host, before, strict=True):
        np.testing.assert_array_equal(array, kept)
