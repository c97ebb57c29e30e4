"""The event alphabet: every event prints as the Python that builds it, `step` is the spec's
transition on a state value, and it agrees with `apply` on the spec's objects."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest

from kvsched.spec import PrefixIdentity
from kvsched.spec import events as ev
from kvsched.spec.errors import DoubleRelease, KvschedError, UnknownRequest
from kvsched.spec.pool import Allocated, Copy
from kvsched.spec.step import SpecObjects, apply, holds_after, step
from kvsched.spec.system import SystemState
from kvsched.testing.backends import HarnessBackend
from kvsched.testing.system import SystemConfig, spec_system

CONFIG = SystemConfig()


def example(cls: type[Any]) -> Any:
    """An instance of event class `cls` with every field set (0, a tuple, an identity, a fault)."""
    values: dict[str, Any] = {}
    for field in fields(cls):
        kind = str(field.type)
        if "tuple" in kind:
            values[field.name] = (0, 1)
        elif field.name in ("prefix", "identity"):
            values[field.name] = PrefixIdentity((1, 0, 0, 0))
        elif field.name == "fault":
            values[field.name] = ev.Fault.CORRUPT_IDENTITY
        elif field.name in ("short", "call"):
            values[field.name] = "items" if field.name == "short" else "finish"
        else:
            values[field.name] = 0
    return cls(**values)


@pytest.mark.parametrize("cls", ev.EVENTS, ids=lambda cls: cls.__name__)
def test_every_event_prints_as_the_python_that_builds_it(cls: type[Any]) -> None:
    event = example(cls)
    namespace: dict[str, Any] = {"PrefixIdentity": PrefixIdentity}
    exec("from kvsched.spec.events import *", namespace)
    assert eval(repr(event), namespace) == event
    assert hash(event) == hash(eval(repr(event), namespace))  # frozen values: usable as keys


def test_step_is_the_transition_apply_makes_on_objects() -> None:
    program: list[ev.Event] = [
        ev.Allocate(),
        ev.Publish(PrefixIdentity((1, 0, 0, 0)), (0,), 1),
        ev.Admit(7, PrefixIdentity((1, 0, 0, 0))),
        ev.EnsureWritable(7, 0),
        ev.Release(0),
        ev.SeedDecodeToken(7, 3),
        ev.DecodeRound(),
        ev.Finish(7),
    ]
    objects = spec_system(CONFIG)
    state = SystemState(*objects.snapshot())
    for event in program:
        result = apply(objects, event, HarnessBackend(page_size=CONFIG.page_size))
        state, value = step(state, event, page_size=CONFIG.page_size, backend=HarnessBackend(page_size=2))
        assert value == result, event
        assert (state.pool, state.store, state.scheduler) == objects.snapshot(), event
    assert state.external == ()  # allocated, published, then released: the holder holds nothing


def test_a_refused_step_raises_and_leaves_the_value_unchanged() -> None:
    state = SystemState(*spec_system(CONFIG).snapshot())
    with pytest.raises(UnknownRequest):
        step(state, ev.Finish(3))
    with pytest.raises(DoubleRelease):
        step(state, ev.Release(0))
    assert state == SystemState(*spec_system(CONFIG).snapshot())


def test_the_holder_keeps_its_references_through_each_event() -> None:
    assert holds_after((), ev.Allocate(), 4) == (4,)
    assert holds_after((4,), ev.Retain(4), None) == (4, 4)
    assert holds_after((4, 4), ev.Release(4), None) == (4,)
    assert holds_after((4,), ev.Release(5), None) == (4,)  # another owner's reference
    assert holds_after((4,), ev.Writable(None), Allocated(6)) == (4, 6)
    assert holds_after((4,), ev.Writable(4), Copy(4, 2)) == (2,)
    assert holds_after((4,), ev.Finish(0), None) == (4,)


def test_a_round_event_needs_a_backend() -> None:
    with pytest.raises(ValueError, match="needs a backend"):
        apply(SpecObjects.at(SystemState(*spec_system(CONFIG).snapshot())), ev.DecodeRound())
    assert not issubclass(ValueError, KvschedError)  # a harness mistake, not a refusal
