"""The system under test: one pool, one prefix store and one request scheduler, built together.

The harness drives any implementation through this narrow boundary. An adapter supplies the
three objects (with the spec's public API), scratch buffers in the form its scheduler takes,
and `snapshot()`: its abstraction function to the spec's frozen states, so two implementations
are compared state for state. `spec_system` is the reference; `kvsched.impl` and a user's own
page manager plug in the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kvsched.spec import BlockPool, PrefixKvStore, RequestScheduler
from kvsched.spec.pool import PoolState
from kvsched.spec.prefix import StoreState
from kvsched.spec.slots import SchedulerState
from kvsched.spec.step import SpecObjects


@dataclass(frozen=True, slots=True)
class SystemConfig:
    """The sizes of one system. Small on purpose: bugs live at the boundaries."""

    requests: int = 3
    logical_pages: int = 3
    physical_pages: int = 6
    store_entries: int = 2
    store_pages: int = 2
    max_references: int = 5
    page_size: int = 2


Snapshot = tuple[PoolState, StoreState, SchedulerState]


class SystemUnderTest(Protocol):
    """What the harness needs of an implementation."""

    pool: Any
    store: Any
    scheduler: Any

    def snapshot(self) -> Snapshot:
        """The abstraction function: the whole state as the spec's frozen values."""
        ...

    def scratch(self, items: int, tables: int, outputs: int) -> tuple[Any, Any, Any]:
        """Decode-round scratch buffers of these lengths, in the form the scheduler takes.

        An adapter may also offer `overlapping_scratch` (same signature): buffers that share
        memory, which the round must refuse; the machine then drives that refusal too. An
        adapter with standalone tables (a list `tables`, `new_table(logical_pages)` and
        `table_states()`, the tables as the spec's values) gets the table events too."""
        ...


SystemFactory = Callable[[SystemConfig], SystemUnderTest]


class SpecSystem(SpecObjects):
    """The reference implementation: `kvsched.spec` itself."""

    def __init__(
        self,
        config: SystemConfig,
        *,
        pool: type[BlockPool] = BlockPool,
        store: type[PrefixKvStore] = PrefixKvStore,
        scheduler: type[RequestScheduler] = RequestScheduler,
    ) -> None:
        """Build the three of these classes (subclasses for broken variants), bound together."""
        built = pool(config.physical_pages, max_references=config.max_references)
        prefixes = store(config.store_entries, config.store_pages, pool=built)
        super().__init__(
            built,
            prefixes,
            scheduler(config.requests, config.logical_pages, pool=built, prefixes=prefixes, page_size=config.page_size),
        )


def spec_system(config: SystemConfig) -> SystemUnderTest:
    """A fresh reference system."""
    return SpecSystem(config)
