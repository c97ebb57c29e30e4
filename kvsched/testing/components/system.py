"""The system: one pool, one prefix store and one request scheduler (`kvsched.spec.step`'s
alphabet), with an external holder of page references and standalone tables; its own step
checks (a round on aliased buffers refused, LIFO reuse, exclusive writes) and its registration.
"""

from __future__ import annotations

from typing import Any

from kvsched.spec import events as ev
from kvsched.spec.invariants import INVARIANTS, post_lifo_reuse, post_written_page_exclusive
from kvsched.spec.slots import RequestState
from kvsched.spec.system import SystemState
from kvsched.testing.component import QUERY, Component, Corpus, EventSpec, Harness, StepContext
from kvsched.testing.outcome import CheckFailure, FailureKind

M, E, Z, C, S = Harness.MACHINE, Harness.EXPLORER, Harness.Z3, Harness.CONTRACTS, Harness.SAFETY


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
COPY_OF_ENSURE = "the pool's writable transition, which EnsureWritable drives through the scheduler"
CHUNK = "a chunk is RecordTokens then the pages it fills, both driven"
TABLE_CONTRACT = "the spec table's own operation has a contract (kvsched.contracts.spec_pool: table_*)"

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
                M: "the engine's cache-hit call, driven inside the engine machine's steps; "
                "this machine attaches through Admit's hit and Attach",
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
            gaps={C: "the contracts build one pool per system"},
        ),
        EventSpec(ev.Publish, ids=("pages",), z3=("conformance:Publish",)),
        EventSpec(
            ev.Remove,
            z3=("conformance:Remove",),
            gaps={C: "no contract of its own: its release of an entry is the one Reclaim's contract checks"},
        ),
        EventSpec(ev.Reclaim, z3=("conformance:Reclaim",)),
        EventSpec(
            ev.Attach,
            gaps={E: NO_TABLES_IN_STATE, Z: NO_TABLES_IN_STATE, C: "TableInstall's contract covers its retains"},
        ),
        EventSpec(ev.NewTable, gaps={E: NO_TABLES_IN_STATE, Z: NO_TABLES_IN_STATE}),
        EventSpec(
            ev.TableWritable,
            gaps={E: NO_TABLES_IN_STATE, Z: NO_TABLES_IN_STATE, C: TABLE_CONTRACT},
        ),
        EventSpec(
            ev.TableFork,
            gaps={E: NO_TABLES_IN_STATE, Z: NO_TABLES_IN_STATE, C: TABLE_CONTRACT},
        ),
        EventSpec(ev.TableInstall, ids=("pages",), gaps={E: NO_TABLES_IN_STATE, Z: NO_TABLES_IN_STATE}),
        EventSpec(
            ev.TableRelease,
            gaps={E: NO_TABLES_IN_STATE, Z: NO_TABLES_IN_STATE, C: TABLE_CONTRACT},
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
    gaps={S: "safety mode reaches these objects through their adapter's verbs (adapters.kvsched_parts)"},
)
