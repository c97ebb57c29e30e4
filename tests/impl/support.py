"""Shared factories for the impl tests: a spec system shaped like `ImplSystem`, backends that
serve both batch forms (with injectable faults), and outcome comparison.

The lockstep tests drive a spec system and an impl system with the same calls and compare what
comes back: the value, or the exception's type and message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvsched import spec
from kvsched.abi import item_columns, write_outputs
from kvsched.spec.batch import RaggedBatchItem, RaggedBatchOutput, RaggedBatchReceipt
from kvsched.spec.errors import BackendRejected, KvschedError
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


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a call did: its value, or its exception's type, message and typed details."""

    value: object = None
    error: type[BaseException] | None = None
    message: str = ""
    details: tuple[tuple[str, int | None], ...] = ()


def outcome(call: Callable[[], object]) -> Outcome:
    """Run `call`, capturing a kvsched error as data (any other exception propagates)."""
    try:
        return Outcome(call())
    except KvschedError as error:
        return Outcome(None, type(error), str(error), tuple(error.details().items()))


FAULTS = (
    "ok",
    "raise_rejected",
    "raise_value_error",
    "wrong_batch_size",
    "two_launches",
    "corrupt_request",
    "corrupt_slot",
    "silent",
    "partial",
    "not_a_receipt",
)


def next_tokens(tokens: np.ndarray[Any, np.dtype[np.uint32]]) -> np.ndarray[Any, np.dtype[np.uint32]]:
    """The test model: a deterministic function of the input token."""
    return (tokens * np.uint32(31) + np.uint32(7)).astype(np.uint32)


class FaultBackend:
    """A backend for either batch form; `fault` picks how it breaks the round's contract."""

    def __init__(self, fault: str = "ok", position: int = 0) -> None:
        assert fault in FAULTS
        self.fault = fault
        self.position = position
        self.calls = 0
        self.seen: list[tuple[list[tuple[int, ...]], list[int]]] = []

    def execute_ragged(self, items: Any, block_tables: Any, out: Any) -> Any:
        self.calls += 1
        columns = item_columns(items)
        tables = np.asarray(block_tables, dtype=np.uint32) if not isinstance(block_tables, np.ndarray) else block_tables
        count = len(columns["request_id"])
        rows = list(zip(*(columns[name].tolist() for name in columns), strict=True))
        self.seen.append((rows, tables.tolist()))
        if self.fault == "raise_rejected":
            raise BackendRejected("bucket too small")
        if self.fault == "raise_value_error":
            raise ValueError("device lost")
        request_ids = columns["request_id"].astype(np.uint64)
        slots, item_tokens = columns["slot"].astype(np.uint32), columns["token_id"].astype(np.uint32)
        at = self.position % count
        if self.fault == "corrupt_request":
            request_ids[at] ^= np.uint64(1)
        if self.fault == "corrupt_slot":
            slots[at] += np.uint32(1)
        written = {"silent": 0, "partial": count // 2}.get(self.fault, count)
        write_outputs(out, request_ids[:written], slots[:written], next_tokens(item_tokens)[:written])
        if self.fault == "not_a_receipt":
            return None
        size = count + 1 if self.fault == "wrong_batch_size" else count
        launches = 2 if self.fault == "two_launches" else 1
        return RaggedBatchReceipt(size, launches, count * RaggedBatchOutput.SIZE)


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
