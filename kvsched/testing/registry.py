"""Every checked component of kvsched, registered once: the one place to read what is checked.

Each `Component` (`kvsched.testing.component`) lists its events, each with the harnesses that
drive it and, for each that does not, why; its invariants; and its own step checks, which the
step checker (`kvsched.testing.checks.check_step`) runs after the shared ones (typed errors,
lockstep, atomicity, read-only queries). `tests/testing/test_registry.py` prints the event-by-
harness matrix from what each harness really drives and fails on a gap not explained here.

    SYSTEM   the pool, prefix store and request scheduler (with an external holder of page
             references and standalone tables)
    ENGINE   the engine: the step loop over its own parts, with the automatic prefix cache
    RESERVE  the evictable reserve: the pool of an engine whose cache holds no reference
"""

from __future__ import annotations

from typing import Any

from kvsched.spec import events as ev
from kvsched.spec import reserve_events as rev
from kvsched.spec.engine_config import StepOutput
from kvsched.spec.engine_state import ENGINE_INVARIANTS, EngineState
from kvsched.spec.invariants import INVARIANTS, post_lifo_reuse, post_written_page_exclusive
from kvsched.spec.reserve import RESERVE_INVARIANTS, ReserveState
from kvsched.spec.slots import RequestState
from kvsched.spec.system import SystemState
from kvsched.testing import rules_reserve as rr
from kvsched.testing.component import Component, Corpus, EventSpec, Harness, StepContext
from kvsched.testing.outcome import CheckFailure, FailureKind

M, E, Z, C, S = Harness.MACHINE, Harness.EXPLORER, Harness.Z3, Harness.CONTRACTS, Harness.SAFETY

# -- the system's own step checks ------------------------------------------------------------


def written_pages(event: Any, after: SystemState) -> list[tuple[int, int]]:
    """The (request id, logical page) pairs a returned write event made exclusive."""
    if isinstance(event, ev.EnsureWritable):
        return [(int(event.request_id), int(event.logical_page))]
    if isinstance(event, ev.EnsureWritableBatch):
        return [(int(r), int(k)) for r, k in zip(event.request_ids, event.logical_pages, strict=True)]
    page_size = int(event.page_size) if isinstance(event, ev.PrepareDecodeRound) else 0
    if page_size:
        width = len(after.scheduler.slots[0].table) if after.scheduler.slots else 0
        return [
            (slot.request_id, slot.token_count // page_size)
            for slot in after.scheduler.slots
            if slot.state is RequestState.DECODE and slot.token_count // page_size < width
        ]
    return []


def round_wrote_shared(before: SystemState, after: SystemState, page_size: int) -> int | None:
    """A request whose token a committed round wrote into a page it did not hold alone, if any."""
    for was, now in zip(before.scheduler.slots, after.scheduler.slots, strict=True):
        if was.state is not RequestState.DECODE or now.token_count == was.token_count:
            continue  # not in the round
        logical = was.token_count // page_size
        page = was.table[logical] if logical < len(was.table) else None
        if page is None or before.pool.refs[page] != 1:
            return was.request_id
    return None


def overlapping_round_refused(step: StepContext) -> CheckFailure | None:
    """A round on scratch buffers that share memory must be refused before it writes."""
    if isinstance(step.event, ev.DecodeOverlapping):
        return CheckFailure(FailureKind.ATOMICITY, f"{step.event!r}: a round ran on scratch buffers that share memory")
    return None


def lifo_reuse(step: StepContext) -> CheckFailure | None:
    """The free stack changes only at its top."""
    if not post_lifo_reuse(step.before, step.after):
        detail = f"{step.event!r}: {step.before.pool.free} -> {step.after.pool.free} out of order"
        return CheckFailure(FailureKind.LIFO, detail)
    return None


def exclusive_writes(step: StepContext) -> CheckFailure | None:
    """A write event leaves each page it made writable held by its request alone; a committed
    round wrote each token into a page its request held alone (`config`: the system's
    `SystemConfig`, or its page size)."""
    if not step.ownership:
        return None
    for request_id, logical_page in written_pages(step.event, step.after):
        if not post_written_page_exclusive(step.after, request_id, logical_page):
            return CheckFailure(FailureKind.EXCLUSIVE, f"{step.event!r} left logical page {logical_page} shared")
    page_size = getattr(step.config, "page_size", step.config)  # a `SystemConfig` or a page size
    if isinstance(step.event, ev.DecodeRound) and page_size:
        shared = round_wrote_shared(step.before, step.after, page_size)
        if shared is not None:
            return CheckFailure(
                FailureKind.EXCLUSIVE, f"{step.event!r} wrote request {shared}'s token into a shared page"
            )
    return None


def _system_abstraction(system: Any) -> SystemState:
    pool, store, scheduler = system.snapshot()
    return SystemState(pool, store, scheduler, ())  # a harness adds the holds it keeps itself


NO_TABLES_IN_STATE = "standalone tables are not part of SystemState, which it enumerates"
QUERY = "a query: it changes no state"
COPY_OF_ENSURE = "the holder's copy-on-write is the pool transition EnsureWritable drives"
CHUNK = "a chunk is RecordTokens then the pages it fills, both driven"

SYSTEM = Component(
    name="system",
    summary="the pool, prefix store and request scheduler, with an external holder and standalone tables",
    state=SystemState,
    events=(
        EventSpec(ev.Allocate, z3=("conformance:Allocate",)),
        EventSpec(ev.Retain, ids=("page",), z3=("conformance:Retain",)),
        EventSpec(ev.Release, ids=("page",), z3=("conformance:Release",)),
        EventSpec(ev.Writable, ids=("current",), gaps={E: COPY_OF_ENSURE, Z: COPY_OF_ENSURE}),
        EventSpec(ev.Admit, ids=("request_id",), z3=("conformance:Admit",)),
        EventSpec(ev.Fork, ids=("parent", "child"), z3=("conformance:Fork",)),
        EventSpec(ev.EnsureWritable, ids=("request_id",), z3=("conformance:EnsureWritable",)),
        EventSpec(ev.EnsureWritableBatch, ids=("request_ids",), z3=("conformance:EnsureWritableBatch",)),
        EventSpec(ev.PrepareDecodeRound, z3=("conformance:PrepareDecodeRound",)),
        EventSpec(ev.MarkPrefillComplete, ids=("request_id",), z3=("conformance:MarkPrefillComplete",)),
        EventSpec(ev.SeedDecodeToken, ids=("request_id",), z3=("conformance:SeedDecodeToken",)),
        EventSpec(ev.RecordToken, ids=("request_id",), z3=("conformance:RecordToken",)),
        EventSpec(ev.RecordTokens, ids=("request_id",), z3=("conformance:RecordTokens",)),
        EventSpec(
            ev.RecordChunk,
            ids=("request_id",),
            gaps={E: CHUNK, Z: CHUNK, C: "its pages are EnsureWritableBatch's, whose contract holds"},
        ),
        EventSpec(
            ev.AttachPages,
            ids=("request_id", "pages"),
            gaps={
                M: "the engine's cache-hit call; the machine attaches through Admit's hit and Attach",
                E: "the engine's cache-hit call; the explorer attaches through Admit's hit",
                Z: "its retains are the ones Admit's hit branch models",
            },
        ),
        EventSpec(ev.Finish, ids=("request_id",), z3=("conformance:Finish",)),
        EventSpec(ev.DecodeRound, z3=("conformance:DecodeRound",)),
        EventSpec(
            ev.DecodeOverlapping,
            z3=("conformance:DecodeOverlapping",),
            gaps={C: "the pair programs run rounds on buffers they own, which cannot overlap"},
        ),
        EventSpec(
            ev.ForeignPool,
            ids=("request_id",),
            z3=("conformance:ForeignPool",),
            gaps={C: "a second pool is outside CrossHair's bounded objects"},
        ),
        EventSpec(ev.Publish, ids=("pages",), z3=("conformance:Publish",)),
        EventSpec(ev.Remove, z3=("conformance:Remove",), gaps={C: "Publish's contract covers replacing an entry"}),
        EventSpec(ev.Reclaim, z3=("conformance:Reclaim",)),
        EventSpec(
            ev.Attach,
            gaps={E: NO_TABLES_IN_STATE, Z: NO_TABLES_IN_STATE, C: "TableInstall's contract covers its retains"},
        ),
        EventSpec(ev.NewTable, gaps={E: NO_TABLES_IN_STATE, Z: NO_TABLES_IN_STATE}),
        EventSpec(
            ev.TableWritable,
            gaps={E: NO_TABLES_IN_STATE, Z: NO_TABLES_IN_STATE, C: "the pool's writable contract covers it"},
        ),
        EventSpec(
            ev.TableFork,
            gaps={E: NO_TABLES_IN_STATE, Z: NO_TABLES_IN_STATE, C: "Fork's contract covers its retains"},
        ),
        EventSpec(ev.TableInstall, ids=("pages",), gaps={E: NO_TABLES_IN_STATE, Z: NO_TABLES_IN_STATE}),
        EventSpec(
            ev.TableRelease,
            gaps={E: NO_TABLES_IN_STATE, Z: NO_TABLES_IN_STATE, C: "Finish's contract covers a list release"},
        ),
        EventSpec(ev.Read, ids=("page", "request_id"), read_only=True, gaps={E: QUERY, Z: QUERY, C: QUERY}),
    ),
    invariants=INVARIANTS,
    abstraction=_system_abstraction,
    checks=(overlapping_round_refused, lifo_reuse, exclusive_writes),
    corpora=(
        Corpus("variant", "kvsched.testing.variants:VARIANTS"),
        Corpus("mutant", "devtools.mutants_corpus:MUTANTS"),
        Corpus("encoding", "kvsched.proofs.broken:corpus_names"),
        Corpus("contracts", "devtools.broken_contracts:COUNTEREXAMPLES"),
    ),
)


# -- the engine ----------------------------------------------------------------------------


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


NOT_ENGINE_Z3 = "the engine's z3 models are of its state slots and cache conservation, which only a step moves"
ENGINE_NOT_CONTRACTS = "CrossHair cannot drive a whole engine; its parts' contracts hold"

ENGINE = Component(
    name="engine",
    summary="the step loop over its own pool, store, scheduler and automatic prefix cache",
    state=EngineState,
    events=(
        EventSpec(ev.Submit, gaps={Z: NOT_ENGINE_Z3, C: ENGINE_NOT_CONTRACTS}),
        EventSpec(ev.Cancel, ids=("request_id",), gaps={Z: NOT_ENGINE_Z3, C: ENGINE_NOT_CONTRACTS}),
        EventSpec(ev.PublishRunning, ids=("request_id",), gaps={Z: NOT_ENGINE_Z3, C: ENGINE_NOT_CONTRACTS}),
        EventSpec(
            ev.ForkRunning,
            ids=("parent", "child"),
            gaps={
                E: "a fork doubles the running set; the explorer's bounds keep one running request per id",
                Z: NOT_ENGINE_Z3,
                C: ENGINE_NOT_CONTRACTS,
            },
        ),
        EventSpec(
            ev.ResetCache, gaps={Z: "cache conservation's evict covers dropping every key", C: ENGINE_NOT_CONTRACTS}
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
)


# -- the evictable reserve -------------------------------------------------------------------

RESERVE_NOT_CONTRACTS = "the reserve has no CrossHair contracts: its machine, explorer and z3 proof check it"

RESERVE = Component(
    name="reserve",
    summary="the evictable reserve: vLLM's free-queue pool, whose cache holds no reference",
    state=ReserveState,
    events=(
        EventSpec(rev.TakePages, z3=("reserve_safety:allocate",), draw=rr.draw_take, explore=rr.explore_take),
        EventSpec(
            rev.Touch, ids=("pages",), z3=("reserve_safety:touch",), draw=rr.draw_touch, explore=rr.explore_touch
        ),
        EventSpec(
            rev.FreePages, ids=("pages",), z3=("reserve_safety:free",), draw=rr.draw_free, explore=rr.explore_free
        ),
        EventSpec(
            rev.Unpin,
            ids=("pages",),
            gaps={Z: "free's parking branch, which the proof of free covers, for every page"},
            draw=rr.draw_unpin,
            explore=rr.explore_unpin,
        ),
        EventSpec(
            rev.Register,
            ids=("page",),
            z3=("reserve_safety:register",),
            draw=rr.draw_register,
            explore=rr.explore_register,
        ),
        EventSpec(
            rev.Forget, ids=("page",), z3=("reserve_safety:forget",), draw=rr.draw_forget, explore=rr.explore_forget
        ),
        EventSpec(rev.ResetReserve, z3=("reserve_safety:reset",), draw=rr.draw_reset, explore=rr.explore_reset),
        EventSpec(rev.Lookup, read_only=True, gaps={Z: QUERY}, draw=rr.draw_lookup, explore=rr.explore_lookup),
    ),
    invariants=RESERVE_INVARIANTS,
    abstraction=lambda reserve: reserve.to_spec(),
    spec=rr.spec_reserve,
    drain=rr.drain,
    drained=rr.drained,
    corpora=(
        Corpus("reserve", "devtools.vllm.variants:VARIANTS"),
        Corpus("reserve_encoding", "kvsched.proofs.reserve_safety:broken"),
    ),
)

COMPONENTS: tuple[Component, ...] = (SYSTEM, ENGINE, RESERVE)

# What a component leaves to other harnesses altogether, and why.
COMPONENT_GAPS: dict[str, dict[Harness, str]] = {
    "system": {S: "safety mode reaches these objects through their adapter's verbs (adapters.kvsched_parts)"},
    "engine": {S: "safety mode drives a page manager's verbs; the engine is a whole scheduler"},
    "reserve": {
        C: RESERVE_NOT_CONTRACTS,
        S: "safety mode reaches the reserve inside vLLM's pool adapter (make vllm), by its verbs",
    },
}

_BY_EVENT: dict[type[Any], Component] = {entry.event: c for c in COMPONENTS for entry in c.events}


def component_of(event: object) -> Component:
    """The registered component whose alphabet `event` belongs to."""
    component = _BY_EVENT.get(type(event))
    if component is None:
        raise KeyError(f"{type(event).__name__} is not a registered event")
    return component
