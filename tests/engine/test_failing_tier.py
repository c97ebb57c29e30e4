"""A failing host tier degrades the engine, never stalls it; a step's copies start all or none.

By hand, on spec and impl alike: with every copy to the host failing, the request that needs the
pages finishes, each cached page tried once and then evicted (kvsched stalled here before
2026-12-06: 10,000 steps, 29,997 demotions, the request never served); one bad host page is
freed to the bottom of the free stack, so the next demotion gets another; and a step whose
`start_copies` raises started nothing and stands, each of its copies failed at once, so
cancelling the request it was admitting hands its pages to a newcomer that no late copy writes.
The liveness drains under a failing tier each fail an engine that stalls under it.
"""

from __future__ import annotations

from collections.abc import Sequence
from copy import deepcopy
from dataclasses import replace
from typing import Any

import pytest

from kvsched import impl
from kvsched.impl.host_tier import HostTier
from kvsched.spec import EngineRequest
from kvsched.spec.model import HostCopy
from kvsched.testing.engine_liveness import drained
from kvsched.testing.engine_model import BAD_PAGE, FAILING, WORKING, HarnessModel
from kvsched.testing.engine_variants import complete_to_the_top, wants_refused_pages
from tests.engine.support import FLAVOURS
from tests.engine.test_host_tier import FIRST, HOSTED, OTHER, Copier, run


class Backend(Copier):
    """The flavour's null model as an asynchronous backend: `fail_host(host page)` says which
    copies fail, and `refuse` makes the next `start_copies` raise, starting none."""

    def __init__(self, flavour: Any, fail_host: Any = lambda page: False) -> None:
        super().__init__(flavour, self.reported)
        self.fail_host, self.refuse = fail_host, False
        self.attempts: list[tuple[list[HostCopy], list[HostCopy]]] = []
        self.host_page: dict[int, int] = {}  # transfer id -> the host page it reads or writes

    def start_copies(self, to_device: Sequence[HostCopy], to_host: Sequence[HostCopy]) -> None:
        self.attempts.append((list(to_device), list(to_host)))
        if self.refuse:
            self.refuse = False
            raise RuntimeError("the copy engine is busy")
        super().start_copies(to_device, to_host)
        self.host_page.update({copy.transfer_id: copy.source for copy in to_device})
        self.host_page.update({copy.transfer_id: copy.destination for copy in to_host})

    def reported(self, ids: Sequence[int]) -> list[bool]:
        return [not self.fail_host(self.host_page[transfer_id]) for transfer_id in ids]


def demotions(model: Backend) -> list[HostCopy]:
    return [copy for _, to_host in model.attempts for copy in to_host]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_with_every_copy_to_the_host_failing_the_request_is_served(flavour: Any) -> None:
    model = Backend(flavour, fail_host=lambda page: True)
    engine = flavour.Engine(HOSTED, model)
    run(engine, EngineRequest(1, FIRST, 1))
    cached = len(engine.to_spec().system.cache.pages)
    tokens = run(engine, EngineRequest(2, OTHER, 1), steps=30)
    assert not engine.has_work() and len(tokens[2]) == 1
    pages = [copy.source for copy in demotions(model)]
    assert pages and len(pages) == len(set(pages)) <= cached  # each cached page tried once, then evicted
    assert not engine.to_spec().host.cache


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_bad_host_page_goes_to_the_bottom_of_the_free_stack(flavour: Any) -> None:
    model = Backend(flavour, fail_host=lambda page: page == 0)
    engine = flavour.Engine(HOSTED, model)
    run(engine, EngineRequest(1, FIRST, 1))
    run(engine, EngineRequest(2, OTHER, 1))
    written = [copy.destination for copy in demotions(model)]
    assert written[0] == 0 and 0 not in written[1:]  # the first demotion failed; no other took page 0
    host = engine.to_spec().host
    assert host.free[0] == 0 and host.stats.failed == 1
    assert {entry.page for entry in host.cache} == set(written[1:])  # the other demotions completed


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_step_whose_copies_fail_to_start_stands_and_fails_them(flavour: Any) -> None:
    """`start_copies` raises having started none: the step that committed stands, each of its
    new copies fails at once (the promotion's request is preempted, to recompute; the demotion's
    host page is freed), and no copy the engine let go of runs, so a newcomer after a cancel gets
    its own tokens."""
    model = Backend(flavour)
    engine = flavour.Engine(replace(HOSTED, prefill_reserve_pages=4), model)
    run(engine, EngineRequest(1, FIRST, 1))
    run(engine, EngineRequest(2, OTHER, 1))
    engine.submit(EngineRequest(3, FIRST + (11,), 2))
    model.refuse = True
    before = engine.to_spec()
    output = engine.step()
    to_device, to_host = model.attempts[-1]
    assert to_device and to_host  # it asked for promotions and demotions at once, and got neither
    started = {copy.transfer_id for copy in [*to_device, *to_host]}
    after = engine.to_spec()
    assert output.preempted == (3,) and output.host.failed == len(started)  # every copy failed at once
    assert not started & {copy.transfer_id for copy in after.host.copies}
    assert after.host.issued == before.host.issued + len(started) and not model.host_page.keys() & started
    model.refuse = False
    engine.cancel(3)  # its pages are free, and no copy will land on them
    newcomer = (4, 4, 3, 3, 2, 2, 1)
    tokens = run(engine, EngineRequest(4, newcomer, 3))
    plain = replace(HOSTED, host_pages=0, prefix_caching=False)
    alone = run(type(engine)(plain, type(model.inner)()), EngineRequest(4, newcomer, 3))
    assert tokens[4] == alone[4]


def test_each_failing_tier_drain_fails_an_engine_that_stalls_under_it() -> None:
    """The liveness checks can fail: the drain with every copy failing stalls an engine that
    demotes a failed page again (`failed_demotion_retried`); the drain with one bad host page
    stalls one that also frees the failed host page to the top of the stack, straight back to the
    retry. The correct engine drains under both; either habit alone still drains the bad page
    (a refused page is evicted; a retry from the bottom of the stack gets a good page)."""
    retried = {"wants": wants_refused_pages}
    to_the_top = {"complete": complete_to_the_top}
    stalls = {  # host tier methods -> the drains it stalls under
        (): set(),
        ("wants",): {FAILING},
        ("complete",): set(),
        ("complete", "wants"): {FAILING, BAD_PAGE},
    }
    for methods, expected in stalls.items():
        overrides = {name: seam for name, seam in (retried | to_the_top).items() if name in methods}
        engine = impl.Engine(HOSTED, HarnessModel(HOSTED.page_size))
        engine.host.__class__ = type("Host", (HostTier,), {**overrides, "__slots__": ()})
        run(engine, EngineRequest(1, FIRST, 1))
        engine.submit(EngineRequest(2, OTHER, 1))
        stalled = {tier for tier in (WORKING, FAILING, BAD_PAGE) if drained(deepcopy(engine), 60, tier) is not None}
        assert stalled == expected, methods
