"""impl's engine checkpoint cannot miss a field: every attribute the engine holds is listed with
how a failed step leaves it as it was, and an engine that forgets one of them fails atomicity."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvsched import impl
from kvsched.impl import checkpoint
from kvsched.impl.engine_batch import StepPlan
from kvsched.impl.engine_queue import WaitingQueue
from kvsched.impl.engine_running import RunningSet
from kvsched.spec import EngineRequest, KvschedError
from kvsched.spec.engine_config import EngineConfig
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


HOSTED = replace(SMALL, pages=6, prefix_caching=True, host_pages=8, prefill_reserve_pages=2)


def hosted_engine(engine_type: type[impl.Engine]) -> tuple[impl.Engine, HarnessModel]:
    """An engine with a host tier whose next step completes a prefill and demotes a page: its
    copy's start, the step's last call, fails after the step has committed its tokens."""
    model = HarnessModel(HOSTED.page_size)
    engine = engine_type(HOSTED, model)
    engine.submit(EngineRequest(1, (1, 2, 3, 4, 5), 2))
    for _ in range(2):
        engine.step()
    engine.submit(EngineRequest(2, (11, 12, 13, 14, 15), 3))
    engine.step()
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


@pytest.mark.parametrize(
    ("forgotten", "hosted"),
    # A model call fails before anything is committed: only the plan's changes (admissions)
    # need putting back; the copies' start fails once the step has committed its tokens.
    [("admissions", False), ("slots", False), ("fields", True)],
)
def test_a_running_set_that_forgets_a_field_fails(forgotten: str, hosted: bool) -> None:
    class ForgetfulSet(RunningSet):
        __slots__ = ()
        STEP_STATE = tuple(name for name in RunningSet.STEP_STATE if name != forgotten)

    class Forgetful(impl.Engine):
        def __init__(self, config: EngineConfig, model: EngineModel) -> None:
            super().__init__(config, model)
            self.running.__class__ = ForgetfulSet

    assert not failed_step_keeps_the_state(Forgetful, hosted=hosted)


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


def test_a_step_that_can_admit_nobody_takes_no_checkpoint_and_a_failed_one_puts_its_room_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the queue empty, a step that decodes one request and prefills another's next chunk
    saves nothing; when its prefill call fails (its decode round has run), its room and the
    round's answers are taken back exactly, and the step run again gives what a twin that never
    failed gives."""
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
    assert not state.queue and {entry.decoding for entry in state.running} == {True, False}

    def no_checkpoint(*_: object) -> None:
        raise AssertionError("a step that can admit nobody took a checkpoint")

    monkeypatch.setattr(checkpoint, "save", no_checkpoint)
    model.prefill_fails = True
    with pytest.raises(KvschedError):
        engine.step()
    assert engine.to_spec() == state
    model.prefill_fails = False
    assert engine.step() == twin.step()
    assert engine.to_spec() == twin.to_spec()
