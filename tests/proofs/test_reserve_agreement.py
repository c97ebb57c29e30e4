"""The reserve's z3 invariant tied to the spec's: on every reachable state of a small reserve and
on corrupted ones, the model's invariant holds exactly when the spec invariants it carries do.

The states come from the reserve's explorer (by its registration); each is corrupted in every way
the carried invariants forbid (a page twice on the queue, a free page off it, a held page on it, a
reserved page counted twice or named, a negative count). A key names one page's content, so the
explored reserve has one key: a page under two keys would hold two contents, which the model,
whose key is its content, cannot encode.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from kvsched.proofs import reserve_safety
from kvsched.proofs.component_explorer import ComponentExplorer
from kvsched.spec.reserve import ReserveState
from kvsched.testing.components.reserve import ReserveConfig, spec_reserve
from kvsched.testing.registry import RESERVE

CONFIG = ReserveConfig(pages=3, keys=("a",))
KEYS = CONFIG.keys


def reachable() -> list[ReserveState]:
    explorer = ComponentExplorer(RESERVE, CONFIG, spec_reserve)
    result = explorer.run()
    assert result.complete and result.violation is None
    return explorer.states


def carried(state: ReserveState) -> bool:
    return all(invariant(state) for invariant in reserve_safety.CARRIED)


def _counts(state: ReserveState, page: int, count: int) -> ReserveState:
    refs = list(state.refs)
    refs[page] = count
    return replace(state, refs=tuple(refs))


CORRUPTIONS: dict[str, Callable[[ReserveState], Iterator[ReserveState]]] = {
    "a page twice on the queue": lambda s: (replace(s, queue=(*s.queue, page)) for page in s.queue[:1]),
    "a free page off the queue": lambda s: (replace(s, queue=s.queue[1:]) for _ in s.queue[:1]),
    "a held page on the queue": lambda s: (
        replace(s, queue=(*s.queue, page)) for page, count in enumerate(s.refs) if count and page not in s.reserved
    ),
    "the reserved page counted twice": lambda s: iter([_counts(s, 0, 2)]),
    "the reserved page named": lambda s: iter([replace(s, entries=(*s.entries, (KEYS[0], 0)))]),
    "a negative count": lambda s: (_counts(s, page, -1) for page in s.queue[:1]),
}


def test_the_model_agrees_on_every_reachable_state() -> None:
    states = reachable()
    assert len(states) == 50
    disagreeing = [state for state in states if reserve_safety.holds(state, KEYS) != carried(state)]
    assert not disagreeing, disagreeing[:3]
    assert all(carried(state) for state in states)


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_the_model_agrees_on_corrupted_states(corruption: str) -> None:
    corrupted = [bad for state in reachable()[:40] for bad in CORRUPTIONS[corruption](state)]
    assert corrupted, "the corruption applies to some state"
    for state in corrupted:
        assert not carried(state), state  # the corruption breaks a carried invariant...
        assert not reserve_safety.holds(state, KEYS), state  # ...and the model sees it
