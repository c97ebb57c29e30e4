"""z3 proofs for the router's index (`spec/router_index.py`): folding an engine's KV events keeps a
view that is not stale equal to what the engine had published, for every number of keys, batches
and restarts.

**The state** (unbounded arrays; a set of cached entries is an array from an entry to a bool):

    epoch, seq      the engine's restart epoch and the number of its next batch in that epoch
    history[i]      the set the engine had cached when it published batch i of this epoch
    resets[i]       batch i opens with `Cleared` (the epoch's first always does: an engine's
                    first batch announces it; a reset's does too)
    v_epoch, v_next the view's epoch (-1: never heard from) and the batch it folds next
    v_set, v_stale  what the view holds, and whether it serves nothing until a snapshot

Batch i's events are what `spec.kv_events.changes` writes: after `Cleared` every entry of
history[i] stored; otherwise each entry of history[i-1] not in history[i] removed and each new
one stored. Folded onto a set S, entry k ends as history[i][k] after a reset, else as removed,
stored or S[k]. (One page an entry: the engine's cached set has no duplicates.)

**The invariant**: resets[0]; and a view of the engine's current epoch that is not stale has
folded no batch the engine has not published (v_next <= seq) and holds exactly the set the
engine had published when it published batch v_next - 1 (nothing before batch 0).

**Transitions**, each proved to keep it at every size (`unsat` of its negation) and shown
enabled: the engine publishes any set (a reset or not), restarts (a new epoch, numbering from
0), and the view receives any batch of the current epoch by the spec's verdicts (a new epoch's
batch 0 starts it afresh, any other marks it stale; a repeat or a stale view's batch changes
nothing; a gap marks it stale; the next one is folded), or a snapshot taken at any batch of the
epoch (kept unless it is older than a view that is not stale). A batch folded in order never
contradicts the view (`in_order_never_contradicts`). Four upstream index bugs are refuted at a
bounded size with a counterexample: a batch folded across a gap (llm-d-kv-cache #593's class), a
restart's first batch folded onto the old process's blocks (llm-d-router #2853), `Cleared`
ignored (aibrix PR #2385), another engine's batch folded (vLLM #45174's consumer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import z3

from kvsched.proofs.inductive import decide
from kvsched.proofs.model import Bool, Int
from kvsched.proofs.preservation import SmallModel

RESOURCE_LIMIT = 5_000_000  # z3's counted resource units per check (never a wall-clock timeout)
BOUND = 3  # bounded checks: batches 0..3
SET = z3.ArraySort(z3.IntSort(), z3.BoolSort())
EMPTY = z3.K(z3.IntSort(), z3.BoolVal(False))


@dataclass(frozen=True)
class Index:
    """One engine and the index's view of it."""

    epoch: Int
    seq: Int
    history: z3.ArrayRef
    resets: z3.ArrayRef
    v_epoch: Int
    v_next: Int
    v_set: z3.ArrayRef
    v_stale: Bool


FIELDS = ("epoch", "seq", "history", "resets", "v_epoch", "v_next", "v_set", "v_stale")


def state(name: str) -> Index:
    return Index(
        z3.Int(f"{name}.epoch"),
        z3.Int(f"{name}.seq"),
        z3.Array(f"{name}.history", z3.IntSort(), SET),
        z3.Array(f"{name}.resets", z3.IntSort(), z3.BoolSort()),
        z3.Int(f"{name}.v_epoch"),
        z3.Int(f"{name}.v_next"),
        z3.Array(f"{name}.v_set", z3.IntSort(), z3.BoolSort()),
        z3.Bool(f"{name}.v_stale"),
    )


def published(x: Index, batch: Int) -> z3.ArrayRef:
    """The set the engine had published once batch `batch` was (nothing before batch 0)."""
    return z3.If(batch < 0, EMPTY, x.history[batch])


def fold(x: Index, held: z3.ArrayRef, batch: Int, *, cleared: bool = True) -> z3.ArrayRef:
    """`held` after batch `batch`'s events (`cleared` False: the broken form that skips `Cleared`,
    folding a reset's stores onto what it held)."""
    k = z3.Int("k")
    after = x.history[batch]
    reset = after[k] if cleared else z3.Or(held[k], after[k])
    return z3.Lambda([k], z3.If(x.resets[batch], reset, _changed(held, published(x, batch - 1), after, k)))


def _changed(held: z3.ArrayRef, before: z3.ArrayRef, after: z3.ArrayRef, k: Int) -> Bool:
    """Entry `k` of `held` after the events that take `before` to `after` without a reset: each
    entry gone removed, each new one stored."""
    removed, stored = z3.And(before[k], z3.Not(after[k])), z3.And(z3.Not(before[k]), after[k])
    return z3.If(removed, False, z3.If(stored, True, held[k]))


def invariant(x: Index, bounded: bool = False) -> Bool:
    """The invariant (no quantifier: the same at every size and at the bound)."""
    current = z3.And(z3.Not(x.v_stale), x.v_epoch == x.epoch)
    truthful = z3.And(x.v_next <= x.seq, x.v_set == published(x, x.v_next - 1))
    return z3.And(
        x.seq >= 0, x.v_next >= 0, x.v_epoch >= -1, x.v_epoch <= x.epoch, x.resets[0], z3.Implies(current, truthful)
    )


def _same(x: Index, y: Index, *changed: str) -> Bool:
    return z3.And(*(getattr(y, name) == getattr(x, name) for name in FIELDS if name not in changed))


def _view(y: Index, epoch: Int, next_seq: Int, held: z3.ArrayRef, stale: Bool) -> Bool:
    return z3.And(y.v_epoch == epoch, y.v_next == next_seq, y.v_set == held, y.v_stale == stale)


def publish(x: Index, y: Index, cached: z3.ArrayRef, reset: Bool) -> Bool:
    """The engine publishes batch `seq`: its cached set is now `cached` (after a reset: `reset`)."""
    return z3.And(
        y.history == z3.Store(x.history, x.seq, cached),
        y.resets == z3.Store(x.resets, x.seq, z3.Or(reset, x.seq == 0)),
        y.seq == x.seq + 1,
        _same(x, y, "history", "resets", "seq"),
    )


def restart(x: Index, y: Index) -> Bool:
    """The engine restarts: a new epoch, numbering from 0 (its batches yet unknown)."""
    return z3.And(y.epoch == x.epoch + 1, y.seq == 0, y.resets[0], _same(x, y, "epoch", "seq", "history", "resets"))


def deliver(
    x: Index,
    y: Index,
    batch: Int,
    *,
    across_gaps: bool = False,
    restart_keeps: bool = False,
    cleared: bool = True,
) -> Bool:
    """The view receives batch `batch` of the engine's current epoch, by the spec's verdicts (the
    keywords: the broken forms)."""
    fresh = x.v_epoch < x.epoch  # never heard from, or restarted
    start = z3.If(
        batch == 0,
        _view(y, x.epoch, 1, fold(x, x.v_set if restart_keeps else EMPTY, 0, cleared=cleared), z3.BoolVal(False)),
        _view(y, x.epoch, 0, EMPTY, z3.BoolVal(True)),
    )
    folded = _view(y, x.epoch, batch + 1, fold(x, x.v_set, batch, cleared=cleared), z3.BoolVal(False))
    gap = folded if across_gaps else _view(y, x.v_epoch, x.v_next, x.v_set, z3.BoolVal(True))
    unchanged = _view(y, x.v_epoch, x.v_next, x.v_set, x.v_stale)
    verdict = z3.If(
        fresh,
        start,
        z3.If(batch < x.v_next, unchanged, z3.If(x.v_stale, unchanged, z3.If(batch > x.v_next, gap, folded))),
    )
    return z3.And(batch >= 0, batch < x.seq, verdict, _same(x, y, "v_epoch", "v_next", "v_set", "v_stale"))


def deliver_foreign(x: Index, y: Index, before: z3.ArrayRef, after: z3.ArrayRef) -> Bool:
    """The broken form that folds another engine's batch (any sets) as this engine's next."""
    k = z3.Int("k")
    held = z3.Lambda([k], _changed(x.v_set, before, after, k))
    return z3.And(
        z3.Not(x.v_stale),
        x.v_epoch == x.epoch,
        _view(y, x.v_epoch, x.v_next, held, z3.BoolVal(False)),
        _same(x, y, "v_epoch", "v_next", "v_set", "v_stale"),
    )


def resync(x: Index, y: Index, at: Int) -> Bool:
    """A snapshot the engine took when its next batch was `at` arrives: kept unless it is older
    than a view of its epoch that is not stale (`spec.router_index.snapshot_is_late`)."""
    older = z3.Or(x.epoch < x.v_epoch, z3.And(x.epoch == x.v_epoch, at < x.v_next))
    late = z3.And(older, z3.Or(x.epoch < x.v_epoch, z3.Not(x.v_stale)))
    taken = _view(y, x.epoch, at, published(x, at - 1), z3.BoolVal(False))
    unchanged = _view(y, x.v_epoch, x.v_next, x.v_set, x.v_stale)
    return z3.And(
        at >= 0, at <= x.seq, z3.If(late, unchanged, taken), _same(x, y, "v_epoch", "v_next", "v_set", "v_stale")
    )


Transition = Callable[[Index, Index], Bool]


def transitions() -> dict[str, Transition]:
    """The engine's and the view's moves (free variables: a cached set, a batch number)."""
    cached, reset, batch = z3.Array("cached", z3.IntSort(), z3.BoolSort()), z3.Bool("reset"), z3.Int("batch")
    return {
        "publish": lambda x, y: publish(x, y, cached, reset),
        "restart": restart,
        "deliver": lambda x, y: deliver(x, y, batch),
        "resync": lambda x, y: resync(x, y, batch),
    }


def broken() -> dict[str, Transition]:
    """The upstream index bugs, each to be refuted."""
    batch = z3.Int("batch")
    before, after = (
        z3.Array("other.before", z3.IntSort(), z3.BoolSort()),
        z3.Array("other.after", z3.IntSort(), z3.BoolSort()),
    )
    return {
        "llmd_593_folds_across_a_gap": lambda x, y: deliver(x, y, batch, across_gaps=True),
        "llmd_2853_restart_keeps_blocks": lambda x, y: deliver(x, y, batch, restart_keeps=True, cleared=False),
        "aibrix_2385_ignores_cleared": lambda x, y: deliver(x, y, batch, cleared=False),
        "vllm_45174_folds_foreign": lambda x, y: deliver_foreign(x, y, before, after),
    }


def in_order_never_contradicts() -> z3.CheckSatResult:
    """`unsat`: under the invariant, the batch a view that is not stale folds next stores no entry
    it holds and removes none it lacks (`spec.router_index`'s CONTRADICTS never comes of it)."""
    x, k = state("x"), z3.Int("k")
    batch = x.v_next
    before, after = published(x, batch - 1), x.history[batch]
    contradicts = z3.And(
        z3.Not(x.resets[batch]),
        z3.Or(
            z3.And(before[k], z3.Not(after[k]), z3.Not(x.v_set[k])),
            z3.And(z3.Not(before[k]), after[k], x.v_set[k]),
        ),
    )
    current = z3.And(z3.Not(x.v_stale), x.v_epoch == x.epoch, batch < x.seq)
    return decide(z3.And(invariant(x), current, contradicts), RESOURCE_LIMIT)


def _within_bound() -> Bool:
    batch = z3.Int("batch")
    return z3.And(batch >= 0, batch <= BOUND)


def main() -> int:
    """Prove every transition and the no-contradiction lemma, refute every broken form; 0 when
    all is as it must be."""
    ok = MODEL.report("router index", 30, transitions(), broken())
    lemma = in_order_never_contradicts() == z3.unsat
    print(f"router index  {'in_order_never_contradicts':<30} {'proved' if lemma else 'NOT PROVED'}")
    return 0 if ok and lemma else 1


MODEL = SmallModel(state, invariant, _within_bound, RESOURCE_LIMIT)
preserves = MODEL.preserves
enabled = MODEL.enabled


if __name__ == "__main__":
    raise SystemExit(main())
