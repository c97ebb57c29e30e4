"""Exhaustive bounded exploration of the engine: every state reachable from a small configuration
by submitting a fixed set of candidate requests (each at most once), cancelling, publishing a
computed prompt as a prefix, and stepping, with every check on every transition and liveness
from every state.

On each transition: the engine checks of the stateful machine (`check_step`: typed
outcome, lockstep with a `reference` engine, atomicity, every engine invariant, the step's
limits); the tokens the model computed within `max_batched_tokens`; determinism (every
request's generated tokens are what it samples alone: the model is the null model, so they are
known); a preempted request's place (ahead of every request of its
priority that never ran). From every state, liveness: with no arrivals, stepping finishes every
request within `drain_steps` steps, and then only published prefixes hold pages and no state
slot is held. Search is breadth-first (the first violation has a shortest path), bounded by
`max_states`. States are the engine's abstract state (`to_spec()`) plus which candidates were
submitted; the engine is any factory (spec, impl, a broken variant), copied per branch.

With the automatic prefix cache (`CACHED`), the model is the engine machine's ghost-KV model
instead of the null model, the alphabet gains `ResetCache`, and every transition also checks
the ghost reads, every cached page's content against its key and tenant isolation
(`kvsched.testing.engine_machine`); determinism compares with that model's tokens alone.

With a host tier (`HOSTED`), a step may also leave the copies between the tiers in flight, or
fail them, or fail to start its new ones (the model armed as the engine machine arms it); no
copy the backend runs may be one the engine forgot; states count the copies in flight by their
rank, not their ids; liveness is checked three times: draining with the tier working (every
copy completes), with every copy failing, and with one bad host page.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kvsched.impl.null_model import NullModel  # serves both batch forms
from kvsched.proofs.search import Attempt, Node, Search, Searched
from kvsched.spec import events as ev
from kvsched.spec.engine_config import EngineConfig, EngineRequest, StepOutput
from kvsched.spec.engine_state import EngineState, Queued, Running, sequence_of
from kvsched.spec.host_tier import HostStats
from kvsched.spec.model import null_next_token
from kvsched.spec.page_keys import CacheSalt
from kvsched.spec.prefix_cache import EMPTY_CACHE
from kvsched.testing.checks import CheckFailure, FailureKind
from kvsched.testing.engine_liveness import TIER_FAULTS, drained
from kvsched.testing.engine_machine import (
    SHAPES,
    budget_failure,
    cache_failure,
    events_failure,
    ghost_failure,
    prefix_for,
)
from kvsched.testing.engine_model import FAILED, IN_FLIGHT, WORKING, HarnessModel, greedy_tokens
from kvsched.testing.registry import ENGINE

EngineFactory = Callable[[EngineConfig, Any], Any]
VOCAB = 50


@dataclass(frozen=True, slots=True)
class EngineBounds:
    """What the exploration covers."""

    config: EngineConfig
    candidates: tuple[EngineRequest, ...]  # the requests that may arrive, each at most once
    max_states: int = 20_000
    drain_steps: int = 60


@dataclass
class EngineExploration:
    """One exploration: what it covered and the first violation with its shortest path."""

    states: int = 0
    transitions: int = 0
    complete: bool = False  # every reachable state was explored
    preemptions: int = 0  # steps that preempted
    cache_hits: int = 0  # steps that admitted a request with pages from the prefix cache
    host_hits: int = 0  # steps that admitted a request with pages from the host tier
    refusals: int = 0  # events refused (each checked to change nothing)
    violation: CheckFailure | None = None
    path: list[ev.Event] = field(default_factory=list)


def greedy(request: EngineRequest, ghost: bool = False) -> list[int]:
    """The model's tokens for `request` alone (the null model's, or the ghost model's)."""
    if ghost:
        return greedy_tokens(request.prompt, request.max_new_tokens, request.eos_token_id)
    sequence, tokens = list(request.prompt), []
    for _ in range(request.max_new_tokens):
        token = null_next_token(sequence[-1], len(sequence) - 1, VOCAB)
        tokens.append(token)
        sequence.append(token)
        if token == request.eos_token_id:
            break
    return tokens


def determinism(state: EngineState, ghost: bool = False) -> CheckFailure | None:
    """Every request holds the tokens it samples alone, so far."""
    entries: list[Queued | Running] = [*state.queue, *state.running]
    for entry in entries:
        expected = greedy(entry.request, ghost)
        if list(entry.generated) != expected[: len(entry.generated)]:
            detail = f"request {entry.request.request_id} generated {entry.generated}, alone {expected}"
            return CheckFailure(FailureKind.DETERMINISM, detail)
    return None


def places(preempted: tuple[int, ...], state: EngineState) -> CheckFailure | None:
    """Each preempted request is queued ahead of every request of its priority that never ran
    (generated nothing and was not preempted in the same step)."""
    queue = list(state.queue)
    for index, entry in enumerate(queue):
        if entry.request.request_id not in preempted:
            continue
        for earlier in queue[:index]:
            ran = earlier.generated or earlier.request.request_id in preempted
            if earlier.request.priority == entry.request.priority and not ran:
                detail = f"preempted {entry.request.request_id} queued behind {earlier.request.request_id}"
                return CheckFailure(FailureKind.ORDER, detail)
    return None


def canonical(state: EngineState) -> EngineState:
    """`state` with its clocks replaced by ranks: the admission stamps and the store's use
    stamps matter only by their order, so states that differ in the clocks alone behave alike."""
    stamps = sorted(entry.admitted for entry in state.running)
    running = tuple(replace(entry, admitted=stamps.index(entry.admitted)) for entry in state.running)
    store = state.system.store
    uses = sorted(entry.last_used for entry in store.entries if entry is not None)
    entries = tuple(
        None if entry is None else replace(entry, last_used=uses.index(entry.last_used)) for entry in store.entries
    )
    cache = state.system.cache
    used = sorted({entry.last_used for entry in cache.pages})
    pages = tuple(replace(entry, last_used=used.index(entry.last_used)) for entry in cache.pages)
    cache = replace(EMPTY_CACHE, pages=pages, clock=len(used))  # the counters only ever grow
    system = replace(state.system, store=replace(store, entries=entries, clock=len(uses)), cache=cache)
    rank = {copy.transfer_id: index for index, copy in enumerate(state.host.copies)}  # ids by rank
    copies = tuple(replace(copy, transfer_id=rank[copy.transfer_id]) for copy in state.host.copies)
    host = replace(state.host, copies=copies, issued=len(copies), stats=HostStats())
    running = tuple(replace(entry, waiting=tuple(rank[tid] for tid in entry.waiting)) for entry in running)
    return replace(state, system=system, running=running, admissions=len(stamps), host=host)


class EngineExplorer(Search):
    """Breadth-first search over an engine's reachable states (see the module docstring): the
    shared search (`kvsched.proofs.search.Search`) over the registered engine, a
    state keyed by its clock ranks and the candidates submitted so far."""

    def prepare(self, mine: Any, theirs: Any, event: Any) -> None:
        """A step's event arms the copies' models (the copies it reports done, in flight or failed)."""
        if isinstance(event, ev.Step) and self.ghost:
            for system in (mine, theirs):
                if system is not None:
                    system.model.arm(event)
        self.tokens_before = mine.model.tokens

    def __init__(self, bounds: EngineBounds, factory: EngineFactory, reference: EngineFactory | None = None) -> None:
        super().__init__(ENGINE, bounds.config)
        self.bounds, self.factory, self.reference = bounds, factory, reference
        self.ghost = bounds.config.prefix_caching
        model_id = bounds.config.model_id
        self.salts = {CacheSalt(request.tenant, request.adapter, model_id) for request in bounds.candidates}
        self.result = EngineExploration()
        self.tokens_before = 0  # the model's token count before the event being checked

    def _model(self) -> Any:
        return HarnessModel(self.config.page_size) if self.ghost else NullModel(VOCAB)

    def start(self) -> Node:
        reference = self.reference(self.config, self._model()) if self.reference is not None else None
        return Node(self.factory(self.config, self._model()), reference, frozenset())

    def kept(self, at: Any, child: Node, after: Any) -> tuple[Any, Any]:
        return after, (canonical(after), child.history)

    def events(self, at: Any, state: Any) -> list[Any]:
        """The alphabet in `state`: step, reset the cache, submit a candidate not yet submitted,
        cancel one that was, publish a running request's computed prompt."""
        events: list[ev.Event] = [ev.Step()]
        if state.host.copies:  # the copies in flight stay so, or fail
            events += [ev.Step(copies=(IN_FLIGHT,)), ev.Step(copies=(FAILED,))]
        if self.bounds.config.host_pages:  # starting the step's new copies fails
            events.append(ev.Step(copy_fails=True))
        if self.bounds.config.prefix_caching:
            events.append(ev.ResetCache())
        submitted: frozenset[int] = at.history
        events += [ev.Submit(request) for request in self.bounds.candidates if request.request_id not in submitted]
        events += [ev.Cancel(request_id) for request_id in sorted(submitted)]
        for entry in state.running:
            tokens = len(entry.request.prompt)
            if entry.computed >= tokens:
                identity = prefix_for(sequence_of(entry.request, entry.generated)[:tokens])
                events.append(ev.PublishRunning(entry.request.request_id, tokens, identity))
        return events

    def history(self, node: Node, event: Any) -> Any:
        return node.history | {event.request.request_id} if isinstance(event, ev.Submit) else node.history

    def observe(self, attempt: Attempt) -> CheckFailure | None:
        """The ghost reads, cached content and isolation (with the cache); determinism and the
        preempted requests' places for a returned event; counts what the search saw."""
        result, outcome, after, system = self.result, attempt.outcome, attempt.after, attempt.child.sut
        result.refusals += outcome.error is not None
        failure = budget_failure(self.config, system.model.tokens - self.tokens_before)
        if self.ghost and failure is None:
            failure = ghost_failure(system.model, after) or cache_failure(self.config, system.model, after, self.salts)
        if failure is None:  # the KV events since the state it ran from, which published all before them
            published, next_seq = frozenset(system.events.published), system.events.next_seq
            batch, reference = system.take_events(), attempt.child.ref
            expected = reference.take_events() if reference is not None else batch
            failure = events_failure(published, next_seq, batch, after, expected)
        if failure is None and outcome.error is None:
            failure = determinism(after, self.ghost)
            if failure is None and isinstance(outcome.value, StepOutput):
                result.preemptions += bool(outcome.value.preempted)
                result.cache_hits += outcome.value.cache.hits > 0
                result.host_hits += outcome.value.host.hit_tokens > 0
                failure = places(outcome.value.preempted, after)
        return failure

    def replayed(self, attempt: Attempt) -> None:
        """`observe` took the step's KV events from both engines: a replayed step does too."""
        attempt.child.sut.take_events()
        if attempt.child.ref is not None:
            attempt.child.ref.take_events()

    def live(self, at: Any, state: Any) -> CheckFailure | None:
        """Every request finishes, with the host tier working and, with one, failing."""
        tiers = TIER_FAULTS if self.config.host_pages else ()
        for tier in (WORKING, *tiers):
            failure = drained(copy.deepcopy(at.sut), self.bounds.drain_steps, tier)
            if failure is not None:
                return failure
        return None

    TALLIES = ("refusals", "preemptions", "cache_hits", "host_hits")  # what `observe` counts

    def tally(self) -> tuple[int, ...]:
        return tuple(getattr(self.result, name) for name in self.TALLIES)

    def add_tally(self, counts: tuple[int, ...]) -> None:
        for name, count in zip(self.TALLIES, counts, strict=True):
            setattr(self.result, name, getattr(self.result, name) + count)

    def run(self) -> EngineExploration:
        """Explore until every reachable state is seen, `max_states` are, or a check fails."""
        return self.outcome(self.search(self.bounds.max_states))

    def outcome(self, searched: Searched) -> EngineExploration:
        """The exploration `searched` (this explorer's search, here or on workers) as its result."""
        result = self.result
        result.states, result.transitions, result.complete = searched.states, searched.transitions, searched.complete
        if searched.violation is not None:
            violation = searched.violation
            result.violation = CheckFailure(violation.kind, violation.detail)
            result.path = [*violation.path, *([violation.event] if violation.event is not None else [])]
        return result


SMALL = EngineBounds(
    config=replace(SHAPES["tight"], chunk_size=2, prefill_reserve_pages=2, state_slots=2),
    candidates=(
        EngineRequest(1, (3, 1, 4), 2),
        EngineRequest(2, (3, 1, 4), 1, priority=1, prefix=prefix_for((3, 1, 4))),  # a full hit, once published
        EngineRequest(3, (2, 7, 1, 8, 2), 2),  # 7 tokens: the whole pool, so the others are preempted
        EngineRequest(4, (5,), 3, eos_token_id=null_next_token(5, 0, VOCAB)),  # stops at EOS
        EngineRequest(5, (1,) * 7, 2),  # 9 tokens: over max_seq_len, refused
    ),
)

# The small engine with room for the cache; no state slots and no published prefixes.
CACHING = replace(SMALL.config, pages=5, max_batched_tokens=4, prefill_reserve_pages=1, prefix_caching=True)
CACHED = EngineBounds(
    config=replace(CACHING, state_slots=0, prefix_entries=0),
    candidates=(
        EngineRequest(1, (3, 1, 4, 1, 5), 1),
        EngineRequest(2, (3, 1, 4, 1, 9), 2),  # its first two pages hit once 1 computed them
        EngineRequest(3, (3, 1, 4, 1, 5), 1, tenant=1),  # 1's prompt, another tenant: no page shared
    ),
)

# The cached engine's first two requests and the first's prompt under another LoRA adapter.
ADAPTERS = replace(CACHED, candidates=(*CACHED.candidates[:2], EngineRequest(3, (3, 1, 4, 1, 5), 1, adapter=1)))

# The cached engine with a host tier of two pages: a prompt's pages go to the host under another's
# pressure, and come back for a longer prompt that starts with it.
HOSTED = EngineBounds(
    config=replace(CACHED.config, host_pages=2),
    candidates=(
        EngineRequest(1, (3, 1, 4, 1, 5), 1),
        EngineRequest(2, (2, 7, 1, 8, 2, 8), 1),  # the whole pool: 1's cached pages go
        EngineRequest(3, (3, 1, 4, 1, 9), 1),  # 1's first two pages, from wherever they are
    ),
)

# The default admission policy (the whole rest of a prompt must fit) on the same engines.
WHOLE = replace(SMALL, config=replace(SMALL.config, admission="whole_prompt"))
WHOLE_CACHED = replace(CACHED, config=replace(CACHED.config, admission="whole_prompt"))

WIDER = replace(
    SMALL,
    config=replace(SMALL.config, requests=3, pages=6, chunk_size=1, max_batch_size=3, max_queue=3),
    candidates=SMALL.candidates[:3],
    max_states=300_000,  # bounded by states: it does not close within them (about 15 minutes)
)


def engine_named(name: str) -> EngineFactory:
    """An engine factory by name: `spec`, `impl`, or a broken engine's (`ENGINE_VARIANTS`)."""
    from kvsched.testing.engine_machine import impl_engine
    from kvsched.testing.engine_variants import ENGINE_VARIANTS

    if name in ("spec", "impl"):
        factory: EngineFactory = spec_engine if name == "spec" else impl_engine
        return factory
    for variant in ENGINE_VARIANTS:
        if variant.name == name:
            return variant.factory()
    raise ValueError(f"no engine named {name!r}: spec, impl or a broken engine's name")


@dataclass(frozen=True, slots=True)
class EngineRecipe:
    """How a worker builds an engine explorer (`kvsched.proofs.distributed`): the bounds, and the
    engine and its reference by name (`engine_named`)."""

    bounds: EngineBounds
    engine: str = "spec"
    reference: str | None = None

    def build(self) -> EngineExplorer:
        reference = None if self.reference is None else engine_named(self.reference)
        return EngineExplorer(self.bounds, engine_named(self.engine), reference)


def main(argv: list[str] | None = None) -> int:
    """Explore the small engine (and, with `--deep`, a wider one: 3 slots, 6 pages, chunk 1);
    print what each covered; 0 when no check failed."""
    parser = argparse.ArgumentParser(
        prog="python -m kvsched.proofs.engine_explorer", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--deep", action="store_true", help="also the wider configuration (tens of minutes)")
    parser.add_argument("--workers", type=int, default=0, help="search on N worker processes (the same states)")
    parser.add_argument("--ray", metavar="ADDRESS", help="search on a Ray cluster (auto, local, or an address)")
    parser.add_argument("--journal", metavar="DIR", help="with --workers: each search's journal in DIR, to go on from")
    args = parser.parse_args(argv)
    if args.workers < 0:
        parser.error("--workers takes 1 or more")
    runs = [("small", SMALL), ("cached", CACHED), ("whole", WHOLE), ("whole cached", WHOLE_CACHED), ("hosted", HOSTED)]
    runs += [("wider", WIDER)] if args.deep else []
    failed = False
    for name, bounds in runs:
        start = time.perf_counter()
        if args.workers or args.ray:
            from kvsched.proofs.distributed import DistributedSearch, journal_file, report_level

            workers = max(args.workers, 1)
            journal = journal_file(args.journal, f"engine {name}")
            search = DistributedSearch(
                EngineRecipe(bounds),
                workers=workers,
                ray=args.ray,
                partitions=workers,
                journal=journal,
                report=report_level,
            )
            searched = search.run(bounds.max_states)
            result = search.explorer.outcome(searched)
        else:
            result = EngineExplorer(bounds, spec_engine).run()
        verdict = "pass" if result.violation is None else f"FAIL {result.violation}: {result.path}"
        failed |= result.violation is not None
        print(
            f"engine explorer {name}: {result.states:,} states, {result.transitions:,} transitions, "
            f"complete={result.complete}, {result.preemptions:,} preempting steps, {result.cache_hits:,} cache hits, "
            f"{result.host_hits:,} host hits, "
            f"{time.perf_counter() - start:.1f} s: {verdict}",
            flush=True,
        )
    return 1 if failed else 0


def spec_engine(config: EngineConfig, model: Any) -> Any:
    """The spec's engine (the explorer's default subject)."""
    from kvsched.spec.engine import Engine

    return Engine(config, model)


if __name__ == "__main__":
    raise SystemExit(main())
