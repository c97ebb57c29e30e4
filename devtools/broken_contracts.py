"""Deliberately broken targets for the gate: proof that every kind of check in it can fail.

Each target is a contract or a pair from the real modules, *unchanged* (same code, so the same
docstring conditions at the same source lines), rebound to a copy of one spec or impl function
with one bug (`kvsched.testing.patching.patch_source`). Nothing real is modified.
`python -m kvsched.contracts --broken` (`make contracts`) runs the gate on these, each search
bounded by iterations, and must report a counterexample for every one. `COUNTEREXAMPLES` pins
one for each, which tests/contracts/test_broken.py replays without CrossHair: the real contract
or pair accepts it, the broken one does not.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from devtools.mutants_corpus import NO_ROLLBACK, releases_before_allocating
from kvsched.contracts import (
    impl_kernels,
    pair_kernels,
    pair_systems,
    pair_tables,
    spec_pool,
    spec_prefix,
    spec_scheduler,
)
from kvsched.contracts.arrays import pure
from kvsched.impl.lowering import lower_decode, run_lowered
from kvsched.impl.page_kernels import ensure_rows, release_pages, retain_pages
from kvsched.impl.pool import BlockPool
from kvsched.impl.prefix import PrefixKvStore
from kvsched.impl.scheduler import RequestScheduler
from kvsched.impl.system import ImplSystem
from kvsched.impl.table import SequenceBlockTable, append_row_shared
from kvsched.impl.writes import run_steps
from kvsched.spec import lifecycle as scheduler_ops
from kvsched.spec import pool as pool_ops
from kvsched.spec import prefix as prefix_ops
from kvsched.testing.engine_variants import ENGINE_VARIANTS
from kvsched.testing.impl_system import ImplAdapter
from kvsched.testing.patching import patch_source, patch_statements, swap
from kvsched.testing.system import SystemConfig, SystemUnderTest


def rebind(function: Callable[..., Any], **names: object) -> types.FunctionType:
    """A copy of `function` (same code, docstring and annotations) seeing `names` as globals."""
    assert isinstance(function, types.FunctionType)
    copy = types.FunctionType(
        function.__code__, {**function.__globals__, **names}, function.__name__, function.__defaults__
    )
    copy.__annotations__ = dict(function.__annotations__)
    copy.__doc__ = function.__doc__
    copy.__kwdefaults__ = function.__kwdefaults__
    return copy


def module_with(module: types.ModuleType, **functions: Callable[..., Any]) -> types.SimpleNamespace:
    """A stand-in for `module` with some functions replaced."""
    return types.SimpleNamespace(**{**vars(module), **functions})


# -- spec transitions with one bug, under the spec's own contracts ------------------------------

_release_without_push = patch_source(
    pool_ops.release,
    (("free = state.free + (page,) if count == 1 else state.free", "free = state.free"),),
    "release forgets to push a freed page",
)
pool_release = rebind(spec_pool.pool_release, pool_ops=module_with(pool_ops, release=_release_without_push))

_writable_shares_at_two = patch_source(
    pool_ops.writable, (("if count == 1:", "if count <= 2:"),), "copy-on-write skipped at refcount 2"
)
pool_writable = rebind(spec_pool.pool_writable, pool_ops=module_with(pool_ops, writable=_writable_shares_at_two))

_reclaim_most_recent = patch_source(
    prefix_ops.reclaim, (("_, index = min(idle)", "_, index = max(idle)"),), "reclaim evicts the most recent"
)
prefix_reclaim = rebind(spec_prefix.prefix_reclaim, prefix_ops=module_with(prefix_ops, reclaim=_reclaim_most_recent))

_capacity_before_duplicates = patch_source(
    scheduler_ops._require_free_slot,
    (
        (
            "    if find_request(state, request_id) is not None:\n"
            "        raise refusals.duplicate_request(request_id)\n",
            "",
        ),
        (
            "    return index\n",
            "    if find_request(state, request_id) is not None:\n"
            "        raise refusals.duplicate_request(request_id)\n"
            "    return index\n",
        ),
    ),
    "duplicate check after the capacity check",
)
scheduler_admit = rebind(
    spec_scheduler.scheduler_admit,
    scheduler_ops=module_with(
        scheduler_ops, admit=swap(scheduler_ops.admit, scheduler_ops._require_free_slot, _capacity_before_duplicates)
    ),
)

# -- impl kernels with one bug, under the kernels' contracts and pairs --------------------------

_retain_without_rollback = patch_statements(retain_pages, NO_ROLLBACK, "no rollback")
kernel_retain_pages = rebind(impl_kernels.kernel_retain_pages, RETAIN_PAGES=pure(_retain_without_rollback))

_copy_keeps_source = patch_source(
    ensure_rows,
    (("refs[current] -= 1\n", "pass\n"),),
    "copy-on-write keeps the source's reference",
)
kernel_ensure_rows = rebind(impl_kernels.kernel_ensure_rows, ENSURE_ROWS=pure(_copy_keeps_source))
impl_ensure = rebind(pair_kernels.impl_ensure, ENSURE_ROWS=pure(_copy_keeps_source))
impl_retain = rebind(pair_kernels.impl_retain, RETAIN_PAGES=pure(_retain_without_rollback))

_undo_skips_first = patch_source(
    release_pages,
    (("for index in range(at - 1, -1, -1):", "for index in range(at - 1, 0, -1):"),),
    "a refused release undoes all but the first page",
)
impl_release = rebind(pair_kernels.impl_release, RELEASE_PAGES=pure(_undo_skips_first))

# -- impl objects with one bug each, in the system pairs ----------------------------------------


class ReleaseFirstPool(BlockPool):
    """`writable` that releases the shared source before allocating its copy: an exhausted
    pool then refuses the copy with the source's reference already gone."""

    _copy = releases_before_allocating


class RetainFreePool(BlockPool):
    """`retain` that revives a free page (a use after free): the page is counted but stays on
    the free stack."""

    retain = patch_source(BlockPool.retain, (("if count == 0:", "if count < 0:"),), "retain accepts a free page")


class StopsShortStore(PrefixKvStore):
    """`reclaim` that stops one page short of its target."""

    _reclaim = patch_source(
        PrefixKvStore._reclaim,
        (("while available() < pages:", "while available() < pages - 1:"),),
        "reclaim stops one page short",
    )


class FullBeforeUnknownScheduler(RequestScheduler):
    """`fork` that looks for the child's slot before it checks the parent: a full scheduler
    reports Full for an unknown parent."""

    fork = patch_source(
        RequestScheduler.fork,
        (
            ("    parent = self._require_request(parent_id)\n", ""),
            ("    self._share_row(", "    parent = self._require_request(parent_id)\n    self._share_row("),
        ),
        "fork checks capacity before the parent",
    )


class RepeatsAttachScheduler(RequestScheduler):
    """`attach_pages` without its repeated-page check: a cached page attached at two positions."""

    attach_pages = swap(
        RequestScheduler.attach_pages,
        append_row_shared,
        patch_source(append_row_shared, (("if repeats_in(pages, row, start):", "if False:"),), "attach repeats a page"),
    )


_launch_count_at_most_one = patch_source(
    run_lowered,
    (("if receipt.backend_launches != 1:", "if receipt.backend_launches > 1:"),),
    "a round that reports zero launches passes",
)


class ZeroLaunchScheduler(RequestScheduler):
    """`execute_decode_round` that accepts a backend reporting zero launches."""

    execute_decode_round = swap(RequestScheduler.execute_decode_round, run_lowered, _launch_count_at_most_one)


# (Not a check that lets a short buffer through: the kernels would write past its end.)
_items_short_misnamed = patch_source(
    lower_decode,
    (("raise refusals.items_too_small(", "raise refusals.outputs_too_small("),),
    "a short item buffer raises the output buffer's error",
)


class MisnamedShortItemsScheduler(RequestScheduler):
    """`execute_decode_round` that reports a short item buffer as a short output buffer."""

    execute_decode_round = swap(RequestScheduler.execute_decode_round, lower_decode, _items_short_misnamed)


_batch_keeps_earlier_steps = patch_source(
    run_steps,
    (("        undo_rows(slots.tables, buffers.slots, buffers.logical_pages, count, refs, top, *buffers[2:5])\n", ""),),
    "a batch refused at a later request keeps its earlier steps",
)


class HalfUndoneBatchScheduler(RequestScheduler):
    """`ensure_writable_batch` that, refused at an unknown or invalid request after some steps ran,
    raises without undoing them (their copies and allocations stay)."""

    ensure_writable_batch = swap(RequestScheduler.ensure_writable_batch, run_steps, _batch_keeps_earlier_steps)


def system_with(
    pool_class: type[BlockPool] = BlockPool,
    store_class: type[PrefixKvStore] = PrefixKvStore,
    scheduler_class: type[RequestScheduler] = RequestScheduler,
    table_class: type[SequenceBlockTable] = SequenceBlockTable,
) -> Callable[[SystemConfig], SystemUnderTest]:
    """A factory of impl systems built from these classes (standalone tables of `table_class`)."""

    def factory(config: SystemConfig) -> SystemUnderTest:
        pool = pool_class(config.physical_pages, max_references=config.max_references)
        store = store_class(config.store_entries, config.store_pages, pool=pool)
        scheduler = scheduler_class(
            config.requests, config.logical_pages, pool=pool, prefixes=store, page_size=config.page_size
        )
        adapter = ImplAdapter(ImplSystem(pool, store, scheduler))

        def new_table(logical_pages: int) -> SequenceBlockTable:
            table = table_class(logical_pages)
            adapter.tables.append(table)
            return table

        adapter.new_table = new_table
        return adapter

    return factory


class RepeatingTable(SequenceBlockTable):
    """`install_shared_prefix` without its repeated-page check: one page at two positions."""

    install_shared_prefix = patch_source(
        SequenceBlockTable.install_shared_prefix,
        (("if repeats_a_page(pages):", "if False:"),),
        "install accepts a repeated page",
    )


impl_install = rebind(pair_tables.impl_install, impl_system=system_with(table_class=RepeatingTable))
impl_batch = rebind(pair_tables.impl_batch, impl_system=system_with(scheduler_class=HalfUndoneBatchScheduler))
impl_pool = rebind(pair_systems.impl_pool, impl_system=system_with(RetainFreePool))
impl_writable = rebind(pair_systems.impl_writable, impl_system=system_with(ReleaseFirstPool))
impl_store = rebind(pair_systems.impl_store, impl_system=system_with(store_class=StopsShortStore))
impl_scheduler = rebind(
    pair_systems.impl_scheduler, impl_system=system_with(scheduler_class=FullBeforeUnknownScheduler)
)
impl_attach = rebind(pair_systems.impl_attach, impl_system=system_with(scheduler_class=RepeatsAttachScheduler))
impl_round = rebind(pair_systems.impl_round, impl_system=system_with(scheduler_class=ZeroLaunchScheduler))
impl_round_buffers = rebind(
    pair_systems.impl_round_buffers, impl_system=system_with(scheduler_class=MisnamedShortItemsScheduler)
)
# impl's engine whose step keeps its room's pages when the model fails
_ROUND_KEPT = next(variant for variant in ENGINE_VARIANTS if variant.name == "failed_round_kept")
impl_engine_step = rebind(pair_systems.impl_engine_step, Engine=_ROUND_KEPT.factory())

CHECK_TARGETS = (
    "pool_release",
    "pool_writable",
    "prefix_reclaim",
    "scheduler_admit",
    "kernel_retain_pages",
    "kernel_ensure_rows",
)
DIFF_TARGETS = (
    ("kvsched.contracts.pair_kernels.spec_retain", "impl_retain"),
    ("kvsched.contracts.pair_kernels.spec_release", "impl_release"),
    ("kvsched.contracts.pair_kernels.spec_ensure", "impl_ensure"),
    ("kvsched.contracts.pair_systems.spec_pool", "impl_pool"),
    ("kvsched.contracts.pair_systems.spec_writable", "impl_writable"),
    ("kvsched.contracts.pair_systems.spec_store", "impl_store"),
    ("kvsched.contracts.pair_systems.spec_scheduler", "impl_scheduler"),
    ("kvsched.contracts.pair_systems.spec_attach", "impl_attach"),
    ("kvsched.contracts.pair_systems.spec_round", "impl_round"),
    ("kvsched.contracts.pair_systems.spec_round_buffers", "impl_round_buffers"),
    ("kvsched.contracts.pair_tables.spec_install", "impl_install"),
    ("kvsched.contracts.pair_tables.spec_batch", "impl_batch"),
    ("kvsched.contracts.pair_systems.spec_engine_step", "impl_engine_step"),
)

# A counterexample CrossHair reported for each target: arguments of the contract function, or of
# both pairs of the pair.
COUNTEREXAMPLES: dict[str, tuple[object, ...]] = {
    "pool_release": (1, 2, 0, 5, 0),
    "pool_writable": (1, 1, 2, 5, 2),
    "prefix_reclaim": (0, 1, 1, 1, 6, 0, 0, 0, 0, 0, 1),
    "scheduler_admit": (1, 1, 2, 0, 0, 0, 0, 5, 0, 0),
    "kernel_retain_pages": (3, 0, 0, 0, 0, 0, 2, False),
    "kernel_ensure_rows": (0, 1, 0, 1, 0, 0, 0, 4, 1, 0, 1, 0),
    "impl_retain": (0, 1, 1, 1, 3, 0, 2),
    "impl_release": (2, 2, 0, 5, 1, 2, 3),
    "impl_ensure": (2, 0, 0, 0, 1, 2, 1, 0),
    "impl_pool": (0, 1, 0, 2, 1, 0),
    "impl_writable": (2, 1, 2, 2, 0),
    "impl_store": (2, 4, 1, 0, 1, 1, False, 1),
    "impl_scheduler": (0, 1, 0, 2, 3, 3, 0, 0),
    "impl_attach": (0, 2, 1, 1),
    "impl_round": (False, False, True, True, 0, 0, 4),
    "impl_round_buffers": (False, False, False, False, 0, 0, 1),
    "impl_install": (0, 0, 1, 5, 5, 0, 2),
    "impl_batch": (2, 0, 1, 0, 4, 0, 0, 0, False),
    "impl_engine_step": (1, 2, 0, 3, 2, 0, 2),
}

# Each broken target's search bound, in CrossHair iterations per condition (per diff pair, split
# between its two call orders): the smallest of 25, 50, 100 and 200 at which CrossHair found the
# counterexample, doubled. Iterations are counted, not timed, so these hold on any machine.
ITERATIONS: dict[str, int] = {
    "pool_release": 100,
    "pool_writable": 50,
    "prefix_reclaim": 50,
    "scheduler_admit": 100,
    "kernel_retain_pages": 50,
    "kernel_ensure_rows": 50,
    "impl_retain": 100,
    "impl_release": 50,
    "impl_ensure": 100,
    "impl_pool": 200,
    "impl_writable": 100,
    "impl_store": 50,
    "impl_scheduler": 50,
    "impl_attach": 100,
    "impl_round": 400,
    "impl_round_buffers": 50,
    "impl_install": 400,
    "impl_batch": 100,
    "impl_engine_step": 50,
}
