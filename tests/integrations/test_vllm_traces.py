"""kvsched's reserve answers what vLLM's own `BlockPool` answers, call for call, without vLLM.

`golden/vllm_<release>_block_pool.json` holds, for each tested release (0.32.0, 0.33.0, 0.34.0),
traces of its real `KVCacheManager` over its own pool, recorded by
`devtools/vllm/record_traces.py` in the reserve's alphabet (what `KvschedBlockPool` maps each
pool call to): the blocks each allocation handed out, the page each lookup found, the keys each
removal dropped, each reset's verdict, and after each call vLLM's free queue and counts; 0.34's
include frees to the eviction end (`evict_first`). Replayed as the reserve's events
(`kvsched.spec.reserve_events`) through `apply` and the one step checker, on the spec's reserve
and impl's, every answer and every state must be that release's; the wrong reserves must not be.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devtools.vllm.variants import VARIANTS
from kvsched.impl.reserve import Reserve as ImplReserve
from kvsched.integrations.vllm import TESTED_VLLM
from kvsched.spec import reserve as spec
from kvsched.spec import reserve_events as rev
from kvsched.spec.errors import Exhausted
from kvsched.spec.step import apply
from kvsched.testing.checks import Outcome, capture, check_step
from kvsched.testing.registry import RESERVE

GOLDEN = Path(__file__).parent / "golden"
RELEASES: dict[str, list[list[list[Any]]]] = {
    release: json.loads((GOLDEN / f"vllm_{release}_block_pool.json").read_text())["traces"] for release in TESTED_VLLM
}
TRACES: list[list[list[Any]]] = [trace for traces in RELEASES.values() for trace in traces]


class Mismatch(AssertionError):
    """The reserve answered otherwise than vLLM."""


# Each recorded call as the reserve's event, and how vLLM's recorded answer reads the outcome.
EVENTS: dict[str, Callable[..., Any]] = {
    "allocate": lambda n, _: rev.TakePages(n),
    "touch": lambda pages: rev.Touch(tuple(pages)),
    "free": lambda pages: rev.FreePages(tuple(pages)),
    "free_evict_first": lambda pages: rev.FreeEvictFirst(tuple(pages)),
    "register": lambda key, page: rev.Register(key, page),
    "forget": lambda page, _: rev.Forget(page),
    "lookup": lambda key, _: rev.Lookup(key),
    "reset": lambda _: rev.ResetReserve(),
}
ANSWERS: dict[str, Callable[[Outcome], Any]] = {
    "allocate": lambda outcome: None if outcome.error is Exhausted else list(outcome.value),
    "forget": lambda outcome: sorted(outcome.value),
    "lookup": lambda outcome: outcome.value,
    "reset": lambda outcome: outcome.error is None,
}


def run(reserve: Any, event: Any) -> Outcome:
    return capture(lambda: apply(reserve, event))


def replay(trace: list[list[Any]], make: Callable[[int], Any]) -> int:
    """Replay one trace through `apply` and the step checker; the number of calls checked."""
    reserve = make(trace[0][1])
    checked = 0
    for step, (verb, *args) in enumerate(trace[1:], start=1):
        where = f"call {step} ({verb} {args})"
        if verb == "state":
            state = reserve.to_spec()
            if list(state.queue) != args[0] or list(state.refs[1:]) != args[1]:
                raise Mismatch(f"{where}: kvsched's queue {list(state.queue)} counts {list(state.refs[1:])}")
            checked += 1
            continue
        event = EVENTS[verb](*args)
        before = reserve.to_spec()
        outcome = run(reserve, event)
        failure = check_step(before, event, outcome, reserve.to_spec(), component=RESERVE)
        if failure is not None:
            raise AssertionError(f"{where}: {failure}")
        answer = ANSWERS.get(verb)
        if answer is not None and answer(outcome) != args[-1]:
            raise Mismatch(f"{where}: kvsched answered {answer(outcome)}")
        if answer is None and outcome.error is not None:
            raise Mismatch(f"{where}: kvsched refused ({outcome.summary()}), vLLM did not")
        checked += 1
    return checked


def same(reserve: spec.Reserve, pages: int) -> spec.Reserve:
    return reserve


MAKERS: dict[str, Callable[[int], Any]] = {"spec": spec.Reserve, "impl": ImplReserve}


@pytest.mark.parametrize("release", TESTED_VLLM)
def test_the_traces_cover_what_the_pool_does(release: str) -> None:
    """Hits, evictions of parked pages and revivals by a hit all occur in each release's traces,
    and frees to the eviction end in 0.34's (vLLM checks the free count before it allocates, so
    refusals never reach its pool: the lockstep test has those)."""
    traces = RELEASES[release]
    verbs = {entry[0] for trace in traces for entry in trace}
    assert verbs >= {"allocate", "touch", "free", "register", "lookup", "reset", "state"}
    assert ("free_evict_first" in verbs) == (release == "0.34.0")
    assert sum(entry[0] == "lookup" and entry[2] is not None for trace in traces for entry in trace) > 20
    evicted = revived = 0
    for trace in traces:
        reserve = spec.Reserve(trace[0][1])
        for verb, *args in trace[1:]:
            if verb == "allocate" and args[1] is not None:
                evicted += sum(reserve.is_cached(page) for page in args[1])
            if verb == "touch":
                revived += len(reserve.touch(args[0]))
                continue
            replay([["pool", 0], [verb, *args]], functools.partial(same, reserve))
    assert evicted > 10 and revived > 10


@pytest.mark.parametrize("release", TESTED_VLLM)
@pytest.mark.parametrize("name", sorted(MAKERS))
def test_the_reserve_answers_what_vllm_answers(name: str, release: str) -> None:
    traces = RELEASES[release]
    checked = sum(replay(trace, MAKERS[name]) for trace in traces)
    assert checked == sum(len(trace) - 1 for trace in traces)


# Where each wrong reserve shows: a plain free's order in every release, a free to the eviction
# end only where vLLM has one.
TOLD_APART_BY = {"NewestFirst": TESTED_VLLM, "DropHashOnFree": TESTED_VLLM, "EvictFirstParks": ("0.34.0",)}


@pytest.mark.parametrize(("name", "release"), [(name, release) for name in VARIANTS for release in TOLD_APART_BY[name]])
def test_a_wrong_reserve_does_not(name: str, release: str) -> None:
    wrong = VARIANTS[name]
    mismatched = 0
    for trace in RELEASES[release]:
        try:
            replay(trace, wrong)
        except Mismatch:
            mismatched += 1
    assert mismatched > 0
