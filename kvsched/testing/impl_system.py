"""`kvsched.impl` as a system under test: its abstraction function and its array scratch.

The same adapter shape fits any page manager a user wants to check: build the three objects,
map their state to the spec's frozen values in `snapshot`, and hand out scratch buffers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvsched.abi import OUTPUT_DTYPE, empty_items, empty_outputs
from kvsched.impl.refinement import check_representation
from kvsched.impl.system import ImplSystem, make_impl_system
from kvsched.spec.table import Table
from kvsched.testing.system import Snapshot, SystemConfig, SystemUnderTest


class ImplAdapter:
    """An `ImplSystem` behind the harness boundary."""

    def __init__(self, system: ImplSystem) -> None:
        self.system = system
        self.pool = system.pool
        self.store = system.store
        self.scheduler = system.scheduler
        self.tables = system.tables
        self.new_table = system.new_table

    def snapshot(self) -> Snapshot:
        return self.pool.to_spec(), self.store.to_spec(), self.scheduler.to_spec()

    def table_states(self) -> tuple[Table, ...]:
        return tuple(table.to_spec() for table in self.tables)

    def representation(self) -> tuple[str, ...]:
        """impl's own representation invariants (`kvsched.impl.refinement`): the broken ones."""
        return check_representation(self.pool, self.store, self.scheduler)

    def scratch(self, items: int, tables: int, outputs: int) -> tuple[Any, Any, Any]:
        return empty_items(items), np.zeros(tables, dtype=np.uint32), empty_outputs(outputs)

    def overlapping_scratch(self, items: int, tables: int, outputs: int) -> tuple[Any, Any, Any]:
        """Round scratch whose block tables and outputs are views of one allocation."""
        raw = np.zeros(max(tables * 4, outputs * OUTPUT_DTYPE.itemsize), dtype=np.uint8)
        return (
            empty_items(items),
            raw[: tables * 4].view(np.uint32),
            raw[: outputs * OUTPUT_DTYPE.itemsize].view(OUTPUT_DTYPE),
        )


def impl_system(config: SystemConfig) -> SystemUnderTest:
    """A fresh impl system of the configured sizes."""
    system = make_impl_system(
        config.requests,
        config.logical_pages,
        config.physical_pages,
        config.store_entries,
        config.store_pages,
        config.max_references,
        page_size=config.page_size,
    )
    return ImplAdapter(system)
