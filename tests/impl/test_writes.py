"""impl's batched copy-on-write (`prepare_decode_round`, `ensure_writable_batch`) against its
reference, the spec's batched calls (the single calls in sequence, all or nothing).

The lockstep machines compare the two on random states; these pin exact plans and atomicity.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvsched import impl
from kvsched.impl import ALLOCATED, COPY, EXISTING
from kvsched.spec import Allocated, Copy, Existing
from kvsched.spec.batch import INVALID_BLOCK
from kvsched.spec.errors import Exhausted, InvalidArgument, OutOfRange, UnknownRequest
from tests.impl.support import make_spec_system


def _forked_pair(system: Any) -> None:
    """Request 1 writes 4 tokens on page 0 and decodes; request 2 is its fork (sharing page 0)."""
    scheduler, pool = system.scheduler, system.pool
    scheduler.admit_with_prefix(1, None, system.store, pool)
    scheduler.ensure_writable(1, 0, pool)
    for _ in range(4):
        scheduler.record_token(1)
    scheduler.mark_prefill_complete(1)
    scheduler.seed_decode_token(1, 9)
    scheduler.fork(1, 2, pool)


def test_prepare_decode_round_copies_once_then_finds_the_page_exclusive() -> None:
    expected, actual = make_spec_system(3, 4, 4, 1, 1), impl.make_impl_system(3, 4, 4, 1, 1)
    _forked_pair(expected)
    _forked_pair(actual)
    plan = actual.scheduler.prepare_decode_round(actual.pool, 16)
    assert expected.scheduler.prepare_decode_round(expected.pool, 16) == plan
    assert plan.actions() == (Copy(0, 1), Existing(0)) and plan.targets() == ((0, 0), (1, 0))
    assert plan.slots.tolist() == [0, 1] and plan.logical_pages.tolist() == [0, 0]
    assert plan.kinds.tolist() == [COPY, EXISTING]
    assert plan.pages.tolist() == [1, 0] and plan.sources.tolist() == [0, INVALID_BLOCK]
    assert (plan.copy_sources.tolist(), plan.copy_destinations.tolist()) == ([0], [1])
    assert actual.snapshot() == expected.snapshot()
    assert len(actual.scheduler.prepare_decode_round(actual.pool, 16)) == 2  # now both EXISTING
    assert actual.scheduler.prepare_decode_round(actual.pool, 2).actions() == (Allocated(2), Allocated(3))


def test_prepare_decode_round_is_all_or_nothing() -> None:
    system = impl.make_impl_system(3, 4, 3, 1, 1)
    _forked_pair(system)
    system.pool.allocate()  # one free page left: the copy fits, the next allocation does not
    before = system.snapshot([2])
    with pytest.raises(Exhausted) as refused:
        system.scheduler.prepare_decode_round(system.pool, 2)
    message = (
        "no free page for request 2 in slot 1 (logical page 2): the batch needs 2 new pages, 1 of 3 pages are free"
    )
    assert str(refused.value) == message
    assert (refused.value.request_id, refused.value.slot, refused.value.needed, refused.value.free) == (2, 1, 2, 1)
    assert system.snapshot([2]) == before
    with pytest.raises(OutOfRange, match="logical page 4 is outside a table of 4 pages"):
        system.scheduler.prepare_decode_round(system.pool, 1)
    assert system.snapshot([2]) == before
    for bad in (0, -1, 2**32, True, 1.5):
        with pytest.raises(InvalidArgument, match="page_size must be an integer"):
            system.scheduler.prepare_decode_round(system.pool, bad)  # type: ignore[arg-type]


def test_ensure_writable_batch_is_the_single_calls_in_sequence() -> None:
    expected, actual = make_spec_system(3, 4, 8, 1, 1), impl.make_impl_system(3, 4, 8, 1, 1)
    _forked_pair(expected)
    _forked_pair(actual)
    requests, pages = [2, 2, 1, 1, 2], [0, 1, 0, 3, 1]
    actions = expected.scheduler.ensure_writable_batch(requests, pages, expected.pool)
    plan = actual.scheduler.ensure_writable_batch(np.array(requests), np.array(pages), actual.pool)
    assert plan == actions
    assert plan.actions() == (Copy(0, 1), Allocated(2), Existing(0), Allocated(3), Existing(2))
    assert plan.kinds.tolist() == [COPY, ALLOCATED, EXISTING, ALLOCATED, EXISTING]
    assert actual.snapshot() == expected.snapshot()


@pytest.mark.parametrize(
    ("requests", "pages", "error", "message"),
    [
        ([1, 7], [1, 0], UnknownRequest, "request 7 is not live"),
        ([1, 1], [1, 4], OutOfRange, "logical page 4 is outside a table of 4 pages"),
        ([1, 1], [1, 2**70], OutOfRange, f"logical page {2**70} is outside a table of 4 pages"),
        ([1, 1], [1, "2"], InvalidArgument, "logical page must be an integer, got str"),
        ([1, -1], [1, 0], InvalidArgument, "request_id -1 is outside 0..2\\*\\*64-1"),
        (
            [1, 1, 1, 2],
            [1, 2, 3, 1],
            Exhausted,
            "request 2 in slot 1 .logical page 1.: the batch needs 4 new pages, 3 of 4",
        ),
        ([1], [1, 2], InvalidArgument, "1 request ids but 2 logical pages"),
    ],
)
def test_a_failing_step_undoes_the_earlier_ones(
    requests: list[Any], pages: list[Any], error: type, message: str
) -> None:
    expected, actual = make_spec_system(3, 4, 4, 1, 1), impl.make_impl_system(3, 4, 4, 1, 1)
    _forked_pair(expected)
    _forked_pair(actual)
    before = actual.snapshot()
    with pytest.raises(error, match=message):
        expected.scheduler.ensure_writable_batch(requests, pages, expected.pool)
    with pytest.raises(error, match=message):
        actual.scheduler.ensure_writable_batch(requests, pages, actual.pool)
    assert actual.snapshot() == before == expected.snapshot()
