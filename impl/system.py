"""A whole impl system in one bundle: what the stateful harness drives as its system under test.

`make_impl_system(...)` builds a pool, a prefix store and a request scheduler of the given sizes.
The bundle also makes standalone tables and scratch buffers, and abstracts everything into one
`SystemState`: tables made by `new_table` are owners the spec's `SystemState` has no field for,
so their pages are counted with the external holders.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from kvsched.abi import ItemArray, OutputArray, TableArray, empty_items, empty_outputs
from kvsched.impl.pool import BlockPool
from kvsched.impl.prefix import PrefixKvStore
from kvsched.impl.refinement import abstract_system, check_impl
from kvsched.impl.scheduler import RequestScheduler
from kvsched.impl.table import SequenceBlockTable
from kvsched.spec.batch import U32_MAX
from kvsched.spec.system import SystemState
from kvsched.spec.table import get_mapped_pages


@dataclass(slots=True)
class ImplSystem:
    """The pool, store and scheduler under test, and the standalone tables made through it."""

    pool: BlockPool
    store: PrefixKvStore
    scheduler: RequestScheduler
    tables: list[SequenceBlockTable] = field(default_factory=list)

    def new_table(self, logical_pages: int) -> SequenceBlockTable:
        """A standalone table whose pages `snapshot` counts as externally held."""
        table = SequenceBlockTable(logical_pages)
        self.tables.append(table)
        return table

    def new_item_scratch(self, length: int) -> ItemArray:
        """A zeroed item buffer of `length` records (`ITEM_DTYPE`)."""
        return empty_items(length)

    def new_table_scratch(self, length: int) -> TableArray:
        """A zeroed block-table buffer of `length` uint32 entries."""
        return np.zeros(length, dtype=np.uint32)

    def new_output_scratch(self, length: int) -> OutputArray:
        """A zeroed output buffer of `length` records (`OUTPUT_DTYPE`)."""
        return empty_outputs(length)

    def scratch(self, items: int, tables: int, outputs: int) -> tuple[ItemArray, TableArray, OutputArray]:
        """Round scratch buffers of these lengths (the harness's `SystemUnderTest.scratch`)."""
        return self.new_item_scratch(items), self.new_table_scratch(tables), self.new_output_scratch(outputs)

    def _external(self, external: Iterable[int]) -> list[int]:
        pages = list(external)
        for table in self.tables:
            pages.extend(get_mapped_pages(table.to_spec()))
        return pages

    def snapshot(self, external: Iterable[int] = ()) -> SystemState:
        """The whole system's spec state; `external` adds one page per outside reference."""
        return abstract_system(self.pool, self.store, self.scheduler, self._external(external))

    def check(self, external: Iterable[int] = ()) -> tuple[str, ...]:
        """The debug check (`kvsched.impl.refinement.check_impl`): violated invariant names."""
        return check_impl(self.pool, self.store, self.scheduler, self._external(external))


def make_impl_system(
    requests: int,
    logical_pages: int,
    physical_pages: int,
    store_entries: int,
    store_pages: int,
    max_references: int = U32_MAX,
    *,
    page_size: int | None = None,
) -> ImplSystem:
    """A fresh impl system, its scheduler and store bound to its pool; the arguments are the spec
    constructors' (same checks and errors)."""
    pool = BlockPool(physical_pages, max_references=max_references)
    store = PrefixKvStore(store_entries, store_pages, pool=pool)
    scheduler = RequestScheduler(requests, logical_pages, pool=pool, prefixes=store, page_size=page_size)
    return ImplSystem(pool, store, scheduler)
