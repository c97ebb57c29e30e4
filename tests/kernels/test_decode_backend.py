"""The paged backend against the dense reference, on every device, in both batch forms."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvsched.abi import ITEM_DTYPE, empty_outputs
from kvsched.kernels import INVALID_BLOCK, ModelConfig, PagedBackend, init_weights, reference_logits
from kvsched.kernels.device import SIMULATED
from kvsched.spec import RaggedBatchItem, RaggedBatchOutput

DEVICES = ["numpy", "cpu", "cuda"]
RTOL = ATOL = 1e-4  # float32 BLAS and summation order against the float64 reference


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    if request.param == "cuda":
        request.getfixturevalue("cuda_mode")
    name: str = request.param
    return name


def items_for(
    tables: dict[int, list[int]], tokens: dict[int, int], positions: dict[int, int], width: int
) -> tuple[list[RaggedBatchItem], list[int]]:
    """Spec-form items and concatenated tables for requests 0.. (request id = slot = index)."""
    items, flat = [], []
    for index, request in enumerate(sorted(tables)):
        items.append(RaggedBatchItem(request + 100, request, tokens[request], positions[request], index * width, width))
        table = tables[request] + [INVALID_BLOCK] * (width - len(tables[request]))
        flat += table
    return items, flat


# In the simulator, device "cuda" runs the float16 cache alone: float32's kernel is the same code
# but for its loads and stores, run by the CPU twin here, natively on a GPU (tests/kernels/
# gpu_check.sh, where SIMULATED is False), and compiled for both in the ptx report.
@pytest.mark.parametrize(
    ("device", "cache_dtype"),
    [
        (name, dtype)
        for name in DEVICES
        for dtype in ("float32", "float16")
        if not (SIMULATED and (name, dtype) == ("cuda", "float32"))
    ],
    indirect=["device"],
)
def test_prefill_then_decode_matches_the_dense_reference(device: str, cache_dtype: str) -> None:
    check_prefill_then_decode(ModelConfig(cache_dtype=cache_dtype), device)


@pytest.mark.parametrize("device", [name for name in DEVICES if not SIMULATED or name != "cuda"], indirect=True)
def test_sliding_window_layers_read_only_their_window(device: str) -> None:
    """gpt-oss's pattern: a sliding-window layer (3 positions) and a full one; every logit of the
    paged backend is the dense reference's with that layer masked to its window, and differs from
    an all-full model's once the context outgrows the window."""
    config = ModelConfig(sliding_window=(3, 0))
    check_prefill_then_decode(config, device)
    prompt = [3, 14, 15, 9, 2, 6]
    weights, full = init_weights(config, seed=11), init_weights(ModelConfig(), seed=11)
    windowed, dense = reference_logits(weights, prompt), reference_logits(full, prompt)
    np.testing.assert_allclose(windowed[:3], dense[:3], rtol=RTOL, atol=ATOL)  # within the window: the same
    assert not np.allclose(windowed[3:], dense[3:], rtol=RTOL, atol=ATOL)


def check_prefill_then_decode(config: ModelConfig, device: str) -> None:
    """Two requests prefilled and decoded three rounds over out-of-order pages: every logit is the
    dense reference's, every token its argmax."""
    weights = init_weights(config, seed=11)
    backend = PagedBackend(weights, pages=12, device=device)
    prompts = {0: [3, 14, 15, 9, 2, 6], 1: [5, 35]}
    tables = {0: [7, 2], 1: [4]}  # physical pages in logical order, deliberately out of order
    tokens: dict[int, int] = {}
    for request, prompt in prompts.items():
        logits = backend.prefill(prompt, 0, tables[request])
        np.testing.assert_allclose(logits, reference_logits(weights, prompt), rtol=RTOL, atol=ATOL)
        tokens[request] = int(np.argmax(logits[-1]))
    sequences = {request: prompt + [tokens[request]] for request, prompt in prompts.items()}
    for _round in range(3):
        for request, sequence in sequences.items():
            if (len(sequence) - 1) // config.page_size >= len(tables[request]):
                tables[request].append(max(max(t) for t in tables.values()) + 1)
        positions = {request: len(sequence) - 1 for request, sequence in sequences.items()}
        items, flat = items_for(tables, tokens, positions, width=4)
        out = [RaggedBatchOutput()] * len(items)
        receipt = backend.execute_ragged(tuple(items), tuple(flat), out)
        assert (receipt.batch_size, receipt.backend_launches) == (2, 1)
        for item, output in zip(items, out, strict=True):
            assert (output.request_id, output.slot) == (item.request_id, item.slot)
            expected = reference_logits(weights, sequences[item.slot])[-1]
            assert output.next_token_id == int(np.argmax(expected))
            tokens[item.slot] = output.next_token_id
            sequences[item.slot].append(output.next_token_id)


def test_spec_records_and_impl_arrays_give_the_same_round() -> None:
    config = ModelConfig()
    weights = init_weights(config, seed=5)
    answers = []
    for form in ("records", "arrays"):
        backend = PagedBackend(weights, pages=8, device="cpu")
        backend.prefill([1, 2, 3], 0, [0])
        backend.prefill([4, 5, 6, 7, 8], 0, [1, 2])
        items, flat = items_for({0: [0], 1: [1, 2]}, {0: 9, 1: 10}, {0: 3, 1: 5}, width=3)
        if form == "records":
            out: Any = [RaggedBatchOutput()] * 2
            backend.execute_ragged(tuple(items), tuple(flat), out)
            answers.append([(o.request_id, o.slot, o.next_token_id) for o in out])
        else:
            array = np.array([tuple(vars_of(item)) for item in items], dtype=ITEM_DTYPE)
            out = empty_outputs(2)
            receipt = backend.execute_ragged(array, np.array(flat, dtype=np.uint32), out)
            assert receipt.backend_launches == 1
            answers.append([(int(o["request_id"]), int(o["slot"]), int(o["next_token_id"])) for o in out])
    assert answers[0] == answers[1]


def vars_of(item: RaggedBatchItem) -> tuple[int, ...]:
    return (
        item.request_id,
        item.slot,
        item.token_id,
        item.position,
        item.block_table_offset,
        item.logical_pages,
        item.reserved,
    )


def test_copy_pages_copies_every_layer(device: str) -> None:
    weights = init_weights(ModelConfig(cache_dtype="float16"), seed=1)
    backend = PagedBackend(weights, pages=6, device=device)
    backend.prefill([1, 2, 3, 4, 5], 0, [3, 0])
    backend.copy_pages([(3, 5)])
    k = backend.k_cache if device != "cuda" else backend.k_cache.copy_to_host()
    v = backend.v_cache if device != "cuda" else backend.v_cache.copy_to_host()
    assert np.any(k[:, 3] != 0)
    np.testing.assert_array_equal(k[:, 5], k[:, 3])
    np.testing.assert_array_equal(v[:, 5], v[:, 3])


@pytest.mark.parametrize(
    ("table", "token", "position", "message"),
    [
        ([0, INVALID_BLOCK], 1, 5, "query 0 reaches table entry 1 .*INVALID_BLOCK"),
        ([0, 99], 1, 5, "query 0 reaches table entry 1 .*page 99"),
        ([0, 1], 1, 8, "query 0 reaches logical page 2 but owns only 2"),
        ([0, 1], 61, 5, "token id 61 is outside the vocabulary"),
    ],
)
def test_bad_rounds_raise_before_writing(
    device: str, table: list[int], token: int, position: int, message: str
) -> None:
    backend = PagedBackend(init_weights(ModelConfig(), seed=2), pages=4, device=device)
    items = (RaggedBatchItem(7, 0, token, position, 0, 2),)
    before = backend.k_cache.copy() if device != "cuda" else backend.k_cache.copy_to_host()
    with pytest.raises(ValueError, match=message):
        backend.execute_ragged(items, tuple(table), [RaggedBatchOutput()])
    after = backend.k_cache if device != "cuda" else backend.k_cache.copy_to_host()
    np.testing.assert_array_equal(after, before)


def test_short_output_buffer_is_refused() -> None:
    backend = PagedBackend(init_weights(ModelConfig(), seed=2), pages=4, device="cpu")
    with pytest.raises(ValueError, match="output buffer holds 0 entries for 1 items"):
        backend.execute_ragged((RaggedBatchItem(7, 0, 1, 0, 0, 1),), (0,), [])


def test_backend_arguments_are_checked() -> None:
    weights = init_weights(ModelConfig(), seed=2)
    with pytest.raises(ValueError, match="pages must be a positive int"):
        PagedBackend(weights, pages=0)
    with pytest.raises(ValueError, match="device must be one of"):
        PagedBackend(weights, pages=2, device="gpu")


@pytest.mark.parametrize("windows", [(3,), (3, 0, 0), (-1, 0), (True, 0), [3, 0]])
def test_a_bad_sliding_window_is_refused(windows: Any) -> None:
    with pytest.raises(ValueError, match="sliding"):
        ModelConfig(sliding_window=windows)
