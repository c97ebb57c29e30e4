"""Deliberately broken variants of the spec: proof that the harness can fail.

Each variant is a `SpecSystem` with one component replaced by a subclass that reintroduces a
bug serving engines have shipped. `VARIANTS` maps a name to its factory; the tests run the
machine on each, with and without the spec beside it, and require a failure.
"""

from __future__ import annotations

from collections.abc import MutableSequence

from kvsched.spec import (
    UNANSWERED,
    BackendFailed,
    BlockPool,
    PoolError,
    PrefixIdentity,
    PrefixKvStore,
    RaggedBatchItem,
    RaggedBatchOutput,
    RaggedBatchReceipt,
    RaggedDecodeBackend,
    RequestScheduler,
    lifecycle,
)
from kvsched.spec import round as round_ops
from kvsched.spec.pool import PoolState
from kvsched.spec.slots import Admission, SchedulerState, Slot, is_live
from kvsched.testing.patching import swap
from kvsched.testing.system import SpecSystem, SystemConfig, SystemFactory, SystemUnderTest


class NoRollbackScheduler(RequestScheduler):
    """Admission whose prefix install keeps the references it took before a retain failed."""

    def admit_with_prefix(
        self, request_id: int, identity: PrefixIdentity | None, prefixes: PrefixKvStore, pool: BlockPool
    ) -> Admission:
        try:
            return super().admit_with_prefix(request_id, identity, prefixes, pool)
        except PoolError:
            page_set = prefixes.get(identity) if identity is not None else None
            for page in page_set.pages if page_set is not None else ():
                try:
                    pool.retain(page)
                except PoolError:
                    break
            raise


class MutateBeforeCheckScheduler(RequestScheduler):
    """A decode round that applies the outputs before checking they answer the items."""

    def execute_decode_round(
        self,
        backend: RaggedDecodeBackend,
        item_scratch: MutableSequence[RaggedBatchItem],
        block_table_scratch: MutableSequence[int],
        output_scratch: MutableSequence[RaggedBatchOutput],
    ) -> RaggedBatchReceipt:
        round_ops.require_round_buffers(item_scratch, block_table_scratch, output_scratch)
        bound = self._pool.bound  # lowered as the real round lowers (write targets checked)
        items, tables = round_ops.lower_round(self.state, None if bound is None else bound.state, self._page_size)
        if not items:
            return RaggedBatchReceipt()
        outputs = [UNANSWERED] * len(items)
        try:
            receipt = backend.execute_ragged(items, tables, outputs)
        except Exception as error:
            raise BackendFailed(f"backend raised {type(error).__name__}: {error}") from error
        valid = [output for output in outputs if 0 <= output.slot < self.requests]
        self.commit(round_ops.commit_round(self.state, valid))
        return round_ops.check_outputs(items, receipt, outputs)


class FifoPool(BlockPool):
    """A pool that reuses freed pages first-in-first-out: freed pages go to the stack's bottom."""

    def commit(self, state: PoolState) -> None:
        before = self.state
        common = 0
        for old, new in zip(before.free, state.free, strict=False):
            if old != new:
                break
            common += 1
        pushed = tuple(page for page in state.free[common:] if before.refs[page] > 0)
        kept = tuple(page for page in state.free if page not in pushed)
        super().commit(PoolState(state.refs, pushed + kept, state.max_references))

    def release(self, page: int) -> None:
        previous = self.state
        super().release(page)
        after = self.state
        super().commit(previous)
        self.commit(after)


class LeakOnFinishScheduler(RequestScheduler):
    """`finish` that forgets to release the request's first page."""

    def finish(self, request_id: int, pool: BlockPool) -> None:
        pool = self.check_pool(pool)
        table = self.page_table(request_id)
        for page in table[1:]:
            if page is not None:
                pool.release(page)
        slots = tuple(
            Slot((None,) * len(table)) if is_live(slot) and slot.request_id == request_id else slot
            for slot in self.state.slots
        )
        self.commit(SchedulerState(slots))


class UncheckedRoundScheduler(RequestScheduler):
    """A decode round that never checks its write targets (it writes into shared pages)."""

    execute_decode_round = swap(
        RequestScheduler.execute_decode_round,
        round_ops.lower_round,
        swap(round_ops.lower_round, round_ops.require_write_target, lambda *_: None),
    )


class SharedBuffersScheduler(RequestScheduler):
    """A decode round that takes one list as two of its buffers (the outputs overwrite the tables)."""

    execute_decode_round = swap(RequestScheduler.execute_decode_round, round_ops.require_round_buffers, lambda *_: None)


class AnyPoolScheduler(RequestScheduler):
    """`finish` that releases the request's pages in whatever pool it is handed."""

    def finish(self, request_id: int, pool: BlockPool) -> None:
        state, pool_state = lifecycle.finish(self.state, pool.state, request_id)
        pool.commit(pool_state)
        self.commit(state)


def _with(scheduler: type[RequestScheduler] | None = None, pool: type[BlockPool] | None = None) -> SystemFactory:
    def build(config: SystemConfig) -> SystemUnderTest:
        return SpecSystem(config, scheduler=scheduler or RequestScheduler, pool=pool or BlockPool)

    return build


VARIANTS: dict[str, SystemFactory] = {
    "install_shared_prefix without rollback": _with(scheduler=NoRollbackScheduler),
    "outputs applied before the identity check": _with(scheduler=MutateBeforeCheckScheduler),
    "pages reused first-in-first-out": _with(pool=FifoPool),
    "finish leaks one page": _with(scheduler=LeakOnFinishScheduler),
    "a round that writes shared pages": _with(scheduler=UncheckedRoundScheduler),
    "finish in another pool": _with(scheduler=AnyPoolScheduler),
    "a round on buffers that share memory": _with(scheduler=SharedBuffersScheduler),
}
