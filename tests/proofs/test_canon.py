"""Page symmetry: renaming pages maps reachable states, successors and canonical forms consistently.

The explorer merges states that differ by a permutation of page ids (canon.py). That is sound
only if the spec treats pages symmetrically and the canonical form depends on the class alone;
both are checked here on reachable states (random walks through the explorer's alphabet at the
issue's sizes) with random permutations, using a renaming written independently of canon.py.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.proofs.canon import Canonicalizer
from kvsched.proofs.explorer import Explorer, attempt
from kvsched.proofs.operations import Bounds, alphabet, rename, static_alphabet
from kvsched.proofs.subject import SPEC, Positioner, snapshot
from kvsched.spec.events import Event
from kvsched.spec.invariants import check_invariants
from kvsched.spec.prefix import StoreState
from kvsched.spec.slots import SchedulerState
from kvsched.spec.system import SystemState

ISSUE = Bounds(requests=3, pages=5, logical_pages=3, entries=2, entry_pages=2)
STATIC = static_alphabet(ISSUE)
CANON = Canonicalizer(ISSUE)
SYSTEM = Positioner(SPEC, ISSUE.config())


def permute_pages(state: SystemState, perm: dict[int, int]) -> SystemState:
    """`state` with page p renamed perm[p] everywhere (pages outside the pool kept)."""

    def page(value: int) -> int:
        return perm.get(value, value)

    inverse = {new: old for old, new in perm.items()}
    refs = tuple(state.pool.refs[inverse[index]] for index in range(len(state.pool.refs)))
    pool = replace(state.pool, refs=refs, free=tuple(page(p) for p in state.pool.free))
    slots = tuple(
        replace(slot, table=tuple(None if entry is None else page(entry) for entry in slot.table))
        for slot in state.scheduler.slots
    )
    entries = tuple(
        None
        if entry is None
        else replace(entry, page_set=replace(entry.page_set, pages=tuple(page(p) for p in entry.page_set.pages)))
        for entry in state.store.entries
    )
    store = StoreState(entries, state.store.page_capacity, state.store.next_victim, state.store.clock)
    external = tuple(sorted(page(p) for p in state.external))
    return SystemState(pool, store, SchedulerState(slots), external)


def walk(choices: list[int]) -> list[SystemState]:
    """The states of a walk from the initial state, in the system's own (uncanonical) names.

    Each choice picks an operation; most fail from most states, so the walk takes the first
    one from there on (cyclically) that changes the state.
    """
    state = snapshot(SYSTEM.fresh(), ())
    states = [state]
    for choice in choices:
        ops = alphabet(state, ISSUE, STATIC)
        for offset in range(len(ops)):
            operation = ops[(choice + offset) % len(ops)]
            outcome, post = attempt(operation, SYSTEM.at(state), state, ISSUE)
            if outcome.error is None and post != state:
                state = post
                break
        states.append(state)
    return states


def step(state: SystemState, event: Event) -> tuple[str, object, SystemState]:
    """Returned or raised, the error type (results and messages name pages, so only their kind
    is compared), and the post-state."""
    outcome, post = attempt(event, SYSTEM.at(state), state, ISSUE)
    return outcome.summary(results=False)[0], outcome.error, post


PERMUTATIONS = st.permutations(range(ISSUE.pages)).map(lambda order: dict(enumerate(order)))
WALKS = st.lists(st.integers(0, 10**6), min_size=1, max_size=40)


@settings(max_examples=40, deadline=None)
@given(choices=WALKS, perm=PERMUTATIONS, seed=st.integers(0, 2**16))
def test_page_renaming_commutes_with_every_operation(choices: list[int], perm: dict[int, int], seed: int) -> None:
    pick = random.Random(seed)
    for state in walk(choices)[-4:]:
        image = permute_pages(state, perm)
        assert check_invariants(image) == check_invariants(state) == ()
        for operation in pick.sample(STATIC, 40) + alphabet(state, ISSUE, ())[-2:]:
            kind, detail, post = step(state, operation)
            image_kind, image_detail, image_post = step(image, rename(operation, {}, {}, perm))
            assert (image_kind, image_detail) == (kind, detail), operation
            assert image_post == permute_pages(post, perm), operation


@settings(max_examples=60, deadline=None)
@given(choices=WALKS, perm=PERMUTATIONS)
def test_a_page_renamed_state_has_the_same_canonical_form(choices: list[int], perm: dict[int, int]) -> None:
    for state in walk(choices):
        image = permute_pages(state, perm)
        canonical, _ = CANON.canonical(state)
        assert CANON.canonical(image)[0] == canonical
        assert CANON.canonical(canonical)[0] == canonical  # canonical forms are fixed points
        assert check_invariants(image) == check_invariants(canonical) == check_invariants(state)


@settings(max_examples=30, deadline=None)
@given(choices=WALKS, seed=st.integers(0, 2**16))
def test_a_canonical_operation_renamed_back_reaches_the_same_class(choices: list[int], seed: int) -> None:
    # the explorer's contract: run canonical `o` from the canonical state, or `o` renamed into
    # the state's own names from the state itself, and land in the same class
    pick = random.Random(seed)
    state = walk(choices)[-1]
    canonical, renaming = CANON.canonical(state)
    back = renaming.inverse()
    for operation in pick.sample(STATIC, 60) + alphabet(canonical, ISSUE, ())[-2:]:
        real = rename(operation, back.ids, back.identities, back.pages)
        kind, detail, post = step(state, real)
        canonical_kind, canonical_detail, canonical_post = step(canonical, operation)
        assert (kind, detail) == (canonical_kind, canonical_detail), (operation, real)
        assert CANON.canonical(post)[0] == CANON.canonical(canonical_post)[0], (operation, real)


def test_page_renaming_merges_the_explored_states() -> None:
    # every explored state is canonical, and no two explored states are page renamings of each other
    explorer = Explorer(replace(ISSUE, max_depth=4))
    explorer.run()
    rng = random.Random(7)
    for state in explorer.states[::7]:
        order = list(range(ISSUE.pages))
        rng.shuffle(order)
        image = permute_pages(state, dict(enumerate(order)))
        assert explorer.lookup(image) == explorer.lookup(state) is not None
        assert explorer.states[explorer.lookup(image) or 0] == state
