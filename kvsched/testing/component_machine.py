"""The one machine base: run an event on the system under test and the reference, check the step.

`CheckedMachine` is a hypothesis state machine over one registered `Component`: `run(event)`
makes the call on the system under test (and, unless there is none, on the reference), and
hands both outcomes and states to `kvsched.testing.checks.check_step`; a failure stops the
program with `CheckFailed`. The system's machine (`kvsched.testing.harness.MachineBase`) and
the engine's (`kvsched.testing.engine_machine.EngineMachine`) are subclasses that add their
ghost memories through the hooks; `ComponentMachine` needs nothing but the registration: its
one rule draws any event of the component's alphabet (each entry's `draw`), and at teardown it
drains the system and checks that everything came back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvsched.spec.step import apply
from kvsched.testing.checks import check_state, check_step
from kvsched.testing.component import Component
from kvsched.testing.outcome import CheckFailed, CheckFailure, FailureKind, Outcome, capture

Factory = Callable[[Any], Any]


class CheckedMachine(RuleBasedStateMachine):
    """Drives `sut` in lockstep with `ref` (None: no reference), every step checked.

    Hooks for a subclass: `call` (how one event runs on one system), `settle` (bookkeeping
    between the call and reading the state back), `compare` (lockstep beyond the states, before
    the step checker), `observe` (checks that need the harness's own memory, after it)."""

    component: Component
    ownership = True

    def __init__(self, sut: Any, ref: Any | None, config: Any) -> None:
        super().__init__()
        self.sut, self.ref, self.config = sut, ref, config
        self.failed = False  # a check failed: teardown must not bury that failure under its own
        self.calls: Counter[str] = Counter()  # made and refused

    def state(self, system: Any | None = None) -> Any:
        """The state value `system` (the system under test by default) stands for."""
        return self.component.abstraction(self.sut if system is None else system)

    def fail(self, failure: CheckFailure) -> None:
        """Stop the program with `failure`."""
        self.failed = True
        raise CheckFailed(failure)

    def call(self, system: Any, event: Any) -> Outcome:
        """Run `event` on `system`; its outcome."""
        return capture(lambda: apply(system, event))

    def settle(self, event: Any, outcome: Outcome) -> None:
        """After the call on the system under test, before its state is read back."""

    def compare(self, event: Any) -> CheckFailure | None:
        """A lockstep check of the harness's own (what the two systems did beyond their states),
        before the step checker."""
        return None

    def observe(self, event: Any, outcome: Outcome, after: Any) -> CheckFailure | None:
        """A check of the harness's own, after the step checker passed."""
        return None

    def run(self, event: Any, *, invariants: bool = True) -> Outcome:
        """Run `event` on the system (and the reference) and check the step; its outcome."""
        if currently_in_test_context():
            note(f"# {event!r}")
        before = self.state()
        outcome = self.call(self.sut, event)
        self.settle(event, outcome)
        after = self.state()
        reference = None
        if self.ref is not None:
            expected = self.call(self.ref, event)
            reference = expected, self.state(self.ref)
        self.calls["refused" if outcome.error is not None else "made"] += 1
        failure = self.compare(event) or check_step(
            before,
            event,
            outcome,
            after,
            reference,
            component=self.component,
            config=self.config,
            ownership=self.ownership,
            invariants=invariants,
        )
        failure = failure or self.observe(event, outcome, after)
        if failure is not None:
            self.fail(failure)
        return outcome

    def drain(self) -> None:
        """Liveness: the component's drain events give everything back (each a checked step)."""
        drain, drained = self.component.drain, self.component.drained
        if self.failed or not self.ownership or drain is None or drained is None:
            return
        for event in drain(self.state()):
            if self.run(event).error is not None:
                self.fail(CheckFailure(FailureKind.LIVENESS, f"draining failed at {event!r}"))
        if not drained(self.state()):
            self.fail(CheckFailure(FailureKind.LIVENESS, f"not everything came back: {self.state()}"))


class ComponentMachine(CheckedMachine):
    """Any registered component's machine, by registration alone: one rule draws any event of
    its alphabet; after every rule, its invariants; at teardown, liveness."""

    factory: Factory
    reference: Factory | None
    default_config: Any
    tally: Counter[str] | None = None  # calls made and refused, summed over every program

    def __init__(self) -> None:
        config = self.default_config
        super().__init__(self.factory(config), self.reference(config) if self.reference else None, config)

    @rule(data=st.data())
    def any_event(self, data: st.DataObject) -> None:
        """Any event of the alphabet, its arguments drawn by its entry (valid or not)."""
        drawable = [entry for entry in self.component.events if entry.draw is not None]
        entry = drawable[data.draw(st.integers(0, len(drawable) - 1), label="which")]
        assert entry.draw is not None
        self.run(data.draw(entry.draw(self), label=entry.name))

    @invariant()
    def invariants_hold(self) -> None:
        """The component's invariants on the system under test's state."""
        if self.ownership and (failure := check_state(self.state(), self.component)):
            self.fail(failure)

    def teardown(self) -> None:
        if self.tally is not None:
            self.tally.update(self.calls)
        self.drain()


def machine_for(
    component: Component,
    factory: Factory,
    reference: Factory | None,
    config: Any,
    tally: Counter[str] | None = None,
) -> type[ComponentMachine]:
    """A `ComponentMachine` class for `component` over these systems (what hypothesis runs);
    `tally` sums the calls made and refused over every program it runs."""
    if not any(entry.draw is not None for entry in component.events):
        raise ValueError(f"component {component.name!r} registers no event the machine can draw")
    attributes = {
        "component": component,
        "factory": staticmethod(factory),
        "reference": staticmethod(reference) if reference is not None else None,
        "default_config": config,
        "tally": tally,
    }
    return type(f"{component.name.title()}Machine", (ComponentMachine,), attributes)
