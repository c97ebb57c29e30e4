"""The router's index: what each engine has cached, folded from the KV events it published.

A router sends a request to the engine that holds the longest prefix of it. It learns what each
engine holds from the engine's batches (`kvsched.spec.kv_events`), which arrive on a stream per
engine, possibly late, repeated, out of order, from another engine (a transport that lost which
stream is which), from an engine that restarted, or garbled. The index keeps, per engine, a
view: the restart epoch, the sequence number of the batch it folds next, the cached set the
batches before it give, and whether the view is stale (it missed or refused something, so its
set may be wrong). An engine never heard from is a view of epoch 0 expecting seq 0 with nothing
cached; so is an engine that restarted, in its new epoch.

    fold     a batch arriving on `source`'s stream. Its verdict says what the index did:
               FOLDED       the batch the view expects: its events applied
               RESTARTED    seq 0 of a later epoch: the engine restarted with nothing
                            cached, so the old set is dropped and the batch applied to the
                            empty set
               DUPLICATE    before the one the view expects: folded already, nothing changes
               LATE         from an earlier epoch: nothing changes
               FOREIGN      it names another engine than its stream's: nothing changes
               GAP          batches are missing before it: the view is stale
               CONTRADICTS  its events contradict the view (a key stored that is cached, or
                            removed that is not): the view is stale, its set as it was
               STALE        the view is stale: nothing folds until a snapshot
    resync   a snapshot (`Snapshot`) replaces the view, not stale, at its epoch and next seq,
             unless it is older than a view that is not stale (LATE) or names another engine
             (FOREIGN)
    longest_prefix   how many of a prompt's leading page keys an engine holds on any tier; a
             stale view, or an engine never heard from, holds none
    route    the engine with the longest prefix (ties to the first by name; None if no engine
             holds any)

Malformed input (not a batch, a negative seq, an event that is not a KV event) is refused with
`InvalidArgument` and nothing changes. Every operation is a pure function of the state;
`RouterIndex` stores the current state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from kvsched.spec import refusals
from kvsched.spec.kv_events import Entry, EventBatch, Key, Snapshot, fold_events, require_batch, require_snapshot


class Verdict(Enum):
    """What the index did with a batch or a snapshot (see the module docstring)."""

    FOLDED = "folded"
    RESTARTED = "restarted"
    DUPLICATE = "duplicate"
    LATE = "late"
    FOREIGN = "foreign"
    GAP = "gap"
    CONTRADICTS = "contradicts"
    STALE = "stale"
    RESYNCED = "resynced"


@dataclass(frozen=True, slots=True)
class View:
    """One engine's view: its epoch, the seq of the batch it folds next, the cached set of the
    batches before, and whether it is stale."""

    epoch: int
    next_seq: int
    cached: frozenset[Entry] = frozenset()
    stale: bool = False


@dataclass(frozen=True, slots=True)
class IndexState:
    """Each engine heard from, with its view, sorted by engine."""

    views: tuple[tuple[str, View], ...] = ()

    def view(self, engine: str) -> View | None:
        """`engine`'s view (None: never heard from)."""
        return next((view for name, view in self.views if name == engine), None)


def _with(state: IndexState, engine: str, view: View) -> IndexState:
    views = dict(state.views)
    views[engine] = view
    return IndexState(tuple(sorted(views.items())))


def require_source(source: object) -> str:
    """`source` if it names an engine (a non-empty str); `InvalidArgument` if not."""
    if not isinstance(source, str) or not source:
        raise refusals.malformed_events(f"a stream is named by its engine, a non-empty str, not {source!r}")
    return source


def fold(state: IndexState, source: object, batch: object) -> tuple[IndexState, Verdict]:
    """`batch`, arriving on `source`'s stream, folded into `source`'s view (see the module)."""
    source = require_source(source)
    batch = require_batch(batch)
    if batch.engine != source:
        return state, Verdict.FOREIGN
    view = state.view(source)
    if view is None or batch.epoch > view.epoch:  # an engine first heard from, or restarted
        fresh = View(batch.epoch, 0)
        if batch.seq != 0:
            return _with(state, source, replace(fresh, stale=True)), Verdict.GAP
        return _apply(state, source, fresh, batch, Verdict.FOLDED if view is None else Verdict.RESTARTED)
    if batch.epoch < view.epoch:
        return state, Verdict.LATE
    if batch.seq < view.next_seq:
        return state, Verdict.DUPLICATE
    if view.stale:
        return state, Verdict.STALE
    if batch.seq > view.next_seq:
        return _with(state, source, replace(view, stale=True)), Verdict.GAP
    return _apply(state, source, view, batch, Verdict.FOLDED)


def _apply(
    state: IndexState, engine: str, view: View, batch: EventBatch, verdict: Verdict
) -> tuple[IndexState, Verdict]:
    cached = fold_events(view.cached, batch.events)
    if cached is None:
        return _with(state, engine, replace(view, stale=True)), Verdict.CONTRADICTS
    return _with(state, engine, View(batch.epoch, batch.seq + 1, cached)), verdict


def snapshot_is_late(snapshot: Snapshot, epoch: int, next_seq: int, stale: bool) -> bool:
    """`snapshot` is older than a view at `epoch` expecting `next_seq`, and the view keeps it
    (an earlier epoch's is always late; the same epoch's only to a view that is not stale)."""
    older = (snapshot.epoch, snapshot.next_seq) < (epoch, next_seq)
    return older and (snapshot.epoch < epoch or not stale)


def resync(state: IndexState, source: object, snapshot: object) -> tuple[IndexState, Verdict]:
    """`snapshot`, arriving on `source`'s stream, replaces `source`'s view (see the module)."""
    source = require_source(source)
    snapshot = require_snapshot(snapshot)
    if snapshot.engine != source:
        return state, Verdict.FOREIGN
    view = state.view(source)
    if view is not None and snapshot_is_late(snapshot, view.epoch, view.next_seq, view.stale):
        return state, Verdict.LATE
    return _with(state, source, View(snapshot.epoch, snapshot.next_seq, snapshot.entries())), Verdict.RESYNCED


def require_keys(keys: object) -> tuple[Key, ...]:
    """`keys` as a tuple if it is a sequence of hashable keys; `InvalidArgument` if not."""
    if not isinstance(keys, tuple | list):
        raise refusals.wrong_kind("keys", "tuple of page keys", keys)
    for key in keys:
        try:
            hash(key)
        except TypeError:
            raise refusals.malformed_events(f"{key!r} is not a key") from None
    return tuple(keys)


def longest_prefix(state: IndexState, engine: object, keys: object) -> int:
    """How many of `keys`' leading keys `engine` holds on any tier (0 if stale or unknown)."""
    engine = require_source(engine)
    keys = require_keys(keys)
    view = state.view(engine)
    if view is None or view.stale:
        return 0
    held = {key for key, _ in view.cached}
    count = 0
    for key in keys:
        if key not in held:
            break
        count += 1
    return count


def route(state: IndexState, keys: object) -> tuple[str | None, int]:
    """The engine holding the longest prefix of `keys`, and how many keys (None, 0: none holds any)."""
    keys = require_keys(keys)
    best: tuple[str | None, int] = (None, 0)
    for engine, _ in state.views:
        held = longest_prefix(state, engine, keys)
        if held > best[1]:
            best = (engine, held)
    return best


# -- invariants ------------------------------------------------------------------------------------


def views_sorted_by_engine(state: IndexState) -> bool:
    """Each engine has one view, in order of its name."""
    names = [name for name, _ in state.views]
    return names == sorted(set(names))


def views_name_a_batch(state: IndexState) -> bool:
    """A view's epoch and next seq name a batch (both >= 0)."""
    return all(view.epoch >= 0 and view.next_seq >= 0 for _, view in state.views)


INDEX_INVARIANTS = (views_sorted_by_engine, views_name_a_batch)


class RouterIndex:
    """The index as an object: the current `IndexState`, each call one transition."""

    def __init__(self) -> None:
        self.state = IndexState()

    def to_spec(self) -> IndexState:
        return self.state

    def fold(self, source: object, batch: object) -> Verdict:
        self.state, verdict = fold(self.state, source, batch)
        return verdict

    def resync(self, source: object, snapshot: object) -> Verdict:
        self.state, verdict = resync(self.state, source, snapshot)
        return verdict

    def longest_prefix(self, engine: object, keys: object) -> int:
        return longest_prefix(self.state, engine, keys)

    def route(self, keys: object) -> tuple[str | None, int]:
        return route(self.state, keys)


__all__ = ["INDEX_INVARIANTS", "IndexState", "RouterIndex", "Snapshot", "Verdict", "View", "fold", "resync"]
