"""The stateful harness, for checking kvsched or your own page manager (the `testing` extra).

Safety mode, for anyone's page manager: write a `PageManager` adapter (the verbs every paged
engine has, and a `PoolView` of the pool as plain ints; `kvsched.testing.adapter`), then run
`search_safety(factory)` or `kvsched check MODULE:FACTORY`. `SafetyMachine(factory)` is the
engine side it drives, which a printed counterexample calls directly. Shipped adapters:
`kvsched.testing.adapters` (kvsched's parts, nano-vllm). `docs/checking-your-page-manager.md`
walks through one.

Exact mode, lockstep with kvsched's spec:
Wrap your pool, prefix store and scheduler in a `SystemUnderTest` adapter (three objects with
the spec's API, `snapshot()` as your abstraction function to the spec's states, and round
scratch in your form; `kvsched.testing.impl_system` is the twenty-line example), then run
`KvschedMachine(your_factory, spec_system)` under hypothesis, or `run_campaign` for a bounded
campaign with a summary and a runnable counterexample. Every step it takes is an event of
`kvsched.spec.events`, checked by `check_step`; a failure is a `CheckFailed` naming its
`FailureKind`. `kvsched.proofs.explorer.Explorer` searches every reachable state of small
bounds exhaustively. For an engine (the step loop), `engine_machine(your_factory, spec_engine)`
is the same harness over `Submit`, `Cancel`, `PublishRunning`, `ForkRunning` and `Step`.

What is checked, component by component and event by event, is registered once in
`kvsched.testing.registry` (`COMPONENTS`); a component registered there (or in your own code,
as a `Component`) gets the machine base (`machine_for`) and the explorer
(`kvsched.proofs.component_explorer`) by its registration alone.
"""

from __future__ import annotations

from kvsched.testing.adapter import ManagerFactory, PageManager, PoolView
from kvsched.testing.campaign import CampaignResult, run_campaign, run_machine
from kvsched.testing.checks import CheckFailed, CheckFailure, FailureKind, Outcome, capture, check_step
from kvsched.testing.component import Component, Corpus, EventSpec, Harness
from kvsched.testing.component_machine import machine_for
from kvsched.testing.engine_machine import EngineMachine, engine_machine, impl_engine, spec_engine
from kvsched.testing.impl_system import impl_system
from kvsched.testing.machine import CampaignStats, KvschedMachine
from kvsched.testing.registry import COMPONENTS
from kvsched.testing.safety import SafetyMachine
from kvsched.testing.safety_search import SafetyResult, search_safety
from kvsched.testing.system import SpecSystem, SystemConfig, SystemFactory, SystemUnderTest, spec_system

__all__ = [
    "COMPONENTS",
    "CampaignResult",
    "CampaignStats",
    "CheckFailed",
    "CheckFailure",
    "Component",
    "Corpus",
    "EngineMachine",
    "EventSpec",
    "FailureKind",
    "Harness",
    "KvschedMachine",
    "ManagerFactory",
    "Outcome",
    "PageManager",
    "PoolView",
    "SafetyMachine",
    "SafetyResult",
    "SpecSystem",
    "SystemConfig",
    "SystemFactory",
    "SystemUnderTest",
    "capture",
    "check_step",
    "engine_machine",
    "impl_engine",
    "impl_system",
    "machine_for",
    "run_campaign",
    "run_machine",
    "search_safety",
    "spec_engine",
    "spec_system",
]
