"""Cold construction: 100 000 operations in steady state allocate nothing that stays.

Measured with tracemalloc (which also sees numpy's buffers) after a warm-up; a deliberately
leaking backend shows the measurement detects growth of the same size order.
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

from kvsched import impl
from kvsched.impl.null_model import NullModel
from kvsched.spec import PrefixIdentity, PrefixPageSet, RequestState, RequestView
from kvsched.spec.batch import RaggedBatchReceipt

OPERATIONS = 100_000
WARM_UP = 10_000
SLACK = 64 * 1024  # bytes: allocator noise (free lists, arenas), under one byte per operation
IDENTITY = PrefixIdentity((3, 1, 4, 1))


class Hoarder(NullModel):
    """A backend that keeps a copy of every batch: a leak the measurement must see."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[Any] = []

    def execute_ragged(self, items: Any, block_tables: Any, out: Any) -> RaggedBatchReceipt:
        self.kept.append(items.copy())
        return super().execute_ragged(items, block_tables, out)


def _cycle(system: impl.ImplSystem, backend: NullModel, views: list[RequestView]) -> int:
    """Admit 8 requests (half on a prefix), prefill, decode 8 rounds, finish; the call count."""
    scheduler, pool, store = system.scheduler, system.pool, system.store
    calls = 0
    for request in range(8):
        admission = scheduler.admit_with_prefix(request, IDENTITY if request % 2 else None, store, pool)
        if not admission.prefix_hit:
            scheduler.ensure_writable(request, 0, pool)
            for _ in range(5):
                scheduler.record_token(request)
            scheduler.mark_prefill_complete(request)
            calls += 7
        scheduler.seed_decode_token(request, request)
        calls += 2
    scheduler.ensure_writable_batch(range(8), [1] * 8, pool)
    for _ in range(8):
        scheduler.prepare_decode_round(pool, 4)
        scheduler.execute_decode_round(backend)
    scheduler.runnable_into(views)
    pool.ref_count(0)
    for request in range(8):
        scheduler.finish(request, pool)
    return calls + 1 + 16 + 2 + 8


def _growth(backend: NullModel) -> tuple[int, int]:
    """(bytes still allocated after OPERATIONS steady-state calls, calls made)."""
    system = impl.make_impl_system(8, 8, 96, 1, 2)
    page = system.pool.allocate()
    system.store.publish(PrefixPageSet(IDENTITY, (page,), 3), system.pool)
    system.pool.release(page)
    views = [RequestView(0, 0, RequestState.EMPTY, 0, 0)] * 8
    calls = 0
    while calls < WARM_UP:
        calls += _cycle(system, backend, views)
    gc.collect()
    tracemalloc.start()
    try:
        before, calls = tracemalloc.get_traced_memory()[0], 0
        while calls < OPERATIONS:
            calls += _cycle(system, backend, views)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert system.check() == ()
    return after - before, calls


def test_steady_state_operations_grow_no_memory() -> None:
    grown, calls = _growth(NullModel())
    assert calls >= OPERATIONS
    assert grown < SLACK, f"{grown} bytes stayed allocated after {calls} operations"


def test_the_measurement_sees_a_leak() -> None:
    grown, _ = _growth(Hoarder())  # keeps one small array per round: a few hundred bytes each
    assert grown > 10 * SLACK
