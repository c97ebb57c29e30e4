"""The KV groups' z3 model (`kvsched.proofs.group_safety`): its proofs print their verdicts, and
its invariant is tied to the spec's: on every reachable state of a small layout and on corrupted
ones, it holds exactly when the spec invariants it carries do (every count is its holders across
the groups and the cache; the free stack is exactly the unheld pages, never the null page), and
it also rejects a table naming another group's page."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from kvsched.proofs import group_safety
from kvsched.proofs.component_explorer import ComponentExplorer
from kvsched.spec.kv_groups import NULL, GroupState, tables_hold_their_tokens
from kvsched.spec.step import apply
from kvsched.testing.components.groups import SMALL_CHUNKED, spec_groups
from kvsched.testing.group_variants import VARIANTS
from kvsched.testing.registry import GROUPS
from tests.impl.test_kv_groups import EVICTED, PINNED


def test_the_proofs_print_their_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    assert group_safety.main() == 0
    printed = capsys.readouterr().out
    assert printed.count("proved") == 5 and printed.count("refuted") == 4


@functools.cache
def reachable() -> list[GroupState]:
    explorer = ComponentExplorer(GROUPS, SMALL_CHUNKED, spec_groups)
    result = explorer.run()
    assert result.complete and result.violation is None
    return explorer.states


def carried(state: GroupState) -> bool:
    return all(invariant(state) for invariant in group_safety.CARRIED)


def _counted(state: GroupState, page: int, by: int) -> GroupState:
    refs = list(state.refs)
    refs[page] += by
    return replace(state, refs=tuple(refs))


CORRUPTIONS: dict[str, Callable[[GroupState], Iterator[GroupState]]] = {
    "a page counted once more": lambda s: (_counted(s, page, 1) for page, n in enumerate(s.refs) if n),
    "a held page on the free stack": lambda s: (replace(s, free=(*s.free, page)) for page, n in enumerate(s.refs) if n),
    "a free page off the free stack": lambda s: (replace(s, free=s.free[1:]) for _ in s.free[:1]),
    "the null page on the free stack": lambda s: (replace(s, free=(*s.free, NULL)) for _ in (1,)),
}


def test_the_model_agrees_on_every_reachable_state() -> None:
    states = reachable()
    assert len(states) == 712
    assert all(group_safety.holds(state) and carried(state) for state in states)


def test_the_model_rejects_every_corruption() -> None:
    states = reachable()
    for name, corrupt in CORRUPTIONS.items():
        corrupted = [bad for state in states for bad in corrupt(state)][:40]
        assert corrupted, name
        assert all(not carried(bad) and not group_safety.holds(bad) for bad in corrupted), name


def test_the_model_rejects_a_table_naming_another_groups_page() -> None:
    """A window table handed the full group's page (vLLM PR #50457's shape): the spec's content
    check and the model's ownership both reject it, though every count is right."""

    groups = VARIANTS["vllm_50457_hit_from_the_first_full_group"](PINNED)
    for event in EVICTED[:-1]:
        apply(groups, event)
    state = groups.to_spec()
    assert carried(state) and not tables_hold_their_tokens(state)
    assert not group_safety.holds(state)
