"""kvsched's reserve answers what vLLM's own `BlockPool` answers, call for call, without vLLM.

`golden/vllm_0.32.0_block_pool.json` holds traces of vLLM 0.32.0's real `KVCacheManager` over
its own pool, recorded by `devtools/vllm/record_traces.py` in the reserve's alphabet (what
`KvschedBlockPool` maps each pool call to): the blocks each allocation handed out, the page each
lookup found, the keys each removal dropped, each reset's verdict, and after each call vLLM's free
queue and counts. Replayed on the spec's reserve and impl's, every answer and every state must
be vLLM's; the wrong reserves must not be.
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
from kvsched.spec import reserve as spec
from kvsched.spec.errors import CacheInUse, Exhausted

GOLDEN = json.loads((Path(__file__).parent / "golden" / "vllm_0.32.0_block_pool.json").read_text())
TRACES: list[list[list[Any]]] = GOLDEN["traces"]


class Mismatch(AssertionError):
    """The reserve answered otherwise than vLLM."""


def state_of(reserve: Any) -> tuple[tuple[int, ...], list[int]]:
    if isinstance(reserve, spec.Reserve):
        return reserve.state.queue, list(reserve.state.refs)
    return tuple(reserve.queue), list(reserve.refs)


def replay(trace: list[list[Any]], make: Callable[[int], Any]) -> int:
    """Replay one trace; the number of calls checked."""
    reserve = make(trace[0][1])
    checked = 0
    for step, (verb, *args) in enumerate(trace[1:], start=1):
        where = f"call {step} ({verb} {args})"
        if verb == "allocate":
            n, vllm_pages = args
            try:
                pages = list(reserve.allocate(n))
            except Exhausted:
                pages = None
            if pages != vllm_pages:
                raise Mismatch(f"{where}: kvsched handed out {pages}")
        elif verb == "touch":
            reserve.touch(args[0])
        elif verb == "free":
            reserve.free(args[0])
        elif verb == "register":
            reserve.register(args[0], args[1])
        elif verb == "forget":
            page, vllm_keys = args
            if sorted(reserve.forget(page)) != vllm_keys:
                raise Mismatch(f"{where}: kvsched's keys differ")
        elif verb == "lookup":
            key, vllm_page = args
            if reserve.lookup(key) != vllm_page:
                raise Mismatch(f"{where}: kvsched found {reserve.lookup(key)}")
        elif verb == "reset":
            try:
                reserve.reset()
                done = True
            except CacheInUse:
                done = False
            if done != args[0]:
                raise Mismatch(f"{where}: kvsched's reset {'succeeded' if done else 'was refused'}")
        elif verb == "state":
            queue, counts = state_of(reserve)
            if list(queue) != args[0] or counts[1:] != args[1]:
                raise Mismatch(f"{where}: kvsched's queue {list(queue)} counts {counts[1:]}")
        else:
            raise AssertionError(f"unknown verb {verb}")
        checked += 1
    return checked


def same(reserve: spec.Reserve, pages: int) -> spec.Reserve:
    return reserve


MAKERS: dict[str, Callable[[int], Any]] = {"spec": spec.Reserve, "impl": ImplReserve}


def test_the_traces_cover_what_the_pool_does() -> None:
    """Hits, evictions of parked pages and revivals by a hit all occur (vLLM checks the free
    count before it allocates, so refusals never reach its pool: the lockstep test has those)."""
    verbs = {entry[0] for trace in TRACES for entry in trace}
    assert verbs >= {"allocate", "touch", "free", "register", "lookup", "reset", "state"}
    assert sum(entry[0] == "lookup" and entry[2] is not None for trace in TRACES for entry in trace) > 20
    evicted = revived = 0
    for trace in TRACES:
        reserve = spec.Reserve(trace[0][1])
        for verb, *args in trace[1:]:
            if verb == "allocate" and args[1] is not None:
                evicted += sum(reserve.is_cached(page) for page in args[1])
            if verb == "touch":
                revived += len(reserve.touch(args[0]))
                continue
            replay([["pool", 0], [verb, *args]], functools.partial(same, reserve))
    assert evicted > 10 and revived > 10


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_the_reserve_answers_what_vllm_answers(name: str) -> None:
    checked = sum(replay(trace, MAKERS[name]) for trace in TRACES)
    assert checked == sum(len(trace) - 1 for trace in TRACES)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_wrong_reserve_does_not(name: str) -> None:
    wrong = VARIANTS[name]
    mismatched = 0
    for trace in TRACES:
        try:
            replay(trace, wrong)
        except Mismatch:
            mismatched += 1
    assert mismatched > 0
