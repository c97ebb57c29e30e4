"""The engine's host tier and leases by hand, on spec and impl alike: the configuration and the
model it needs, a conversation that comes back from the host, a request waiting for its copies
(fork, publish and lease refused), a failed copy back (the request preempted and recomputed), a
model's malformed answer (the step fails and changes nothing), and leases (pages held through a
finish, freed by `end_lease`, bad ids refused with nothing changed)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from kvsched import impl, spec
from kvsched.spec import EngineRequest, InvalidConfig, PrefixIdentity
from kvsched.spec.errors import CopyPending, OutputIdentityMismatch, UnknownLease, UnknownRequest
from kvsched.spec.model import HostCopy
from tests.engine.support import FLAVOURS, SMALL

HOSTED = replace(SMALL, pages=6, prefix_caching=True, host_pages=8, prefill_reserve_pages=2)
FIRST = (1, 2, 3, 4, 5, 6, 7)  # three full pages and one token
OTHER = (9, 9, 8, 8, 7, 7, 6, 6, 5)  # the whole pool but a page: the first's cached pages go


class Copier:
    """The flavour's null model, its copies answered as `answer` says (None: every one done)."""

    def __init__(self, flavour: Any, answer: Any = None) -> None:
        self.inner, self.answer = flavour.NullModel(), answer
        self.issued: list[HostCopy] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def start_copies(self, to_device: Sequence[HostCopy], to_host: Sequence[HostCopy]) -> None:
        self.issued += [*to_device, *to_host]

    def copies_done(self, transfer_ids: Sequence[int]) -> Any:
        return [True] * len(transfer_ids) if self.answer is None else self.answer(transfer_ids)


def run(engine: Any, *requests: EngineRequest, steps: int = 100) -> dict[int, list[int]]:
    tokens: dict[int, list[int]] = {}
    for request in requests:
        engine.submit(request)
    for _ in range(steps):
        if not engine.has_work():
            break
        for request_id, new in engine.step().tokens.items():
            tokens.setdefault(request_id, []).extend(new)
    return tokens


def to_host_and_back(flavour: Any, model: Any) -> Any:
    """The first prompt computed and cached, pushed to the host by another, then asked again:
    stepped until it waits for its copies back."""
    engine = model.engine = flavour.Engine(HOSTED, model)
    run(engine, EngineRequest(1, FIRST, 1))
    run(engine, EngineRequest(2, OTHER, 1))
    engine.submit(EngineRequest(3, FIRST + (11,), 2))
    for _ in range(10):
        engine.step()
        if any(entry.waiting for entry in engine.to_spec().running):
            return engine
    raise AssertionError("request 3 never found its pages in the host tier")


def test_the_host_tier_needs_the_prefix_cache_and_a_model_that_copies() -> None:
    with pytest.raises(InvalidConfig, match="host_pages needs prefix_caching"):
        replace(SMALL, host_pages=4)
    with pytest.raises(InvalidConfig, match="host_pages must be an integer"):
        replace(HOSTED, host_pages=-1)

    class NoCopies:
        def copy_pages(self, pairs: Any) -> None: ...

    for flavour in (spec, impl):
        with pytest.raises(InvalidConfig, match="it has no start_copies"):
            flavour.Engine(HOSTED, NoCopies())


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_request_waits_for_its_copies_back_and_is_refused_meanwhile(flavour: Any) -> None:
    engine = to_host_and_back(flavour, Copier(flavour))
    engine.model.answer = lambda ids: [None] * len(ids)  # from now on, copies never end
    waiting = next(entry for entry in engine.to_spec().running if entry.request.request_id == 3)
    assert waiting.waiting and waiting.computed == 6  # three pages from the host, counted
    before = engine.to_spec()
    calls: list[tuple[str, tuple[Any, ...]]] = [
        ("fork", (3, 4)),
        ("publish", (3, 2, PrefixIdentity((1, 2, 0, 0)))),
        ("lease", (3,)),
    ]
    for name, arguments in calls:
        with pytest.raises(CopyPending, match="request 3 cannot read page"):
            getattr(engine, name)(*arguments)
        assert engine.to_spec() == before
    engine.step()
    assert engine.to_spec().running == before.running  # it computes nothing while it waits


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_failed_copy_back_preempts_its_request_which_recomputes(flavour: Any) -> None:
    failed: set[int] = set()

    def fail_while_3_waits(ids: Sequence[int]) -> list[bool]:
        """Every copy asked about while request 3 waits fails, once; then every copy completes."""
        running = model.engine.to_spec().running
        waits = 3 in {entry.request.request_id for entry in running if entry.waiting}
        answers = [not (waits and transfer_id not in failed) for transfer_id in ids]
        failed.update(ids if waits else ())
        return answers

    model = Copier(flavour, fail_while_3_waits)
    engine = to_host_and_back(flavour, model)
    plain = replace(HOSTED, host_pages=0, prefix_caching=False)
    alone = run(flavour.Engine(plain, flavour.NullModel()), EngineRequest(3, FIRST + (11,), 2))
    preempted: list[int] = []
    tokens: dict[int, list[int]] = {}
    while engine.has_work():
        output = engine.step()
        preempted += output.preempted
        for request_id, new in output.tokens.items():
            tokens.setdefault(request_id, []).extend(new)
    assert 3 in preempted and tokens[3] == alone[3]
    assert not engine.to_spec().host.copies


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize(
    "answer", [lambda ids: [1] * len(ids), lambda ids: [True] * (len(ids) + 1), lambda ids: "yes", lambda ids: 3]
)
def test_a_malformed_answer_about_copies_fails_the_step_and_changes_nothing(flavour: Any, answer: Any) -> None:
    engine = to_host_and_back(flavour, Copier(flavour))
    assert engine.to_spec().host.copies
    engine.model.answer = answer
    before = engine.to_spec()
    with pytest.raises(OutputIdentityMismatch, match="copies_done answered"):
        engine.step()
    assert engine.to_spec() == before


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_lease_holds_its_pages_through_a_finish_until_it_ends(flavour: Any) -> None:
    engine = flavour.Engine(replace(SMALL, pages=6), flavour.NullModel())
    engine.submit(EngineRequest(1, (1, 2, 3, 4, 5), 3))
    for _ in range(3):
        engine.step()
    running = engine.to_spec().running[0]
    lease = engine.lease(1)
    pages = engine.to_spec().leases[0].pages
    assert lease == 0 and len(pages) == -(-running.computed // SMALL.page_size)
    run(engine)  # request 1 finishes
    state = engine.to_spec()
    assert all(state.system.pool.refs[page] == 1 for page in pages) and state.system.external == tuple(sorted(pages))
    for bad in (True, "0", 7, -1, None):
        with pytest.raises(UnknownLease, match="no lease"):
            engine.end_lease(bad)
        assert engine.to_spec() == state
    with pytest.raises(UnknownRequest):
        engine.lease(1)
    engine.end_lease(0)
    assert all(count == 0 for count in engine.to_spec().system.pool.refs)


def found_by_the_machine(state: Any) -> None:
    """A program the engine machine found (host shape, random seed): request 1 is preempted, the
    prefix it named is dropped, and readmitted it hits a cached page that an idle published
    prefix also holds. Relief then refused to reclaim that prefix (the page the admission keeps
    was not counted as the cache's), so request 1 waited forever: LIVENESS at teardown."""
    base = {"base": (3, 1, 4, 1, 5, 9, 2, 6), "eos": None, "prefix": 0}
    every = {"copies": (1,)}
    state.submit(max_new_tokens=7, priority=0, request_id=2, shared=2, tail=(0, 0), tenant=1, **base)
    state.steps(count=6, **every)
    state.submit(max_new_tokens=3, priority=0, request_id=3, shared=5, tail=(0, 0), tenant=1, **base)
    state.fork(child=0, pick=0)
    state.publish(pick=0, tokens=6)
    state.steps(count=2, **every)
    state.submit(max_new_tokens=5, priority=1, request_id=1, shared=5, tail=(), tenant=0, **base)
    state.steps(count=13, **every)
    state.submit_after_published(max_new_tokens=4, pick=0, request_id=1, tail=())
    state.lease(pick=0)
    state.publish(pick=0, tokens=7)
    state.steps(count=6, **every)
    state.teardown()


@pytest.mark.parametrize("lockstep", [False, True], ids=["spec-alone", "impl-lockstep"])
def test_an_idle_prefix_holding_an_admissions_hit_is_reclaimed_for_it(lockstep: bool) -> None:
    from kvsched.testing.engine_machine import SHAPES, engine_machine, spec_engine

    machine = engine_machine(config=SHAPES["host"]) if lockstep else engine_machine(spec_engine, None, SHAPES["host"])
    found_by_the_machine(machine())
