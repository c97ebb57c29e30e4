"""impl's decode round: the GPU-ready batch it hands the backend, and its scratch contract.

The batch is numpy structured arrays whose bytes are exactly the spec records' `to_bytes()`; the
backend gets views of the scratch (`items` and `block_tables` read-only, `out` set to the spec's
`UNANSWERED` first).
"""

from __future__ import annotations

import struct
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsched import impl, spec
from kvsched.abi import ITEM_DTYPE, OUTPUT_DTYPE, empty_items, empty_outputs
from kvsched.impl.scheduler import get_slots
from kvsched.spec.batch import U32_MAX, U64_MAX, UNANSWERED, RaggedBatchItem, RaggedBatchOutput, RaggedBatchReceipt
from kvsched.spec.errors import BackendFailed, InvalidArgument, MissingInputToken
from kvsched.testing.backends import HarnessBackend
from tests.impl.support import make_spec_system

u32 = st.integers(0, U32_MAX)


@given(st.tuples(st.integers(0, U64_MAX), u32, u32, u32, u32, u32, u32))
def test_item_dtype_is_the_records_bytes(fields: tuple[int, ...]) -> None:
    record = RaggedBatchItem(*fields)
    assert ITEM_DTYPE.itemsize == 32
    assert np.array([fields], dtype=ITEM_DTYPE).tobytes() == record.to_bytes()


@given(st.tuples(st.integers(0, U64_MAX), u32, u32))
def test_output_dtype_is_the_records_bytes(fields: tuple[int, ...]) -> None:
    assert OUTPUT_DTYPE.itemsize == 16
    assert np.array([fields], dtype=OUTPUT_DTYPE).tobytes() == RaggedBatchOutput(*fields).to_bytes()


class Capture:
    """A backend that answers like `FaultBackend` and records what it was handed."""

    def __init__(self) -> None:
        self.args: tuple[Any, Any, Any] | None = None
        self.unanswered = False
        self.answer = HarnessBackend()

    def execute_ragged(self, items: Any, block_tables: Any, out: Any) -> RaggedBatchReceipt:
        self.args = (items, block_tables, out)
        self.unanswered = (
            bytes(out) == UNANSWERED.to_bytes() * len(out)
            if isinstance(out, np.ndarray)
            else (list(out) == [UNANSWERED] * len(out))
        )
        receipt: RaggedBatchReceipt = self.answer.execute_ragged(items, block_tables, out)
        return receipt


def _decoding(system: Any, requests: int) -> None:
    for request in range(requests):
        system.scheduler.admit_with_prefix(2**63 + request, None, system.store, system.pool)
        system.scheduler.mark_prefill_complete(2**63 + request)
        system.scheduler.seed_decode_token(2**63 + request, U32_MAX - request)
        system.scheduler.ensure_writable(2**63 + request, request % 2, system.pool)
    system.scheduler.finish(2**63, system.pool)  # a hole: slot 0 does not decode


def test_lowered_batch_is_byte_identical_to_the_spec_records() -> None:
    sizes = (5, 3, 16, 1, 1)
    expected, actual = make_spec_system(*sizes), impl.make_impl_system(*sizes)
    _decoding(expected, 5)
    _decoding(actual, 5)
    spec_backend, impl_backend = Capture(), Capture()
    expected.scheduler.execute_decode_round(
        spec_backend, expected.new_item_scratch(4), [0] * 12, [RaggedBatchOutput()] * 4
    )
    out_scratch = empty_outputs(6)
    out_scratch.view(np.uint8)[:] = 0xAB  # stale garbage from an earlier round
    actual.scheduler.execute_decode_round(impl_backend, empty_items(4), np.zeros(12, np.uint32), out_scratch)
    assert spec_backend.args is not None and impl_backend.args is not None
    items, tables, out = impl_backend.args
    assert items.tobytes() == b"".join(item.to_bytes() for item in spec_backend.args[0])
    assert tables.tobytes() == struct.pack(f"<{len(spec_backend.args[1])}I", *spec_backend.args[1])
    assert out.tobytes() == b"".join(output.to_bytes() for output in spec_backend.args[2])
    assert impl_backend.unanswered and spec_backend.unanswered  # never a stale answer, nor a valid one
    assert out_scratch[4:].view(np.uint8).tolist() == [0xAB] * 32  # beyond the batch: untouched
    assert actual.snapshot() == expected.snapshot()


def test_backend_gets_read_only_views_of_the_scratch() -> None:
    system = impl.make_impl_system(4, 2, 8, 1, 1)
    _decoding(system, 3)
    buffers = empty_items(8), np.zeros(16, np.uint32), empty_outputs(8)
    backend = Capture()
    system.scheduler.execute_decode_round(backend, *buffers)
    assert backend.args is not None
    for given_view, scratch, length in zip(backend.args, buffers, (2, 4, 2), strict=True):
        assert isinstance(given_view, np.ndarray) and given_view.shape == (length,)
        assert np.shares_memory(given_view, scratch)
    assert not backend.args[0].flags.writeable and not backend.args[1].flags.writeable
    assert backend.args[2].flags.writeable
    assert all(buffer.flags.writeable for buffer in buffers)  # the caller's arrays stay writable


def test_a_backend_writing_its_inputs_fails_the_round_and_changes_nothing() -> None:
    class Tamper:
        def execute_ragged(self, items: Any, block_tables: Any, out: Any) -> RaggedBatchReceipt:
            items["request_id"][0] = 99
            return RaggedBatchReceipt(len(items), 1, 0)

    system = impl.make_impl_system(4, 2, 8, 1, 1)
    _decoding(system, 3)
    before = system.snapshot()
    with pytest.raises(BackendFailed, match="backend raised ValueError") as caught:
        system.scheduler.execute_decode_round(Tamper())
    assert isinstance(caught.value.__cause__, ValueError)
    assert system.snapshot() == before


def test_own_scratch_and_caller_scratch_give_the_same_round() -> None:
    systems = [impl.make_impl_system(4, 2, 8, 1, 1) for _ in range(2)]
    for system in systems:
        _decoding(system, 4)
    first = systems[0].scheduler.execute_decode_round(HarnessBackend())
    second = systems[1].scheduler.execute_decode_round(
        HarnessBackend(), empty_items(3), np.zeros(6, np.uint32), empty_outputs(3)
    )
    assert first == second
    assert systems[0].snapshot() == systems[1].snapshot()


@pytest.mark.parametrize(
    ("position", "buffer"),
    [
        (0, [RaggedBatchItem()] * 4),
        (0, np.zeros(4, OUTPUT_DTYPE)),
        (0, np.zeros((2, 2), ITEM_DTYPE)),
        (0, np.zeros(8, ITEM_DTYPE)[::2]),
        (1, np.zeros(8, np.int32)),
        (1, [0] * 8),
        (2, np.zeros(4, ITEM_DTYPE)),
    ],
)
def test_scratch_of_the_wrong_form_is_refused_before_anything(position: int, buffer: object) -> None:
    system = impl.make_impl_system(4, 2, 8, 1, 1)
    _decoding(system, 3)
    buffers: list[Any] = [empty_items(4), np.zeros(8, np.uint32), empty_outputs(4)]
    buffers[position] = buffer
    backend = HarnessBackend()
    before = system.snapshot()
    with pytest.raises(InvalidArgument, match="must be a writable contiguous 1-D array"):
        system.scheduler.execute_decode_round(backend, *buffers)
    assert backend.calls == 0 and system.snapshot() == before


def test_read_only_scratch_is_refused() -> None:
    system = impl.make_impl_system(2, 2, 4, 1, 1)
    items = empty_items(2)
    items.flags.writeable = False
    with pytest.raises(InvalidArgument):
        system.scheduler.execute_decode_round(HarnessBackend(), items)


def test_missing_input_token_writes_no_scratch() -> None:
    system = impl.make_impl_system(3, 2, 8, 1, 1)
    _decoding(system, 3)
    system.scheduler.admit_with_prefix(7, None, system.store, system.pool)
    system.scheduler.mark_prefill_complete(7)  # slot 0, decoding, never seeded
    items = empty_items(3)
    with pytest.raises(MissingInputToken, match="request 7 in slot 0 has no seeded input token"):
        system.scheduler.execute_decode_round(HarnessBackend(), items)
    assert not items.view(np.uint8).any()  # the spec may lower earlier items; impl lowers none


def test_token_count_saturates_in_a_round() -> None:
    expected, actual = make_spec_system(1, 1, 2, 1, 1), impl.make_impl_system(1, 1, 2, 1, 1)
    systems: tuple[Any, ...] = (expected, actual)
    for system in systems:
        system.scheduler.admit_with_prefix(1, None, system.store, system.pool)
        system.scheduler.mark_prefill_complete(1)
        system.scheduler.seed_decode_token(1, 0)
    slot = expected.scheduler.state.slots[0]
    expected.scheduler.commit(spec.SchedulerState((replace(slot, token_count=U32_MAX - 1),)))
    get_slots(actual.scheduler).token_counts[0] = U32_MAX - 1  # the same state, written directly
    assert actual.snapshot() == expected.snapshot()
    for _ in range(2):
        scratch = expected.new_item_scratch(1), expected.new_table_scratch(1), expected.new_output_scratch(1)
        expected.scheduler.execute_decode_round(HarnessBackend(), *scratch)
        actual.scheduler.execute_decode_round(HarnessBackend())
    assert actual.scheduler.to_spec().slots[0].token_count == U32_MAX
    assert actual.snapshot() == expected.snapshot()


def _overlapping(system: Any) -> dict[str, tuple[Any, Any, Any]]:
    """Scratch triples whose buffers share memory (a structured view of one byte buffer)."""
    raw = np.zeros(4 * 32 + 8 * 4, np.uint8)
    items = raw[: 4 * 32].view(ITEM_DTYPE)
    tables_over_items = raw[:32].view(np.uint32)
    outputs_over_items = raw[: 4 * 16].view(OUTPUT_DTYPE)
    own_tables = get_slots(system.scheduler).tables.reshape(-1)
    return {
        "block_table_scratch": (items, tables_over_items, empty_outputs(4)),
        "output_scratch": (items, np.zeros(8, np.uint32), outputs_over_items),
        "scheduler's own state": (empty_items(4), own_tables, empty_outputs(4)),
    }


@pytest.mark.parametrize("case", ["block_table_scratch", "output_scratch", "scheduler's own state"])
def test_scratch_sharing_memory_is_refused_before_anything(case: str) -> None:
    """Overlapping scratch made the backend read a table the outputs overwrote (and write KV into
    another request's page) while the round committed."""
    system = impl.make_impl_system(4, 2, 8, 1, 1)
    _decoding(system, 3)
    backend = HarnessBackend()
    before = system.snapshot()
    with pytest.raises(InvalidArgument, match="share" if case != "scheduler's own state" else "own state"):
        system.scheduler.execute_decode_round(backend, *_overlapping(system)[case])
    assert backend.calls == 0 and system.snapshot() == before


def test_the_spec_refuses_one_list_as_two_buffers() -> None:
    system = make_spec_system(4, 2, 8, 1, 1)
    _decoding(system, 3)
    shared: list[Any] = [RaggedBatchItem()] * 8
    before = system.snapshot()
    with pytest.raises(InvalidArgument, match="item_scratch and output_scratch share memory"):
        system.scheduler.execute_decode_round(HarnessBackend(), shared, [0] * 8, shared)
    assert system.snapshot() == before
