"""The router's index (`kvsched.spec.router_index`): its events as the machine draws them and the
explorer enumerates them, its own step check, and its registration.

The engines behind the index are scripted: each engine publishes, in each restart epoch, the
batches its script fixes (`IndexConfig.script`, another for each engine and epoch), so what an
engine had cached after any batch is known (`IndexConfig.truth`) and a view can be checked
against it, whatever the index's own logic says.
A transport delivers any scripted batch on any stream, in any order, repeated or not, and a
batch garbled so that it contradicts what its engine had (it removes a key never stored);
snapshots are the scripted engines' sets; malformed batches and snapshots must be refused.

The step check (`views_match_their_engines`): every view the index does not call stale holds
exactly what its engine had cached before the batch the view expects next.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from hypothesis import strategies as st

from kvsched.spec import index_events as iev
from kvsched.spec.kv_events import (
    DEVICE,
    HOST,
    Cleared,
    Entry,
    EventBatch,
    KvEvent,
    Removed,
    Snapshot,
    Stored,
    fold_events,
)
from kvsched.spec.router_index import INDEX_INVARIANTS, IndexState, RouterIndex
from kvsched.testing.component import Component, Corpus, EventSpec, Harness, StepContext
from kvsched.testing.outcome import CheckFailure, FailureKind

M, E, Z, C, S = Harness.MACHINE, Harness.EXPLORER, Harness.Z3, Harness.CONTRACTS, Harness.SAFETY

SCRIPTS: tuple[tuple[tuple[KvEvent, ...], ...], ...] = (
    (  # epoch 0: a chain stored, demoted, evicted, the cache reset and filled again
        (Stored("a", None, 4), Stored("b", "a", 4)),
        (Stored("a", None, 4, HOST), Removed("b")),
        (Cleared(), Stored("c", None, 4)),
        (Stored("a", None, 4), Removed("c")),
    ),
    (  # epoch 1 (after a restart): other content
        (Stored("c", None, 4), Stored("d", "c", 4)),
        (Removed("d"), Stored("c", None, 4, HOST)),
        (Removed("c"),),
    ),
)
PROMPTS = (("a", "b"), ("a",), ("c", "d"), ("b",))
NEVER_STORED = "zz"


@dataclass(frozen=True, slots=True)
class IndexConfig:
    """The scripted engines behind one index, and what the harnesses draw from."""

    engines: tuple[str, ...] = ("e0", "e1")
    epochs: int = 2
    steps: int = 4  # the first `steps` batches of each epoch's script

    def script(self, engine: str, epoch: int) -> tuple[tuple[KvEvent, ...], ...]:
        """`engine`'s batches in restart epoch `epoch`."""
        which = epoch + (self.engines.index(engine) if engine in self.engines else 0)
        return SCRIPTS[which % len(SCRIPTS)][: self.steps]

    def batch(self, engine: str, epoch: int, seq: int) -> EventBatch:
        return EventBatch(engine, epoch, seq, self.script(engine, epoch)[seq])

    def batches(self) -> list[EventBatch]:
        """Every scripted batch of every engine."""
        return [
            self.batch(engine, epoch, seq)
            for engine in self.engines
            for epoch in range(self.epochs)
            for seq in range(len(self.script(engine, epoch)))
        ]

    def truth(self, engine: str, epoch: int, next_seq: int) -> frozenset[Entry] | None:
        """What `engine` had cached in `epoch` after its batches before `next_seq` (None: it
        published fewer)."""
        script = self.script(engine, epoch)
        if not 0 <= next_seq <= len(script) or epoch >= self.epochs:
            return None
        cached: frozenset[Entry] | None = frozenset()
        for events in script[:next_seq]:
            assert cached is not None
            cached = fold_events(cached, events)
        assert cached is not None, "a script that contradicts itself"
        return cached

    def snapshot(self, engine: str, epoch: int, next_seq: int) -> Snapshot:
        truth = self.truth(engine, epoch, next_seq)
        assert truth is not None
        return Snapshot(engine, epoch, next_seq, tuple(sorted((key, tier, None) for key, tier in truth)))

    def snapshots(self) -> list[Snapshot]:
        """Every scripted engine's snapshot before and after each of its batches."""
        return [
            self.snapshot(engine, epoch, next_seq)
            for engine in self.engines
            for epoch in range(self.epochs)
            for next_seq in range(len(self.script(engine, epoch)) + 1)
        ]


def spec_index(config: IndexConfig) -> RouterIndex:
    """The spec's index."""
    return RouterIndex()


def impl_index(config: IndexConfig) -> Any:
    """impl's index."""
    from kvsched.impl.router_index import RouterIndex as ImplRouterIndex

    return ImplRouterIndex()


def garbled(batch: EventBatch) -> EventBatch:
    """`batch` with a removal its engine never published: it contradicts any view."""
    return replace(batch, events=(*batch.events, Removed(NEVER_STORED)))


MALFORMED: tuple[Any, ...] = (
    "batch",
    EventBatch("e0", 0, -1, ()),
    EventBatch("e0", 0, 0, [Stored("a", None, 4)]),  # type: ignore[arg-type]
    EventBatch("e0", 0, 0, (Stored("a", None, 0),)),
    EventBatch("e0", 0, 0, (Removed("a", "disk"),)),
    EventBatch("e0", 0, 0, ("Stored",)),  # type: ignore[arg-type]
    EventBatch("", 0, 0, ()),
)
BAD_SNAPSHOTS: tuple[Any, ...] = (
    "snapshot",
    Snapshot("e0", 0, 0, (("a", DEVICE, None), ("a", DEVICE, None))),
    Snapshot("e0", True, 0, ()),
)


# -- the machine's draws ---------------------------------------------------------------------------


@cache
def _deliveries(config: IndexConfig) -> st.SearchStrategy[iev.Deliver]:
    batches = config.batches()
    own = st.sampled_from(batches).map(lambda batch: iev.Deliver(batch.engine, batch))
    foreign = st.tuples(st.sampled_from(config.engines), st.sampled_from(batches)).map(lambda p: iev.Deliver(*p))
    bad = st.sampled_from(batches).map(lambda batch: iev.Deliver(batch.engine, garbled(batch)))
    malformed = st.sampled_from(MALFORMED).map(lambda batch: iev.Deliver(config.engines[0], batch))
    return st.one_of(own, own, own, foreign, bad, malformed, st.just(iev.Deliver(None, batches[0])))


def draw_deliver(machine: Any) -> st.SearchStrategy[iev.Deliver]:
    return _deliveries(machine.config)


@cache
def _resyncs(config: IndexConfig) -> st.SearchStrategy[iev.Resync]:
    snapshots = config.snapshots()
    own = st.sampled_from(snapshots).map(lambda snap: iev.Resync(snap.engine, snap))
    foreign = st.tuples(st.sampled_from(config.engines), st.sampled_from(snapshots)).map(lambda p: iev.Resync(*p))
    bad = st.sampled_from(BAD_SNAPSHOTS).map(lambda snap: iev.Resync(config.engines[0], snap))
    return st.one_of(own, foreign, bad)


def draw_resync(machine: Any) -> st.SearchStrategy[iev.Resync]:
    return _resyncs(machine.config)


def _prompts() -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from(PROMPTS), st.sampled_from(["ab", (["a"],), None]))


def draw_longest_prefix(machine: Any) -> st.SearchStrategy[iev.LongestPrefix]:
    return st.builds(iev.LongestPrefix, st.sampled_from([*machine.config.engines, "zz", ""]), _prompts())


def draw_route(machine: Any) -> st.SearchStrategy[iev.Route]:
    return st.builds(iev.Route, _prompts())


# -- the explorer's ranges -------------------------------------------------------------------------


def explore_deliver(state: IndexState, config: IndexConfig) -> Iterator[iev.Deliver]:
    """Every scripted batch on its own stream, garbled, and on the first other engine's stream."""
    for batch in config.batches():
        yield iev.Deliver(batch.engine, batch)
        yield iev.Deliver(batch.engine, garbled(batch))
    other = config.engines[-1]
    yield from (iev.Deliver(other, batch) for batch in config.batches() if batch.engine != other)
    yield iev.Deliver(config.engines[0], MALFORMED[1])


def explore_resync(state: IndexState, config: IndexConfig) -> Iterator[iev.Resync]:
    for snapshot in config.snapshots():
        yield iev.Resync(snapshot.engine, snapshot)
    yield iev.Resync(config.engines[0], BAD_SNAPSHOTS[1])


def explore_longest_prefix(state: IndexState, config: IndexConfig) -> Iterator[iev.LongestPrefix]:
    yield from (iev.LongestPrefix(engine, prompt) for engine in config.engines for prompt in PROMPTS)


def explore_route(state: IndexState, config: IndexConfig) -> Iterator[iev.Route]:
    yield from (iev.Route(prompt) for prompt in PROMPTS)


# -- its own step check ----------------------------------------------------------------------------


def views_match_their_engines(step: StepContext) -> CheckFailure | None:
    """Every view not stale holds what its engine had cached before the batch the view expects."""
    config = step.config if isinstance(step.config, IndexConfig) else IndexConfig()
    for engine, view in step.after.views:
        if view.stale:
            continue
        truth = config.truth(engine, view.epoch, view.next_seq)
        if view.cached != truth:
            return CheckFailure(
                FailureKind.GHOST,
                f"after {step.event!r}, {engine}'s view at epoch {view.epoch} before seq {view.next_seq} holds "
                f"{sorted(view.cached, key=repr)}; the engine had {None if truth is None else sorted(truth, key=repr)}",
            )
    return None


# -- the registration ----------------------------------------------------------------------------

ROUTER_INDEX = Component(
    name="router_index",
    summary="the router's index: each engine's cached set folded from its KV events, gaps and restarts named",
    state=IndexState,
    events=(
        EventSpec(iev.Deliver, z3=("index_fold:deliver",), draw=draw_deliver, explore=explore_deliver),
        EventSpec(iev.Resync, z3=("index_fold:resync",), draw=draw_resync, explore=explore_resync),
        EventSpec(iev.LongestPrefix, read_only=True, draw=draw_longest_prefix, explore=explore_longest_prefix),
        EventSpec(iev.Route, read_only=True, draw=draw_route, explore=explore_route),
    ),
    invariants=INDEX_INVARIANTS,
    abstraction=lambda index: index.to_spec(),
    spec=spec_index,
    impl=impl_index,
    checks=(views_match_their_engines,),
    explored={
        "ci": (IndexConfig(epochs=2, steps=3),),
        "deep": (IndexConfig(),),
    },
    corpora=(
        Corpus("router_index", "kvsched.testing.index_variants:VARIANTS"),
        Corpus("index_encoding", "kvsched.proofs.index_fold:broken"),
    ),
    gaps={
        Z: "a read-only query: the z3 proof (kvsched.proofs.index_fold) covers the views it reads",
        C: "the index has no CrossHair contracts: its machine and explorer check it against the scripted engines",
        S: "safety mode drives a foreign page manager; a foreign index is checked through this component",
    },
)
