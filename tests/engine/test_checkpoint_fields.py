"""impl's engine checkpoint cannot miss a field: every attribute the engine holds is either put
back by a failed step or listed with the reason it needs not be, and an engine that forgets one
of the restored fields fails atomicity."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvsched import impl
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


def failed_step_keeps_the_state(engine_type: type[impl.Engine]) -> bool:
    engine, model = busy_engine(engine_type)
    before = engine.to_spec()
    model.prefill_fails = True
    with pytest.raises(KvschedError):
        engine.step()
    try:
        return engine.to_spec() == before
    except AssertionError:  # the state is not even consistent (a slot indexed, its request gone)
        return False


def test_the_failing_step_decodes_and_admits_before_it_fails() -> None:
    engine, _ = busy_engine(impl.Engine)
    output = engine.step()
    assert 9 in output.tokens or 9 in {entry.request.request_id for entry in engine.to_spec().running}
    assert any(entry.decoding for entry in engine.to_spec().running)


def test_every_attribute_is_restored_or_says_why_not() -> None:
    engine, _ = busy_engine(impl.Engine)
    restored = set(engine.STEP_STATE)
    assert not restored & set(engine.NOT_RESTORED)
    assert len(engine.STEP_STATE) == len(restored)
    assert set(vars(engine)) == restored | set(engine.NOT_RESTORED)
    part = set(RunningSet.STEP_STATE)  # the running set, a part the checkpoint saves
    assert not part & set(RunningSet.NOT_RESTORED) and len(RunningSet.STEP_STATE) == len(part)
    assert set(RunningSet.__slots__) == part | set(RunningSet.NOT_RESTORED)


def test_a_failed_step_puts_everything_back() -> None:
    assert failed_step_keeps_the_state(impl.Engine)


def test_an_engine_that_forgets_a_field_fails() -> None:
    class Forgetful(impl.Engine):
        STEP_STATE = tuple(name for name in impl.Engine.STEP_STATE if name != "_cancelled")

    assert not failed_step_keeps_the_state(Forgetful)


@pytest.mark.parametrize("forgotten", ["admissions", "slots", "fields"])
def test_a_running_set_that_forgets_a_field_fails(forgotten: str) -> None:
    class ForgetfulSet(RunningSet):
        __slots__ = ()
        STEP_STATE = tuple(name for name in RunningSet.STEP_STATE if name != forgotten)

    class Forgetful(impl.Engine):
        def __init__(self, config: EngineConfig, model: EngineModel) -> None:
            super().__init__(config, model)
            self.running.__class__ = ForgetfulSet

    assert not failed_step_keeps_the_state(Forgetful)


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
