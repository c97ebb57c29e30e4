"""The engine: the step loop over its own pool, store, scheduler and automatic prefix cache;
its own step check (the batch limits) and its registration. Its ghost reads, cached content,
isolation, determinism and queue order are checked by its machine (`engine_machine`), which
keeps the model's ghost KV.
"""

from __future__ import annotations

from kvsched.spec import events as ev
from kvsched.spec.engine_config import StepOutput
from kvsched.spec.engine_state import ENGINE_INVARIANTS, EngineState
from kvsched.testing.component import Component, Corpus, EventSpec, Harness, StepContext
from kvsched.testing.outcome import CheckFailure, FailureKind

M, E, Z, C, S = Harness.MACHINE, Harness.EXPLORER, Harness.Z3, Harness.CONTRACTS, Harness.SAFETY


def step_limits(step: StepContext) -> CheckFailure | None:
    """A step keeps within the batch (`config`: the `EngineConfig`)."""
    config, after, value = step.config, step.after, step.outcome.value
    if config is None:
        return None
    if len(after.running) > config.max_batch_size:
        return CheckFailure(FailureKind.INVARIANT, f"{len(after.running)} running over max_batch_size")
    if isinstance(value, StepOutput) and value.tokens_run > config.max_batched_tokens:
        return CheckFailure(FailureKind.INVARIANT, f"a step ran {value.tokens_run} tokens")
    return None


ENGINE_NOT_CONTRACTS = "CrossHair cannot drive a whole engine; its parts' contracts hold"


ENGINE = Component(
    name="engine",
    summary="the step loop over its own pool, store, scheduler and automatic prefix cache",
    state=EngineState,
    events=(
        EventSpec(
            ev.Submit,
            gaps={
                Z: "a submit only queues the request: a step takes its slot and pages, which z3 models",
                C: ENGINE_NOT_CONTRACTS,
            },
        ),
        EventSpec(
            ev.Cancel,
            ids=("request_id",),
            z3=("engine_slots:give_back", "cache_conservation:release"),
            gaps={C: ENGINE_NOT_CONTRACTS},
        ),
        EventSpec(
            ev.PublishRunning,
            ids=("request_id",),
            gaps={
                Z: "it publishes through the engine's store, whose Publish the system's z3 encoding models",
                C: ENGINE_NOT_CONTRACTS,
            },
        ),
        EventSpec(
            ev.ForkRunning,
            ids=("parent", "child"),
            z3=("engine_slots:take",),
            gaps={
                E: "not in the engine explorer's alphabet (candidate submits, cancel, publish, step); "
                "the engine machine drives forks",
                C: ENGINE_NOT_CONTRACTS,
            },
        ),
        EventSpec(ev.ResetCache, z3=("cache_conservation:evict",), gaps={C: ENGINE_NOT_CONTRACTS}),
        *(
            EventSpec(
                event,
                ids=ids,
                gaps={
                    E: "not in the engine explorer's alphabet; the engine machine drives leases",
                    Z: "the tiered cache's z3 model proves a lease's holds (kvsched.proofs.tier_safety)",
                    C: ENGINE_NOT_CONTRACTS,
                },
            )
            for event, ids in ((ev.LeaseRunning, ("request_id",)), (ev.EndLease, ("lease_id",)))
        ),
        EventSpec(
            ev.Step,
            z3=(
                "engine_slots:take",
                "engine_slots:give_back",
                "cache_conservation:insert",
                "cache_conservation:evict",
                "cache_conservation:hit",
                "cache_conservation:allocate",
                "cache_conservation:release",
            ),
            gaps={C: ENGINE_NOT_CONTRACTS},
        ),
    ),
    invariants=ENGINE_INVARIANTS,
    abstraction=lambda engine: engine.to_spec(),
    checks=(step_limits,),
    corpora=(
        Corpus("engine", "kvsched.testing.engine_variants:ENGINE_VARIANTS"),
        Corpus("slots", "kvsched.proofs.engine_slots:broken"),
        Corpus("cache", "kvsched.proofs.cache_conservation:broken"),
    ),
    gaps={S: "safety mode drives a page manager's verbs; the engine is a whole scheduler"},
)
