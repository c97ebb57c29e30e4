"""`python -m devtools.step_phases` times every phase of a steady decode step: each wrapped
method runs in every such step, the phases and the rest add up to the step, and the engine's
classes are as they were afterwards."""

from __future__ import annotations

import math

from devtools import step_phases


def test_every_phase_runs_and_the_phases_add_up_to_the_step() -> None:
    methods = {(owner, name): owner.__dict__[name] for _, owner, name in step_phases.PHASES}
    row = step_phases.measure(4, 1)
    assert row["steady_steps"] > 100  # 128 new tokens each, less the steps that prefill or finish
    phases = row["phases_us"]
    assert all(phases[label] > 0 for label, _, _ in step_phases.PHASES if "eviction" not in label)
    assert math.isclose(sum(phases.values()), row["step_timed_us"])
    assert all(owner.__dict__[name] is method for (owner, name), method in methods.items())
