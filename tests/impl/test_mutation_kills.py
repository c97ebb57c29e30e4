"""Tests written against the surviving mutants of the mutation run (`devtools/MUTATION.md`).

Each test pins a behaviour the lockstep machines and the other impl tests left open: impl
against the spec on a concrete case (same results, errors and `to_spec()` states), or a
representation promise impl's docstrings make. The mutant each test kills is named in its
docstring; the mutants judged equivalent are listed, with reasons, in MUTATION.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvsched import impl, spec
from kvsched.abi import ITEM_DTYPE, OUTPUT_DTYPE, empty_items, empty_outputs, table_array
from kvsched.impl.pool import get_arrays
from kvsched.impl.prefix import get_indexes as get_store_indexes
from kvsched.impl.refinement import check_representation
from kvsched.impl.scheduler import get_indexes, get_slots
from kvsched.impl.table import get_row
from kvsched.spec import Copy, PrefixIdentity, PrefixPageSet
from kvsched.spec.errors import InvalidArgument, OutOfRange
from kvsched.spec.events import Fault
from kvsched.testing.backends import HarnessBackend
from kvsched.testing.checks import Outcome, capture
from tests.impl.support import Flavor, flavors, make_spec_system


def _two_decoding(system: Any) -> None:
    """Requests 1 and 2 admitted without a prefix, both in DECODE with a seeded token."""
    scheduler, pool = system.scheduler, system.pool
    for request in (1, 2):
        scheduler.admit_with_prefix(request, None, system.store, pool)
        scheduler.mark_prefill_complete(request)
        scheduler.seed_decode_token(request, 5)


def test_a_failing_round_preparation_ignores_the_previous_rounds_steps() -> None:
    """`prepare_decode_round` reuses the scheduler's step buffers: a preparation that fails at its
    first step must undo nothing, however the last buffer entry was left by an earlier round.
    (Kills `page_kernels.undo_rows` undoing one step too many: `range(count - 1, -2, -1)`.)"""
    expected, actual = make_spec_system(2, 2, 4, 1, 1), impl.make_impl_system(2, 2, 4, 1, 1)
    for system in (expected, actual):
        _two_decoding(system)
    first = actual.scheduler.prepare_decode_round(actual.pool, 16)  # both allocate: the buffer's last step too
    assert first == expected.scheduler.prepare_decode_round(expected.pool, 16)
    assert first.kinds.tolist() == [impl.ALLOCATED, impl.ALLOCATED]
    for system in (expected, actual):
        system.scheduler.record_token(1)
        system.scheduler.record_token(1)  # request 1 now writes logical page 2: outside its table
    before = actual.snapshot()
    assert before == expected.snapshot()
    spec_failure = capture(lambda: expected.scheduler.prepare_decode_round(expected.pool, 1))
    impl_failure = capture(lambda: actual.scheduler.prepare_decode_round(actual.pool, 1))
    assert spec_failure.error is OutOfRange
    assert (impl_failure.error, impl_failure.message, impl_failure.details) == (
        spec_failure.error,
        spec_failure.message,
        spec_failure.details,
    )
    assert actual.snapshot() == before == expected.snapshot()
    assert actual.check() == ()


@pytest.mark.parametrize("tables", [[1, 2, 0xFFFFFFFF], np.array([1, 2, 0xFFFFFFFF], dtype=np.int64)])
def test_table_array_gives_uint32_from_either_form(tables: Any) -> None:
    """A backend handed spec-form lists or wider arrays gets the ABI's uint32 tables.
    (Kills `abi.table_array` without its `dtype=np.uint32`, in either branch.)"""
    array = table_array(tables)
    assert array.dtype == np.uint32
    assert array.flags.c_contiguous
    assert array.tolist() == [1, 2, 0xFFFFFFFF]


def test_a_standalone_table_is_one_uint32_row() -> None:
    """The table's storage is the uint32 row its docstring promises (half the memory of numpy's
    default int64). (Kills `SequenceBlockTable.__init__` without `dtype=np.uint32`.)"""
    row = get_row(impl.SequenceBlockTable(3))
    assert row.dtype == np.uint32
    assert row.shape == (3,)


def test_the_debug_check_sees_a_heap_out_of_order_at_its_root() -> None:
    """The empty-entry heap's root must be its least entry.
    (Kills `refinement._is_exact_heap` checking children from index 2.)"""
    system = impl.make_impl_system(1, 1, 1, 2, 1)
    empty = get_store_indexes(system.store)[2]
    empty[:] = [1, 0]
    assert check_representation(system.pool, system.store, system.scheduler) == ("rep_store_empty_heap_exact",)


def test_the_debug_check_sees_a_heap_out_of_order_below_its_root() -> None:
    """Heap order is checked against each entry's own parent, `(child - 1) // 2`.
    (Kills `refinement._is_exact_heap` with the parent `(child - 1) // 3`.)"""
    system = impl.make_impl_system(4, 1, 1, 1, 1)
    empty = get_indexes(system.scheduler)[1]
    empty[:] = [0, 3, 1, 2]  # entry 3's parent is entry 1 (3 > 2); `// 3` would compare it with the root
    assert check_representation(system.pool, system.store, system.scheduler) == ("rep_scheduler_empty_heap_exact",)


def test_the_debug_check_sees_a_request_index_pointing_at_the_wrong_slot() -> None:
    """An index of the right size that maps a request to another live slot is not exact.
    (Kills `refinement.rep_scheduler_index_exact` with `or` for `and`.)"""
    system = impl.make_impl_system(2, 1, 1, 1, 1)
    for request in (1, 2):
        system.scheduler.admit_with_prefix(request, None, system.store, system.pool)
    slot_of = get_indexes(system.scheduler)[0]
    slot_of[1], slot_of[2] = 1, 0
    assert check_representation(system.pool, system.store, system.scheduler) == ("rep_scheduler_index_exact",)


def _release_into(flavor: Flavor, mapped: tuple[int, int], pool_pages: int, setup: str) -> tuple[object, ...]:
    """A table mapping logical pages `mapped` and 3 released into a pool where its last page
    cannot be released: what `release_all` raised, and the pool and table after."""
    module = flavor.module
    home = module.BlockPool(8)
    table = module.SequenceBlockTable(4)
    for logical in mapped:
        table.ensure_writable(logical, home)  # pages 0 and 1
    if setup == "double release":
        pool = home
        table.ensure_writable(3, pool)  # page 2
        pool.retain(0)  # page 0 held twice: its undo must restore 2, not 1
        pool.release(2)  # someone else's release: the table's page 2 is free
    else:  # "out of pool": the table's last page is outside a smaller pool
        home.allocate()  # page 2
        table.ensure_writable(3, home)  # page 3
        pool = module.BlockPool(pool_pages)
        for _ in range(2):
            pool.allocate()  # pages 0 and 1, as in the table
        pool.retain(0)
    result = capture(lambda: table.release_all(pool))
    return result.error, result.message, pool.state, table.entries()


@pytest.mark.parametrize("mapped", [(0, 1), (0, 2)])
@pytest.mark.parametrize(("setup", "pool_pages"), [("double release", 8), ("out of pool", 3), ("out of pool", 2)])
def test_a_release_that_fails_part_way_undoes_the_earlier_pages(
    mapped: tuple[int, int], setup: str, pool_pages: int
) -> None:
    """`release_all` refused at its last page (a page already free, or one outside the pool: a
    table released into another pool) undoes the earlier releases exactly: a page that reached
    zero comes back off the free stack, a shared page gets its count back, an unmapped entry
    between them is skipped. (Kills `page_kernels.release_pages` with the pool bound `>` or `and`,
    without its out-of-pool status or `break`, and with the undo loop stepping by 2, stopping at
    an unmapped entry or setting counts to 1.)"""
    spec_flavor, impl_flavor = flavors()
    expected = _release_into(spec_flavor, mapped, pool_pages, setup)
    assert expected[0] is not None
    assert _release_into(impl_flavor, mapped, pool_pages, setup) == expected


def _reclaim(flavor: Flavor, case: str) -> tuple[object, ...]:
    """Publish a store's entries from one pool, then reclaim: what it returned, and the store and
    pool after. Each producer hands its reference to the store, so an entry is idle unless
    something else holds one of its pages."""
    module = flavor.module
    home = module.BlockPool(4)
    store = module.PrefixKvStore(3, 2)
    pages = [home.allocate() for _ in range(3)]  # 0, 1, 2
    sets = {
        "least recently used at entry 0": [(pages[0],), (pages[1],), (pages[2],)],
        "entries sharing a page": [(pages[0],), (pages[0], pages[1])],
        "another pool": [(pages[2],), (pages[0],)],  # the out-of-pool entry is the older
    }[case]
    for index, page_set in enumerate(sets):
        store.publish(PrefixPageSet(PrefixIdentity((index, 0, 0, 0)), page_set, 3), home)
    for page in pages:
        home.release(page)
    pool = home
    target = {"least recently used at entry 0": 2, "entries sharing a page": 4}.get(case, 0)  # 1, 2 pages short
    if case == "another pool":
        pool, target = module.BlockPool(2), 1  # page 2 is outside it; page 0 held there once
        pool.allocate()
        pool.allocate()
    freed = capture(lambda: store.reclaim(pool, target))
    return freed, store.state, pool.state


@pytest.mark.parametrize("case", ["least recently used at entry 0", "entries sharing a page", "another pool"])
def test_reclaim_picks_what_the_spec_picks(case: str) -> None:
    """`reclaim` evicts the least recently used idle entry when that is entry 0; counts a page two
    entries share once per entry; and never evicts an entry naming a page outside the pool it is
    given (a store used with another pool), the page one past the end included. (Kills
    `prefix.find_idle_lru` with `best > 0` or `best >= 1` for `best >= 0`, with `store_refs[page]
    = 1` for `+= 1`, and with `page <= size` or `page > size` for the pool bound.)"""
    spec_flavor, impl_flavor = flavors()
    assert _reclaim(impl_flavor, case) == _reclaim(spec_flavor, case)


def _two_copies(system: Any) -> None:
    """Request 1 maps logical pages 0 and 1; request 2 is its fork, sharing both."""
    scheduler, pool = system.scheduler, system.pool
    scheduler.admit_with_prefix(1, None, system.store, pool)
    for logical in (0, 1):
        scheduler.ensure_writable(1, logical, pool)
    scheduler.fork(1, 2, pool)


def test_a_plan_compacts_every_copy() -> None:
    """A batch that copies two shared pages lists both copies, in step order.
    (Kills `page_kernels.collect_copies` counting with `copies = 1`.)"""
    expected, actual = make_spec_system(2, 3, 6, 1, 1), impl.make_impl_system(2, 3, 6, 1, 1)
    for system in (expected, actual):
        _two_copies(system)
    actions = expected.scheduler.ensure_writable_batch([2, 1, 2], [1, 2, 0], expected.pool)
    plan = actual.scheduler.ensure_writable_batch([2, 1, 2], [1, 2, 0], actual.pool)
    assert plan == actions
    copies = [action for action in actions if isinstance(action, Copy)]
    assert len(copies) == 2
    assert plan.copy_sources.tolist() == [copy.source for copy in copies]
    assert plan.copy_destinations.tolist() == [copy.destination for copy in copies]
    assert actual.snapshot() == expected.snapshot()


def test_the_largest_page_size_is_accepted() -> None:
    """`page_size` ranges over 1..2**32-1, its upper end included, as in the reference.
    (Kills `writes.prepare_decode_round` bounding `page_size < U32_MAX`.)"""
    expected, actual = make_spec_system(2, 2, 4, 1, 1), impl.make_impl_system(2, 2, 4, 1, 1)
    for system in (expected, actual):
        _two_decoding(system)
    largest = 2**32 - 1
    actions = expected.scheduler.prepare_decode_round(expected.pool, largest)
    assert actual.scheduler.prepare_decode_round(actual.pool, largest) == actions
    assert actual.snapshot() == expected.snapshot()


def _outside_the_pool(system: Any) -> Any:
    """Request 1 maps page 3 of the system's pool at logical page 0; request 2 maps nothing. Both
    decode. Returns a pool of 3 pages (page 3 is one past its end) where page 0 is held."""
    scheduler, pool = system.scheduler, system.pool
    for _ in range(3):
        pool.allocate()  # pages 0, 1, 2 held outside: request 1's page is 3
    _two_decoding(system)
    scheduler.ensure_writable(1, 0, pool)
    other = type(pool)(3)
    other.allocate()
    return other


@pytest.mark.parametrize("call", ["prepare_decode_round", "ensure_writable_batch"])
def test_writing_a_page_outside_the_pool_is_refused_and_undone(call: str) -> None:
    """A table that maps a page outside the pool its kernel is handed (another pool) gets the
    spec's `InvalidBlock`, the page one past the end included, and earlier steps are undone. The
    scheduler refuses another pool before any kernel runs, so the kernels' own check is reached
    through the module functions, as a defence in depth. (Kills `page_kernels.ensure_rows`
    bounding `current > size`, and without its out-of-pool status or `break`.)"""
    expected, actual = make_spec_system(2, 2, 8, 1, 1), impl.make_impl_system(2, 2, 8, 1, 1)
    spec_pool, impl_pool = _outside_the_pool(expected), _outside_the_pool(actual)
    bound = capture(lambda: actual.scheduler.prepare_decode_round(impl_pool, 16))
    assert bound.error is InvalidArgument and "than the one this scheduler is bound to" in bound.message
    state, slots = expected.scheduler.state, get_slots(actual.scheduler)
    buffers = impl.writes.new_write_buffers(2)
    if call == "prepare_decode_round":
        spec_call = capture(lambda: spec.lifecycle.prepare_decode_round(state, spec_pool.state, 16)[2])
        impl_call = capture(lambda: impl.writes.prepare_decode_round(slots, impl_pool, 16, buffers))
    else:  # request 2's allocation comes first and is undone
        slot_of = get_indexes(actual.scheduler)[0]
        spec_call = capture(lambda: spec.lifecycle.ensure_writable_batch(state, spec_pool.state, [2, 1], [0, 0])[2])
        impl_call = capture(lambda: impl.writes.ensure_writable_batch(slots, slot_of, [2, 1], [0, 0], impl_pool))
    assert spec_call.message == "page 3 is out of range for a pool of 3 pages"
    assert impl_call == spec_call
    assert (impl_pool.to_spec(), actual.scheduler.to_spec()) == (spec_pool.state, expected.scheduler.state)


def _three_sharers(system: Any) -> None:
    """Request 1 maps page 0 at logical page 0; requests 2 and 3 are its forks."""
    scheduler, pool = system.scheduler, system.pool
    scheduler.admit_with_prefix(1, None, system.store, pool)
    scheduler.ensure_writable(1, 0, pool)
    scheduler.fork(1, 2, pool)
    scheduler.fork(1, 3, pool)


def test_copying_a_page_shared_three_ways_leaves_two_references() -> None:
    """A copy-on-write of a page three requests share drops exactly one reference from it.
    (Kills `page_kernels.ensure_rows` setting the source's count to 1 after a copy.)"""
    expected, actual = make_spec_system(3, 2, 4, 1, 1), impl.make_impl_system(3, 2, 4, 1, 1)
    for system in (expected, actual):
        _three_sharers(system)
    actions = expected.scheduler.ensure_writable_batch([2], [0], expected.pool)
    assert actual.scheduler.ensure_writable_batch([2], [0], actual.pool) == actions
    assert actions.actions() == (Copy(0, 1),)
    assert actual.snapshot() == expected.snapshot()
    assert actual.pool.ref_count(0) == 2


def test_a_batch_exhausted_after_a_copy_undoes_the_copy() -> None:
    """A batch whose second copy-on-write finds the pool exhausted undoes the first copy: the
    source regains its reference, the destination goes back on the free stack.
    (Kills `page_kernels.ensure_rows` handing the undo no copy sources.)"""
    expected, actual = make_spec_system(3, 2, 2, 1, 1), impl.make_impl_system(3, 2, 2, 1, 1)
    for system in (expected, actual):
        _three_sharers(system)
    before = actual.snapshot()
    spec_call = capture(lambda: expected.scheduler.ensure_writable_batch([2, 3], [0, 0], expected.pool))
    impl_call = capture(lambda: actual.scheduler.ensure_writable_batch([2, 3], [0, 0], actual.pool))
    assert spec_call.message == (
        "no free page for request 3 in slot 2 (logical page 0): the batch needs 2 new pages, 1 of 2 pages are free"
    )
    assert impl_call == spec_call
    assert actual.snapshot() == before == expected.snapshot()


class _NotAReceipt:
    """A backend that answers every item, then returns a number instead of a receipt."""

    def execute_ragged(self, items: Any, block_tables: Any, out: Any) -> Any:
        HarnessBackend().execute_ragged(items, block_tables, out)
        return 42


def _refused_round(flavor: Flavor, backend: Any) -> tuple[object, object]:
    system = flavor.system(2, 2, 4, 1, 1)
    _two_decoding(system)
    scratch = flavor.scratch(2, 4, 2)
    return capture(lambda: system.scheduler.execute_decode_round(backend, *scratch)), system.snapshot()


@pytest.mark.parametrize("backend", [_NotAReceipt(), HarnessBackend(Fault.WRONG_BATCH)], ids=["int", "size"])
def test_a_round_refused_for_its_receipt_says_what_the_spec_says(backend: Any) -> None:
    """A receipt that is not one, or counts the wrong batch size, is refused with the spec's
    message. (Kills `lowering.run_lowered` naming `type(None)` for the receipt's type, and
    raising `OutputIdentityMismatch(None)` for a wrong batch size.)"""
    spec_flavor, impl_flavor = flavors()
    expected = _refused_round(spec_flavor, backend)
    assert isinstance(expected[0], Outcome) and expected[0].error is not None
    assert _refused_round(impl_flavor, backend) == expected


def _fork_to(system: Any, child_id: object) -> Outcome:
    system.scheduler.admit_with_prefix(1, None, system.store, system.pool)
    return capture(lambda: system.scheduler.fork(1, child_id, system.pool))


def test_an_invalid_child_id_is_named_in_the_error() -> None:
    """`fork` names the bad argument `child_id`, as the spec does.
    (Kills `RequestScheduler.fork` checking the child id under another name.)"""
    expected = _fork_to(make_spec_system(2, 1, 2, 1, 1), -1)
    assert expected.message == "child_id -1 is outside 0..2**64-1"
    assert _fork_to(impl.make_impl_system(2, 1, 2, 1, 1), -1) == expected


def _count_past_the_maximum(system: Any) -> list[int]:
    """Admit request 7 with a prefix of 2**32 - 2 tokens, record two tokens: each count returned
    and stored."""
    page = system.pool.allocate()
    identity = PrefixIdentity((1, 2, 3, 4))
    system.store.publish(PrefixPageSet(identity, (page,), 2**32 - 2), system.pool)
    system.scheduler.admit_with_prefix(7, identity, system.store, system.pool)
    counts = []
    for _ in range(2):
        counts.append(system.scheduler.record_token(7))
        counts.append(system.scheduler.state.slots[0].token_count)
    return counts


def test_record_token_reaches_the_u32_maximum_and_stays() -> None:
    """A count one below 2**32 - 1 (from an attached prefix) is counted up to the maximum and
    stored there; the next token saturates. (Kills `record_token` saturating at `count >= U32_MAX`,
    which returns the maximum but never stores it.)"""
    expected = _count_past_the_maximum(make_spec_system(1, 1, 2, 1, 1))
    assert expected == [2**32 - 1] * 4
    assert _count_past_the_maximum(impl.make_impl_system(1, 1, 2, 1, 1)) == expected


class _PageId(int):
    """An int subclass: a page id the spec takes like any int."""


def _page_zero_by_subclass(flavor: Flavor) -> tuple[object, ...]:
    pool = flavor.module.BlockPool(2)
    pool.allocate()
    results: list[object] = [capture(lambda: pool.retain(_PageId(0))), pool.ref_count(_PageId(0))]
    results += [capture(lambda: pool.release(_PageId(0))), capture(lambda: pool.writable(_PageId(0)))]
    return (*results, pool.state)


def test_page_zero_given_as_an_int_subclass_is_a_page() -> None:
    """An int that is not exactly `int` takes the slow path of the page check; page 0 is in range
    there too. (Kills `BlockPool._require_page` bounding the slow path with `1 <=` or `0 <`.)"""
    spec_flavor, impl_flavor = flavors()
    expected = _page_zero_by_subclass(spec_flavor)
    assert expected[0] == Outcome() and expected[1] == 2
    assert _page_zero_by_subclass(impl_flavor) == expected


@pytest.mark.parametrize(("position", "name"), [(0, "item_scratch"), (1, "block_table_scratch"), (2, "output_scratch")])
def test_a_refused_scratch_buffer_is_named(position: int, name: str) -> None:
    """impl's scratch check names the buffer it refuses.
    (Kills `RequestScheduler.execute_decode_round` checking a buffer under another name.)"""
    system = impl.make_impl_system(2, 2, 4, 1, 1)
    buffers: list[Any] = [empty_items(2), np.zeros(4, np.uint32), empty_outputs(2)]
    buffers[position] = [0] * 4
    with pytest.raises(InvalidArgument, match=f"^{name} must be a writable contiguous 1-D array of "):
        system.scheduler.execute_decode_round(HarnessBackend(), *buffers)


def _install(flavor: Flavor, pages: list[object]) -> tuple[object, ...]:
    """Install `pages` as a prefix into a fresh table over a pool holding pages 0 and 1."""
    pool = flavor.module.BlockPool(4)
    pool.allocate()
    pool.allocate()
    table = flavor.module.SequenceBlockTable(4)
    result = capture(lambda: table.install_shared_prefix(pages, pool))
    return result, pool.state, table.entries()


@pytest.mark.parametrize("pages", [[0, 1, "2"], [0, 2**70]], ids=["not an int", "far out of range"])
def test_a_prefix_with_a_bad_page_id_is_refused_and_undone(pages: list[object]) -> None:
    """A prefix whose last page id is not an int, or an int no array can hold, is refused with the
    spec's error after the earlier pages were retained and released again.
    (Kills `pool.retain_sequence` returning at a non-int instead of refusing it, undoing with no
    counts, and storing an out-of-range id as it is.)"""
    spec_flavor, impl_flavor = flavors()
    expected = _install(spec_flavor, pages)
    assert isinstance(expected[0], Outcome) and expected[0].error is not None
    assert _install(impl_flavor, pages) == expected


def _replace_a_set_someone_released(flavor: Flavor) -> tuple[object, ...]:
    """Publish a set, let an outside holder release its page once too often, then publish a new
    set under the same identity: releasing the old set fails after the new one was retained."""
    pool = flavor.module.BlockPool(4)
    store = flavor.module.PrefixKvStore(2, 1)
    identity = PrefixIdentity((9, 9, 9, 9))
    old, new = pool.allocate(), pool.allocate()
    store.publish(PrefixPageSet(identity, (old,), 2), pool)
    pool.release(old)
    pool.release(old)  # the store's own reference: its entry names a free page
    result = capture(lambda: store.publish(PrefixPageSet(identity, (new,), 3), pool))
    return result, store.state, pool.state


def test_a_replacement_that_cannot_release_the_old_set_changes_nothing() -> None:
    """`publish` over an entry whose pages cannot be released undoes the new set's retains and
    raises the spec's error. (Kills `PrefixKvStore.publish` undoing with no pool or no pages.)"""
    spec_flavor, impl_flavor = flavors()
    expected = _replace_a_set_someone_released(spec_flavor)
    assert isinstance(expected[0], Outcome) and expected[0].message == "page 0 is already free"
    assert _replace_a_set_someone_released(impl_flavor) == expected


def _fork_into_a_smaller_pool(system: Any) -> tuple[object, ...]:
    """Request 1 maps pages 0, 1 and 3 of an 8-page pool; fork it using a 3-page pool where pages
    0 and 1 are held (page 3 is one past its end): two retains to undo."""
    scheduler, pool = system.scheduler, system.pool
    scheduler.admit_with_prefix(1, None, system.store, pool)
    scheduler.ensure_writable(1, 0, pool)  # page 0
    scheduler.ensure_writable(1, 1, pool)  # page 1
    pool.allocate()
    scheduler.ensure_writable(1, 2, pool)  # page 3
    other = type(pool)(3)
    other.allocate()
    other.allocate()
    refused = capture(lambda: scheduler.fork(1, 2, other))  # the scheduler is bound to `pool`
    assert refused.error is InvalidArgument and "than the one this scheduler is bound to" in refused.message
    if isinstance(scheduler, impl.RequestScheduler):  # the kernel's own check, reached directly
        tables = get_slots(scheduler).tables
        result = capture(lambda: impl.table.fork_row(tables[0], tables[1], other))
        return result, other.state, tuple(tables[1].tolist())
    parent, child = (slot.table for slot in scheduler.state.slots[:2])
    result = capture(lambda: other.commit(spec.table.fork(parent, child, other.state)[1]))
    return result, other.state, spec.table.to_abi(child)


def test_a_fork_retaining_a_page_outside_the_pool_is_refused_and_undone() -> None:
    """Forking a request whose table maps a page outside the pool handed in (another pool: the
    scheduler refuses it, so the kernel is called directly) raises the spec's `InvalidBlock`,
    the page one past the end included, and undoes the earlier retains. (Kills
    `page_kernels.retain_pages` bounding the pool with `page > size`, and its undo stepping by 2
    or testing `skip_invalid or` / `page != INVALID`.)"""
    expected = _fork_into_a_smaller_pool(make_spec_system(2, 3, 8, 1, 1))
    assert isinstance(expected[0], Outcome)
    assert expected[0].message == "page 3 is out of range for a pool of 3 pages"
    assert _fork_into_a_smaller_pool(impl.make_impl_system(2, 3, 8, 1, 1)) == expected


def _seed(system: Any, token: object) -> Outcome:
    system.scheduler.admit_with_prefix(1, None, system.store, system.pool)
    return capture(lambda: system.scheduler.seed_decode_token(1, token))


def test_an_invalid_token_id_is_named_in_the_error() -> None:
    """`seed_decode_token` names the bad argument `token_id`, as the spec does.
    (Kills `RequestScheduler.seed_decode_token` checking the token under another name.)"""
    expected = _seed(make_spec_system(1, 1, 1, 1, 1), 2**32)
    assert expected.message == "token_id 4294967296 is outside 0..2**32-1"
    assert _seed(impl.make_impl_system(1, 1, 1, 1, 1), 2**32) == expected


def _write_logical(system: Any, logical_page: object) -> tuple[object, ...]:
    system.scheduler.admit_with_prefix(1, None, system.store, system.pool)
    result = capture(lambda: system.scheduler.ensure_writable(1, logical_page, system.pool))
    return result, system.snapshot()


def test_a_bool_logical_page_is_refused() -> None:
    """`ensure_writable` refuses `True` as a logical page (booleans are not ints here), as the spec
    does. (Kills `RequestScheduler.ensure_writable` skipping the check for non-`int` types.)"""
    expected = _write_logical(make_spec_system(1, 2, 2, 1, 1), True)
    assert isinstance(expected[0], Outcome)
    assert expected[0].message == "logical page must be an integer, got bool"
    assert _write_logical(impl.make_impl_system(1, 2, 2, 1, 1), True) == expected


def test_slot_arrays_have_the_documented_dtypes() -> None:
    """The scheduler's slot arrays are the dtypes `kvsched.impl.slots` documents, so `to_spec()`
    gives ints (a float64 count would compare equal and still not be the spec's value).
    (Kills `slots.new_slot_arrays` creating a slot array with numpy's default dtype.)"""
    scheduler = impl.RequestScheduler(2, 3)
    dtypes = {name: array.dtype for name, array in get_slots(scheduler)._asdict().items()}
    assert dtypes == {
        "request_ids": np.uint64,
        "states": np.uint8,
        "token_counts": np.uint32,
        "prefix_tokens": np.uint32,
        "next_tokens": np.uint32,
        "token_ready": np.bool_,
        "tables": np.uint32,
    }
    slot = scheduler.to_spec().slots[0]
    fields = (slot.request_id, slot.token_count, slot.prefix_tokens, slot.next_token_id)
    assert all(type(value) is int for value in fields)


def test_plans_have_the_documented_dtypes() -> None:
    """A `WritePlan`'s arrays are the dtypes `kvsched.impl.writes` documents (a batched page-copy
    kernel takes them as they are), from either batched call.
    (Kills `writes.new_write_buffers` creating a buffer with numpy's default dtype.)"""
    system = impl.make_impl_system(2, 2, 8, 1, 1)
    _two_decoding(system)
    plans = [
        system.scheduler.prepare_decode_round(system.pool, 16),
        system.scheduler.ensure_writable_batch([1, 2], [1, 1], system.pool),
    ]
    for plan in plans:
        assert [array.dtype for array in (plan.slots, plan.logical_pages)] == [np.int64] * 2
        assert plan.kinds.dtype == np.uint8
        others = (plan.pages, plan.sources, plan.copy_sources, plan.copy_destinations)
        assert [array.dtype for array in others] == [np.uint32] * 4


def test_the_system_hands_out_round_scratch_and_the_scheduler_has_a_repr() -> None:
    """`ImplSystem.scratch` (the harness's hook) gives zeroed buffers of the round dtypes and the
    lengths asked; the scheduler's repr counts live requests. (Kills the mutants of
    `ImplSystem.scratch` and `RequestScheduler.__repr__`, which no other selected test ran.)"""
    system = impl.make_impl_system(3, 2, 4, 1, 1)
    items, tables, outputs = system.scratch(2, 5, 3)
    assert (items.dtype, tables.dtype, outputs.dtype) == (ITEM_DTYPE, np.dtype(np.uint32), OUTPUT_DTYPE)
    assert (items.shape, tables.shape, outputs.shape) == ((2,), (5,), (3,))
    system.scheduler.admit_with_prefix(4, None, system.store, system.pool)
    assert repr(system.scheduler) == "RequestScheduler(requests=3, logical_pages=2, live=1)"


def test_a_pool_below_2_to_the_31_pages_keeps_an_int32_stack() -> None:
    """The pool's storage is uint32 counts and an int32 free stack, as its docstring promises
    (int64 only above 2**31 pages), and `to_spec()` gives ints.
    (Kills `BlockPool.__init__` choosing no stack dtype, or int64 for every pool.)"""
    pool = impl.BlockPool(3)
    arrays = get_arrays(pool)
    assert [arrays.refs.dtype, arrays.free.dtype, arrays.top.dtype] == [
        np.dtype(t) for t in (np.uint32, np.int32, np.int64)
    ]
    assert all(type(page) is int for page in pool.to_spec().free)
