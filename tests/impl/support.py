"""Shared factories for the impl tests: a spec system shaped like `ImplSystem` (so a test can
run the same calls on both flavors), and scratch records read back as spec values."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvsched import spec
from kvsched.spec.batch import RaggedBatchItem, RaggedBatchOutput
from kvsched.spec.system import SystemState
from kvsched.spec.table import get_mapped_pages


@dataclass(slots=True)
class SpecSystem:
    """The spec's objects, bundled and abstracted the way `ImplSystem` is."""

    pool: spec.BlockPool
    store: spec.PrefixKvStore
    scheduler: spec.RequestScheduler
    tables: list[spec.SequenceBlockTable] = field(default_factory=list)

    def new_table(self, logical_pages: int) -> spec.SequenceBlockTable:
        table = spec.SequenceBlockTable(logical_pages)
        self.tables.append(table)
        return table

    def new_item_scratch(self, length: int) -> list[RaggedBatchItem]:
        return [RaggedBatchItem()] * length

    def new_table_scratch(self, length: int) -> list[int]:
        return [0] * length

    def new_output_scratch(self, length: int) -> list[RaggedBatchOutput]:
        return [RaggedBatchOutput()] * length

    def snapshot(self, external: Iterable[int] = ()) -> SystemState:
        pages = list(external)
        for table in self.tables:
            pages.extend(get_mapped_pages(table.state))
        return SystemState(self.pool.state, self.store.state, self.scheduler.state, tuple(sorted(pages)))


def make_spec_system(
    requests: int,
    logical_pages: int,
    physical_pages: int,
    store_entries: int,
    store_pages: int,
    max_references: int = spec.batch.U32_MAX,
    *,
    page_size: int | None = None,
) -> SpecSystem:
    """The spec twin of `make_impl_system` (bound together the same way)."""
    pool = spec.BlockPool(physical_pages, max_references=max_references)
    store = spec.PrefixKvStore(store_entries, store_pages, pool=pool)
    scheduler = spec.RequestScheduler(requests, logical_pages, pool=pool, prefixes=store, page_size=page_size)
    return SpecSystem(pool, store, scheduler)


def records(values: Any, kind: type[RaggedBatchItem] | type[RaggedBatchOutput]) -> list[Any]:
    """A scratch buffer's records as spec values, from either form."""
    if isinstance(values, np.ndarray):
        names = values.dtype.names or ()
        return [kind(*(int(row[name]) for name in names)) for row in values]
    return list(values)


@dataclass(frozen=True, slots=True)
class Flavor:
    """One implementation of the API (the spec's or impl's) and its scratch-buffer form."""

    name: str
    module: Any
    system: Callable[..., Any]

    def scratch(self, items: int, tables: int, outputs: int) -> tuple[Any, Any, Any]:
        """Round scratch buffers in this flavor's form."""
        system = self.system(1, 1, 0, 0, 1)
        return system.new_item_scratch(items), system.new_table_scratch(tables), system.new_output_scratch(outputs)


def flavors() -> list[Flavor]:
    """The spec and impl, for tests that pin the same behaviour on both."""
    from kvsched import impl

    return [Flavor("spec", spec, make_spec_system), Flavor("impl", impl, impl.make_impl_system)]
