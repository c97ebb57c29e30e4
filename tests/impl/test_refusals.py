"""One integer rule, typed refusals an engine can act on, and one plan type, on spec and impl
alike: any integer but a bool is an id (an `IntEnum` member, a numpy integer read back from the
scheduler's own arrays); a refusal names the request and tells how many pages were missing;
the batched calls return the spec's `WritePlan`."""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import numpy as np
import pytest

from kvsched import impl, spec
from kvsched.spec import (
    Copy,
    DuplicateRequest,
    Exhausted,
    Full,
    InvalidArgument,
    InvalidState,
    MissingInputToken,
    OutOfRange,
    UnknownRequest,
    WritePlan,
    derive_prefix_identity,
)
from kvsched.spec.domain import as_int
from kvsched.spec.plan import pages_needed
from kvsched.testing.backends import HarnessBackend
from kvsched.testing.checks import capture
from tests.impl.support import Flavor, flavors, make_spec_system

FLAVORS = flavors()
IDS = [flavor.name for flavor in FLAVORS]


class Request(IntEnum):
    CHAT = 3
    BATCH = 4


def test_the_integer_rule() -> None:
    """Every integer but a bool denotes the plain int; nothing else is an integer."""
    integers: tuple[object, ...] = (3, Request.CHAT, np.int64(3), np.uint32(3), np.int8(3))
    for value in integers:
        number = as_int(value)
        assert number == 3 and type(number) is int
    others: tuple[object, ...] = (True, np.bool_(True), 3.0, "3", None, np.float64(3), [3])
    for value in others:
        assert as_int(value) is None


@pytest.mark.parametrize("flavor", FLAVORS, ids=IDS)
def test_an_int_subclass_id_is_the_int_it_denotes(flavor: Flavor) -> None:
    """impl admitted an `IntEnum` id, then refused it in every later call (its pages held forever)."""
    system = flavor.system(2, 2, 4, 1, 1)
    system.scheduler.admit_with_prefix(Request.CHAT, None, system.store, system.pool)
    system.scheduler.ensure_writable(Request.CHAT, np.int64(0), system.pool)
    assert system.scheduler.page_table(3) == (0, None)
    (slot,) = system.scheduler.state.slots[:1]
    assert type(slot.request_id) is int  # stored as the plain int
    with pytest.raises(DuplicateRequest):
        system.scheduler.admit_with_prefix(np.uint64(3), None, system.store, system.pool)
    system.scheduler.finish(np.int32(3), system.pool)
    assert system.pool.free_count() == 4


@pytest.mark.parametrize("flavor", FLAVORS, ids=IDS)
def test_ids_read_back_from_numpy_arrays_are_accepted(flavor: Flavor) -> None:
    """`ref_count(np.int64(0))` returned None for a held page; numpy batches were impl's only."""
    system = flavor.system(2, 2, 4, 1, 1)
    for request in (1, 2):
        system.scheduler.admit_with_prefix(request, None, system.store, system.pool)
    assert system.pool.ref_count(np.int64(0)) == 0
    plan = system.scheduler.ensure_writable_batch(np.array([1, 2]), np.array([0, 0]), system.pool)
    assert system.pool.ref_count(np.int64(0)) == 1 and system.pool.ref_count(np.uint32(1)) == 1
    assert plan.targets() == ((0, 0), (1, 0)) and type(plan.targets()[0][0]) is int
    with pytest.raises(InvalidArgument, match="request_id must be an integer, got bool"):
        system.scheduler.finish(True, system.pool)
    with pytest.raises(InvalidArgument, match="logical page must be an integer, got float64"):
        system.scheduler.ensure_writable(1, np.float64(0), system.pool)


@pytest.mark.parametrize("flavor", FLAVORS, ids=IDS)
def test_untyped_escapes_are_invalid_arguments(flavor: Flavor) -> None:
    """`fork_into(None, pool)` raised AttributeError in impl; a bad facts list a TypeError."""
    pool = flavor.module.BlockPool(2)
    table = flavor.module.SequenceBlockTable(2)
    with pytest.raises(InvalidArgument, match="fork target must be a SequenceBlockTable, not NoneType"):
        table.fork_into(None, pool)
    with pytest.raises(InvalidArgument, match="facts must be a sequence, not NoneType"):
        flavor.module.derive_prefix_identity(1, 2, 3, 4, None)
    with pytest.raises(InvalidArgument, match="fact 0 must be a sequence, not int"):
        flavor.module.derive_prefix_identity(1, 2, 3, 4, [7])
    assert derive_prefix_identity(1, 2, 3, 4, [np.arange(6)]) == derive_prefix_identity(1, 2, 3, 4, [range(6)])  # type: ignore[list-item]


def test_the_spec_round_refuses_impl_arrays() -> None:
    """The spec's round given impl's scratch arrays raised TypeError from inside the lowering."""
    system = make_spec_system(1, 1, 2, 1, 1, page_size=2)
    system.scheduler.admit_with_prefix(1, None, system.store, system.pool)
    system.scheduler.mark_prefill_complete(1)
    system.scheduler.seed_decode_token(1, 5)
    system.scheduler.ensure_writable(1, 0, system.pool)
    before = system.snapshot()
    scratch = impl.empty_items(1), np.zeros(1, dtype=np.uint32), impl.empty_outputs(1)
    with pytest.raises(InvalidArgument, match=r"item_scratch must be a mutable sequence \(a list\), not ndarray"):
        system.scheduler.execute_decode_round(HarnessBackend(), *scratch)  # type: ignore[arg-type]
    assert system.snapshot() == before


def _two_decoding_sharers(flavor: Flavor, pages: int) -> Any:
    """Requests 1 and 2 (its fork) share page 0 and decode at position 2 (page size 2): each
    needs a new page for logical page 1; `pages - 1` pages are free."""
    system = flavor.system(3, 2, pages, 1, 1, page_size=2)
    system.scheduler.admit_with_prefix(1, None, system.store, system.pool)
    system.scheduler.ensure_writable(1, 0, system.pool)
    for _ in range(2):
        system.scheduler.record_token(1)
    system.scheduler.mark_prefill_complete(1)
    system.scheduler.seed_decode_token(1, 9)
    system.scheduler.fork(1, 2, system.pool)
    return system


@pytest.mark.parametrize("flavor", FLAVORS, ids=IDS)
def test_an_exhausted_round_preparation_names_the_request_and_the_shortfall(flavor: Flavor) -> None:
    """`prepare_decode_round` raised "no free page: all 5 pages are held" while pages were free
    after the rollback, and named no request: an engine could not choose whom to preempt."""
    system = _two_decoding_sharers(flavor, 2)
    before = system.snapshot()
    with pytest.raises(Exhausted) as refused:
        system.scheduler.prepare_decode_round(system.pool, 2)
    assert system.snapshot() == before
    error = refused.value
    assert str(error) == (
        "no free page for request 2 in slot 1 (logical page 1): the batch needs 2 new pages, 1 of 2 pages are free"
    )
    assert error.details() == {
        "request_id": 2,
        "slot": 1,
        "logical_page": 1,
        "page": None,
        "holders": None,
        "needed": 2,
        "free": 1,
    }
    assert error.needed is not None and error.free is not None
    assert error.needed - error.free == 1  # preempting one request would do
    system.scheduler.finish(1, system.pool)
    assert len(system.scheduler.prepare_decode_round(system.pool, 2)) == 1


@pytest.mark.parametrize("flavor", FLAVORS, ids=IDS)
def test_a_single_write_without_a_page_names_its_request(flavor: Flavor) -> None:
    system = _two_decoding_sharers(flavor, 1)
    with pytest.raises(Exhausted) as refused:
        system.scheduler.ensure_writable(2, 0, system.pool)  # a copy of the shared page 0
    assert str(refused.value) == (
        "no free page for request 2 in slot 1 (logical page 0): it needs 1 new page, 0 of 1 pages are free"
    )
    assert (refused.value.request_id, refused.value.needed, refused.value.free) == (2, 1, 0)
    with pytest.raises(Exhausted) as bare:
        system.pool.allocate()
    assert (bare.value.request_id, bare.value.needed, bare.value.free) == (None, 1, 0)


@pytest.mark.parametrize("flavor", FLAVORS, ids=IDS)
def test_refusals_carry_typed_details(flavor: Flavor) -> None:
    system = flavor.system(1, 2, 2, 1, 1)
    scheduler, pool = system.scheduler, system.pool
    cases = [
        (lambda: scheduler.finish(9, pool), UnknownRequest, {"request_id": 9}),
        (lambda: scheduler.admit_with_prefix(4, None, system.store, pool), None, {}),
        (lambda: scheduler.admit_with_prefix(4, None, system.store, pool), DuplicateRequest, {"request_id": 4}),
        (lambda: scheduler.admit_with_prefix(5, None, system.store, pool), Full, {"request_id": 5}),
        (lambda: scheduler.ensure_writable(4, 2, pool), OutOfRange, {"logical_page": 2}),
        (lambda: scheduler.mark_prefill_complete(4), None, {}),
        (lambda: scheduler.mark_prefill_complete(4), InvalidState, {"request_id": 4, "slot": 0}),
        (lambda: scheduler.ensure_writable(4, 0, pool), None, {}),
        (
            lambda: scheduler.execute_decode_round(HarnessBackend(), *flavor.scratch(1, 2, 1)),
            MissingInputToken,
            {"request_id": 4, "slot": 0},
        ),
        (lambda: pool.retain(1), spec.InvalidBlock, {"page": 1, "holders": 0}),
        (lambda: pool.release(1), spec.DoubleRelease, {"page": 1, "holders": 0}),
        (lambda: pool.release(2), spec.InvalidBlock, {"page": 2}),
    ]
    for call, error, details in cases:
        result = capture(call)
        assert result.error is error, (result, error)
        assert {name: value for name, value in result.details if value is not None} == details


@pytest.mark.parametrize("flavor", FLAVORS, ids=IDS)
def test_both_return_the_spec_plan_type(flavor: Flavor) -> None:
    """impl returned its own `WritePlan` where the spec returned a tuple: every comparer shimmed."""
    system = _two_decoding_sharers(flavor, 4)
    plan = system.scheduler.ensure_writable_batch([2], [0], system.pool)
    assert isinstance(plan, WritePlan)
    assert plan == WritePlan([(1, 0)], [Copy(0, 1)])
    assert plan != WritePlan([(0, 0)], [Copy(0, 1)])  # the same action for another target
    assert list(plan) == [Copy(0, 1)] and plan[0] == Copy(0, 1) and plan.copies() == (Copy(0, 1),)
    assert plan != (Copy(0, 1),)  # a plan is not a bare tuple


def test_impl_and_spec_plans_compare_by_their_steps() -> None:
    expected, actual = _two_decoding_sharers(FLAVORS[0], 4), _two_decoding_sharers(FLAVORS[1], 4)
    plans = [system.scheduler.prepare_decode_round(system.pool, 2) for system in (expected, actual)]
    assert type(plans[1]) is impl.ArrayWritePlan and plans[0] == plans[1]
    assert (
        repr(plans[0])
        == repr(plans[1])
        == ("WritePlan(targets=((0, 1), (1, 1)), actions=(Allocated(page=1), Allocated(page=2)))")
    )


def test_pages_needed_sees_earlier_steps() -> None:
    """A copy leaves its source with one holder fewer; a target written once needs nothing more."""
    holders = {0: 3, 1: 2, 2: 1}.__getitem__
    assert pages_needed([((0, 0), 0), ((1, 0), 0), ((2, 0), 0)], holders) == 2  # the third finds it its own
    assert pages_needed([((0, 0), None), ((0, 0), None)], holders) == 1
    assert pages_needed([((0, 0), 2), ((1, 0), 1), ((2, 0), 1)], holders) == 1
    assert pages_needed([], holders) == 0
