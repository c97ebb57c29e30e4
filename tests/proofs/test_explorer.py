"""The exhaustive explorer: every small state checked, broken variants caught with shortest traces."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable

import pytest

from kvsched.proofs.canon import Canonicalizer
from kvsched.proofs.explorer import Explorer, explore
from kvsched.proofs.operations import Bounds, identity
from kvsched.proofs.subject import IMPL, SPEC, Subject, variant
from kvsched.proofs.trace import reproduce
from kvsched.spec import BlockPool, CopyOnWrite, Existing, PrefixIdentity, PrefixKvStore, RequestScheduler
from kvsched.spec import events as ev
from kvsched.spec.invariants import check_invariants
from kvsched.spec.system import SystemState
from kvsched.testing.checks import FailureKind
from kvsched.testing.system import SpecSystem, SystemConfig, SystemUnderTest
from kvsched.testing.variants import VARIANTS

TINY = Bounds(requests=1, pages=2, logical_pages=1, entries=1, entry_pages=1)
SMALL = Bounds(requests=2, pages=3, logical_pages=2, entries=1, entry_pages=2, max_references=2, max_external=1)
LIMIT = 20_000  # a variant not caught by then fails the test instead of exploring everything


@pytest.mark.proof
def test_every_state_of_a_small_system_keeps_every_invariant() -> None:
    result = explore(Bounds(requests=2, pages=2, logical_pages=1, entries=1, entry_pages=1, max_external=1))
    assert result.violation is None
    assert result.complete
    assert result.states > 4_000  # classes of states under id, identity and page renaming
    assert result.transitions > 50 * result.states
    assert result.checks >= result.states * len(result.invariants)


def test_the_spec_agrees_with_itself_in_lockstep() -> None:
    result = explore(TINY, SPEC, reference=SPEC)
    assert result.violation is None and result.complete


def test_impl_agrees_with_the_spec_in_lockstep() -> None:
    # impl cannot load a spec state: the explorer replays each state's path and copies it
    result = explore(TINY, IMPL, reference=SPEC)
    assert result.violation is None, result.violation and result.violation.detail
    assert result.complete and result.states == explore(TINY).states


def _unloadable(factory: Callable[[SystemConfig], SystemUnderTest]) -> Subject:
    class Opaque:
        def __init__(self, config: SystemConfig) -> None:
            inner = factory(config)
            self.pool, self.store, self.scheduler = inner.pool, inner.store, inner.scheduler
            self.snapshot, self.scratch = inner.snapshot, inner.scratch
            self.overlapping_scratch = inner.overlapping_scratch  # type: ignore[attr-defined]
            self.scheduler = _Wrapped(inner.scheduler)

    return Subject("opaque spec", Opaque, "", "")


class _Wrapped:
    """A spec scheduler that is not a `RequestScheduler`, so the explorer has to replay to reach a
    state (the pool and store stay what the scheduler is bound to)."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        if name == "_inner":  # not yet set (a copy under construction)
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_replaying_reaches_the_same_states_as_loading() -> None:
    replayed = explore(TINY, _unloadable(SpecSystem))
    assert replayed.violation is None
    assert (replayed.states, replayed.transitions) == (explore(TINY).states, explore(TINY).transitions)


def _run_program(program: str, subject: Subject | None = None) -> str:
    output = io.StringIO()
    namespace = {} if subject is None else {"factory": subject.factory}
    with contextlib.redirect_stdout(output):
        exec(compile(program, "<counterexample>", "exec"), namespace)
    return output.getvalue()


def test_a_counterexample_program_runs_and_shows_the_violation() -> None:
    explorer = Explorer(SMALL, variant("finish leaks one page"))
    violation = explorer.run(max_states=LIMIT).violation
    assert violation is not None
    program = reproduce(explorer, violation)
    assert "    Finish(request_id=0),\n" in program
    assert "invariants violated: ('inv_refcount_equals_owners',)" in _run_program(program)


class _StickyStore(PrefixKvStore):
    """remove reports success but keeps the entry: every invariant holds, pages never come back."""

    def remove(self, identity: PrefixIdentity, pool: BlockPool) -> bool:
        return self.get(identity) is not None


def _with_store(store: type[PrefixKvStore]) -> Subject:
    def build(config: SystemConfig) -> SystemUnderTest:
        return SpecSystem(config, store=store)

    return Subject("sticky store", build, "", "")


def test_a_leak_that_keeps_every_invariant_is_caught_by_liveness() -> None:
    subject = _with_store(_StickyStore)
    explorer = Explorer(SMALL, subject)
    result = explorer.run(max_states=LIMIT)
    assert result.violation is not None and result.violation.kind is FailureKind.LIVENESS
    assert [type(op) for op in result.violation.path] == [ev.Allocate, ev.Publish]
    # canonically the held page is the last one (2), the fresh system allocated page 0
    assert result.violation.path[1] == ev.Publish(identity(0), (2,), 1)
    program = reproduce(explorer, result.violation)
    assert "Publish(identity=PrefixIdentity(words=(1, 0, 0, 0)), pages=(0,), tokens=1)" in program
    assert "free pages: 2 of 3" in _run_program(program, subject)


class _NoCopyScheduler(RequestScheduler):
    """ensure_writable hands out a shared page for writing (no copy-on-write)."""

    def ensure_writable(self, request_id: int, logical_page: int, pool: BlockPool) -> CopyOnWrite:
        table = self.page_table(request_id)
        page = table[logical_page] if 0 <= logical_page < len(table) else None
        if page is not None and (pool.ref_count(page) or 0) > 1:
            return Existing(page)
        return super().ensure_writable(request_id, logical_page, pool)


def test_a_shared_write_is_caught() -> None:
    def build(config: SystemConfig) -> SystemUnderTest:
        return SpecSystem(config, scheduler=_NoCopyScheduler)

    subject = Subject("no copy", build, "", "")
    explorer = Explorer(SMALL, subject)
    violation = explorer.run(max_states=LIMIT).violation
    assert violation is not None and violation.kind is FailureKind.EXCLUSIVE
    assert [type(op) for op in violation.path] == [ev.Admit, ev.EnsureWritable, ev.Fork]
    assert "page reference counts: (2," in _run_program(reproduce(explorer, violation), subject)


def test_the_depth_bound_stops_the_search() -> None:
    result = explore(Bounds(requests=3, pages=5, logical_pages=3, entries=2, entry_pages=2, max_depth=2))
    assert result.violation is None and result.complete
    assert result.depth == 2


def test_canonical_states_keep_the_invariants_and_merge_renamings() -> None:
    explorer = Explorer(SMALL)
    explorer.run(max_states=3_000)
    canon = Canonicalizer(SMALL)
    for state in explorer.states[::50]:
        renamed = _rename_ids(state, {0: 2, 1: 0, 2: 1})
        assert canon.canonical(renamed)[0] == canon.canonical(state)[0] == state
        assert check_invariants(renamed) == check_invariants(state) == ()


def _rename_ids(state: SystemState, ids: dict[int, int]) -> SystemState:
    from dataclasses import replace

    from kvsched.spec.slots import SchedulerState, is_live

    slots = tuple(
        replace(slot, request_id=ids[slot.request_id]) if is_live(slot) else slot for slot in state.scheduler.slots
    )
    return replace(state, scheduler=SchedulerState(slots))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_of_the_harness_is_caught_in_lockstep(name: str) -> None:
    explorer = Explorer(SMALL, variant(name), SPEC)
    violation = explorer.run(max_states=LIMIT).violation
    assert violation is not None, f"{name} was not caught"
    reproduce(explorer, violation)  # raises unless the replay shows it again
