"""A failed step leaves impl's engine as it was, and cannot miss a field: every attribute the
engine holds is listed with how a failed step leaves it as it was, and an engine that forgets one
of them fails atomicity. Without a host tier a step takes no checkpoint: it takes back its room
and its admissions; with one, it restores a checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from kvsched import impl
from kvsched.impl import checkpoint
from kvsched.impl.engine_admission import Admission
from kvsched.impl.engine_batch import StepPlan
from kvsched.impl.engine_queue import WaitingQueue
from kvsched.impl.engine_running import RunningSet
from kvsched.impl.prefix import restore_recency
from kvsched.impl.scheduler import unseat_newcomers
from kvsched.spec import EngineRequest, KvschedError
from kvsched.spec.engine_config import EngineConfig
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.model import EngineModel
from kvsched.testing.engine_model import HarnessModel
from tests.engine.support import SMALL

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
    """An engine with a host tier whose next step completes a prefill, admits a newcomer and
    demotes a page: its copy's start, the step's last call, fails after the step has committed
    its tokens."""
    model = HarnessModel(HOSTED.page_size)
    engine = engine_type(HOSTED, model)
    engine.submit(EngineRequest(1, (1, 2, 3, 4, 5), 2))
    for _ in range(2):
        engine.step()
    engine.submit(EngineRequest(2, (11, 12, 13, 14, 15), 3))
    engine.step()
    engine.submit(EngineRequest(3, (21, 22), 2))
    model.copy_fails = True
    return engine, model


def failed_step_keeps_the_state(engine_type: type[impl.Engine], *, hosted: bool = False) -> bool:
    engine, model = hosted_engine(engine_type) if hosted else busy_engine(engine_type)
    before = engine.to_spec()
    model.prefill_fails = not hosted
    with pytest.raises(KvschedError):
        engine.step()
    try:
        return engine.to_spec() == before
    except AssertionError:  # the state is not even consistent (a slot indexed, its request gone)
        return False


def test_the_hosted_step_commits_before_its_copy_fails() -> None:
    engine, model = hosted_engine(impl.Engine)
    model.copy_fails = False
    issued = engine.host.issued
    output = engine.step()
    assert output.tokens and engine.host.issued > issued


def test_the_failing_step_decodes_and_admits_before_it_fails() -> None:
    engine, _ = busy_engine(impl.Engine)
    output = engine.step()
    assert 9 in output.tokens or 9 in {entry.request.request_id for entry in engine.to_spec().running}
    assert any(entry.decoding for entry in engine.to_spec().running)


def test_every_attribute_says_how_a_failed_step_leaves_it() -> None:
    engine, _ = busy_engine(impl.Engine)
    assert set(vars(engine)) == set(engine.NOT_RESTORED)
    part = set(RunningSet.STEP_STATE)  # the running set, a part the checkpoint saves
    assert not part & set(RunningSet.NOT_RESTORED) and len(RunningSet.STEP_STATE) == len(part)
    assert set(RunningSet.__slots__) == part | set(RunningSet.NOT_RESTORED)


@pytest.mark.parametrize("hosted", [False, True], ids=["prefill fails", "copy start fails"])
def test_a_failed_step_puts_everything_back(hosted: bool) -> None:
    assert failed_step_keeps_the_state(impl.Engine, hosted=hosted)


def test_an_engine_that_clears_its_cancellations_before_the_step_succeeds_fails() -> None:
    class Forgetful(impl.Engine):
        def _plan(self, done: dict[int, bool], admits: bool) -> StepPlan:
            plan = super()._plan(done, admits)
            self._cancelled = []  # reported before the step has succeeded
            return plan

    assert not failed_step_keeps_the_state(Forgetful)


@pytest.mark.parametrize("forgotten", ["admissions", "slots", "fields"])
def test_a_running_set_that_forgets_a_field_of_its_checkpoint_fails(forgotten: str) -> None:
    """With a host tier, the copies' start fails once the step has committed its tokens: the
    checkpoint (the running set's `save`) must put back every field the step changed."""

    class ForgetfulSet(RunningSet):
        __slots__ = ()
        STEP_STATE = tuple(name for name in RunningSet.STEP_STATE if name != forgotten)

    class Forgetful(impl.Engine):
        def __init__(self, config: EngineConfig, model: EngineModel) -> None:
            super().__init__(config, model)
            self.running.__class__ = ForgetfulSet

    assert not failed_step_keeps_the_state(Forgetful, hosted=True)


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


@pytest.mark.parametrize("admits", [False, True], ids=["admits nobody", "admits a prefix hit"])
def test_a_step_without_a_host_tier_takes_no_checkpoint_and_a_failed_one_puts_its_plan_back(
    admits: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a host tier a step saves nothing. With the queue empty, a step that decodes one
    request and prefills another's next chunk; or one that decodes and admits a newcomer naming
    a published prefix and hitting the cache after it: when its prefill call fails (its decode
    round has run), its room, the round's answers and its admissions are taken back exactly, and
    the step run again gives what a twin that never failed gives."""
    if admits:
        engines = twins_with_a_newcomer()
    else:
        engines = []
        for _ in range(2):
            model = HarnessModel(CONFIG.page_size)
            engine = impl.Engine(CONFIG, model)
            engine.submit(EngineRequest(1, (1, 2, 3), 6))
            engine.submit(EngineRequest(2, tuple(range(10, 20)), 2))  # ten tokens: chunks of four
            engine.step()
            engine.step()
            engines.append((engine, model))
    (engine, model), (twin, _) = engines
    state = engine.to_spec()
    assert bool(state.queue) == admits and any(entry.decoding for entry in state.running)

    def no_checkpoint(*_: object) -> None:
        raise AssertionError("a step without a host tier took a checkpoint")

    monkeypatch.setattr(checkpoint, "save", no_checkpoint)
    model.prefill_fails = True
    with pytest.raises(KvschedError):
        engine.step()
    assert engine.to_spec() == state
    model.prefill_fails = False
    output = engine.step()
    assert output == twin.step()
    assert engine.to_spec() == twin.to_spec()
    if admits:
        assert 2 in output.tokens or 2 in {entry.request.request_id for entry in engine.to_spec().running}
        assert engine.to_spec().system.store.clock > state.system.store.clock  # the prefix was attached
