"""A failed step leaves impl's engine as it was, with no checkpoint, and cannot miss a field:
every attribute the engine and its running set hold is listed with how a failed step leaves it as
it was, a step takes back its room and admissions exactly, and an engine that forgets one part of
that fails atomicity."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from kvsched import impl
from kvsched.impl.engine_admission import Admission
from kvsched.impl.engine_batch import StepPlan
from kvsched.impl.engine_queue import WaitingQueue
from kvsched.impl.engine_running import RunningSet
from kvsched.impl.prefix import restore_recency
from kvsched.impl.scheduler import unseat_newcomers
from kvsched.spec import EngineRequest, KvschedError
from kvsched.spec.engine_config import EngineConfig
from kvsched.spec.host_tier import DEMOTE, PROMOTE
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.model import EngineModel
from kvsched.testing.engine_model import HarnessModel
from tests.engine.support import SMALL
from tests.engine.test_host_tier import FIRST, OTHER, run
from tests.engine.test_host_tier import HOSTED as HOSTED_TIER

CONFIG = replace(SMALL, prefix_caching=True)


def busy_engine(engine_type: type[impl.Engine]) -> tuple[impl.Engine, HarnessModel]:
    """An engine with requests running and queued and a cancellation to report, over the
    harness's model (whose prefill raises when armed: a failing step has then run its decode
    round and admitted before it fails)."""
    model = HarnessModel(CONFIG.page_size)
    engine = engine_type(CONFIG, model)
    for request_id in range(1, 4):
        engine.submit(EngineRequest(request_id, (request_id, 2, 3), 5))
    engine.step()
    engine.submit(EngineRequest(9, (9, 8, 7, 6, 5), 3, priority=1))
    engine.cancel(3)
    return engine, model


HOSTED = replace(SMALL, pages=8, prefix_caching=True, host_pages=8, prefill_reserve_pages=2)


def hosted_engine(engine_type: type[impl.Engine]) -> tuple[impl.Engine, HarnessModel]:
    """An engine with a host tier whose next step decodes, admits a newcomer and demotes a
    page (its prefill call fails, when armed, after the decode round ran)."""
    model = HarnessModel(HOSTED.page_size)
    engine = engine_type(HOSTED, model)
    engine.submit(EngineRequest(1, (1, 2, 3, 4, 5), 2))
    for _ in range(2):
        engine.step()
    engine.submit(EngineRequest(2, (11, 12, 13, 14, 15), 3))
    engine.step()
    engine.submit(EngineRequest(3, (21, 22), 2))
    return engine, model


def failed_step_keeps_the_state(engine_type: type[impl.Engine], *, hosted: bool = False) -> bool:
    engine, model = hosted_engine(engine_type) if hosted else busy_engine(engine_type)
    before = engine.to_spec()
    model.prefill_fails = True
    with pytest.raises(KvschedError):
        engine.step()
    try:
        return engine.to_spec() == before
    except AssertionError:  # the state is not even consistent (a slot indexed, its request gone)
        return False


def test_the_hosted_step_decodes_admits_and_demotes() -> None:
    engine, _ = hosted_engine(impl.Engine)
    issued = engine.host.issued
    output = engine.step()
    assert output.tokens and engine.host.issued > issued and 3 in engine.running.slots


def test_the_failing_step_decodes_and_admits_before_it_fails() -> None:
    engine, _ = busy_engine(impl.Engine)
    output = engine.step()
    assert 9 in output.tokens or 9 in {entry.request.request_id for entry in engine.to_spec().running}
    assert any(entry.decoding for entry in engine.to_spec().running)


def test_every_attribute_says_how_a_failed_step_leaves_it() -> None:
    engine, _ = busy_engine(impl.Engine)
    assert set(vars(engine)) == set(engine.ON_FAILURE)
    assert set(RunningSet.__slots__) == set(RunningSet.ON_FAILURE)


@pytest.mark.parametrize("hosted", [False, True], ids=["no host tier", "host tier"])
def test_a_failed_step_puts_everything_back(hosted: bool) -> None:
    assert failed_step_keeps_the_state(impl.Engine, hosted=hosted)


def test_an_engine_that_clears_its_cancellations_before_the_step_succeeds_fails() -> None:
    class Forgetful(impl.Engine):
        def _plan(self, admits: bool) -> StepPlan:
            plan = super()._plan(admits)
            self._cancelled = []  # reported before the step has succeeded
            return plan

    assert not failed_step_keeps_the_state(Forgetful)


def unseat_kept(admission: Admission) -> None:
    """The newcomers keep their slots and pages; the rest is taken back."""
    seated = admission.seated
    assert seated is not None
    restore_recency(admission.store, seated.recency)
    for slot in reversed(seated.slots):
        admission.running.leave(slot)
    admission.running.admissions -= len(seated.slots)
    admission.seated = None


def recency_kept(admission: Admission) -> None:
    """The store's recency keeps the named prefix's attach."""
    seated = admission.seated
    assert seated is not None
    recency = admission.store._clock, admission.store._last_used.copy()
    Admission.undo(admission)
    admission.store._clock, admission.store._last_used[:] = recency


def rows_kept(admission: Admission) -> None:
    """The newcomers' rows stay in the running set."""
    seated = admission.seated
    assert seated is not None
    unseat_newcomers(admission.scheduler, seated.slots, seated.plan, admission.pool)
    restore_recency(admission.store, seated.recency)
    admission.seated = None


NAMED = replace(CONFIG, pages=16, prefix_entries=2)


def twins_with_a_newcomer() -> list[tuple[impl.Engine, HarnessModel]]:
    """Two alike engines whose next step decodes one request and admits a newcomer that names a
    published prefix and hits the cache after it."""
    engines = []
    for _ in range(2):
        model = HarnessModel(NAMED.page_size)
        engine = impl.Engine(NAMED, model)
        engine.submit(EngineRequest(1, (1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 6))
        for _ in range(4):
            engine.step()
        engine.publish(1, 4, PrefixIdentity((1, 2, 3, 4)))
        engine.submit(EngineRequest(2, (1, 2, 3, 4, 5, 6, 7), 2, prefix=PrefixIdentity((1, 2, 3, 4))))
        engines.append((engine, model))
    return engines


@pytest.mark.parametrize("undo", [unseat_kept, recency_kept, rows_kept], ids=lambda undo: undo.__name__)
def test_an_admission_undo_that_forgets_a_part_fails(undo: Callable[[Admission], None]) -> None:
    class Forgetful(Admission):
        __slots__ = ()

        def undo(self) -> None:
            if self.seated is None:
                return
            undo(self)

    (engine, model), _ = twins_with_a_newcomer()
    engine.admission.__class__ = Forgetful
    before = engine.to_spec()
    model.prefill_fails = True
    with pytest.raises(KvschedError):
        engine.step()
    try:
        after = engine.to_spec()
    except AssertionError:  # not even consistent (a slot indexed, its request gone)
        return
    assert after != before


def test_an_engine_that_forgets_the_queue_fails() -> None:
    class UnmarkedQueue(WaitingQueue):
        __slots__ = ()

        def _changing(self) -> None:
            """The queue never copies itself before a step changes it."""

    class Forgetful(impl.Engine):
        def __init__(self, config: EngineConfig, model: EngineModel) -> None:
            super().__init__(config, model)
            self.queue.__class__ = UnmarkedQueue

    assert not failed_step_keeps_the_state(Forgetful)


PROMOTING = replace(HOSTED_TIER, pages=6, prefill_reserve_pages=1, admission="first_chunk")


def twins_promoting() -> list[tuple[impl.Engine, HarnessModel]]:
    """Two alike engines with a host tier whose next step admits a newcomer that promotes its
    pages from the host tier and one that prefills, and demotes a page."""
    engines = []
    for _ in range(2):
        model = HarnessModel(PROMOTING.page_size)
        engine = impl.Engine(PROMOTING, model)
        run(engine, EngineRequest(1, FIRST, 1))
        run(engine, EngineRequest(2, OTHER, 1))
        engine.submit(EngineRequest(3, (*FIRST, 11), 2))
        engine.submit(EngineRequest(6, (5,), 2))
        engine.step()
        engine.step()
        engines.append((engine, model))
    return engines


def twins_prefilling() -> list[tuple[impl.Engine, HarnessModel]]:
    """Two alike engines, queue empty, whose next step decodes one request and prefills
    another's next chunk."""
    engines = []
    for _ in range(2):
        model = HarnessModel(CONFIG.page_size)
        engine = impl.Engine(CONFIG, model)
        engine.submit(EngineRequest(1, (1, 2, 3), 6))
        engine.submit(EngineRequest(2, tuple(range(10, 20)), 2))  # ten tokens: chunks of four
        engine.step()
        engine.step()
        engines.append((engine, model))
    return engines


@pytest.mark.parametrize(
    "twins", [twins_prefilling, twins_with_a_newcomer, twins_promoting], ids=lambda twins: twins.__name__
)
def test_a_failed_step_puts_its_plan_back_and_runs_again_as_its_twin(
    twins: Callable[[], list[tuple[impl.Engine, HarnessModel]]],
) -> None:
    """A step that decodes and prefills with the queue empty; one that decodes and admits a
    newcomer naming a published prefix and hitting the cache after it; one with a host tier that
    admits a newcomer promoting from the host tier beside one that prefills: when its prefill
    call fails (after its decode round ran, if it has one), its room, the round's answers and its
    admissions are taken back exactly, no copy was issued, and the step run again gives what a
    twin that never failed gives."""
    (engine, model), (twin, _) = twins()
    state = engine.to_spec()
    model.prefill_fails = True
    with pytest.raises(KvschedError):
        engine.step()
    assert engine.to_spec() == state
    model.prefill_fails = False
    issued = engine.host.issued
    output = engine.step()
    assert output == twin.step()
    assert engine.to_spec() == twin.to_spec()
    if twins is twins_with_a_newcomer:
        assert engine.to_spec().system.store.clock > state.system.store.clock  # the prefix was attached
    if twins is twins_promoting:
        kinds = {copy.kind for copy in engine.to_spec().host.copies if copy.transfer_id >= issued}
        assert kinds == {PROMOTE, DEMOTE} and 6 in output.tokens  # the step promoted, demoted and prefilled
