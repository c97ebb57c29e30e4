"""The engine's KV events by hand, on spec and impl alike: a router's index fed every batch holds
exactly what the engine caches, on the device and the host, through evictions, demotions and a
reset; a router that drops a batch resynchronises from a snapshot; a restarted engine's new epoch
drops what the old one had; both flavours publish the same batches; bad names are refused."""

from __future__ import annotations

import contextlib
import io
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvsched import impl
from kvsched import spec as spec_flavour
from kvsched.events import HOST, Cleared, RouterIndex, Stored, Verdict, fold_events
from kvsched.spec import EngineRequest
from kvsched.spec.engine_config import salt_of
from kvsched.spec.engine_events import cached_entries
from kvsched.spec.errors import InvalidArgument
from kvsched.spec.page_keys import page_hash, page_keys
from kvsched.testing.engine_machine import events_failure
from kvsched.testing.outcome import FailureKind
from tests.engine.support import FLAVOURS
from tests.engine.test_host_tier import FIRST, HOSTED, OTHER, Copier, run


def keys_of(config: Any, request: EngineRequest) -> tuple[bytes, ...]:
    return page_keys(request.prompt, config.page_size, salt_of(config, request), page_hash(config.page_hash))


def serve(engine: Any, index: RouterIndex, *requests: EngineRequest) -> list[Verdict]:
    """Run `requests` to the end, every step's batch folded into `index` as engine e0's."""
    verdicts = []
    for request in requests:
        engine.submit(request)
    for _ in range(100):
        if not engine.has_work():
            break
        engine.step()
        batch = engine.take_events()
        if batch is not None:
            verdicts.append(index.fold("e0", batch))
    return verdicts


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_an_index_fed_every_batch_holds_what_the_engine_caches(flavour: Any) -> None:
    engine, index = flavour.Engine(HOSTED, Copier(flavour), name="e0"), RouterIndex()
    first = EngineRequest(1, FIRST, 1)
    verdicts = serve(engine, index, first, EngineRequest(2, OTHER, 1))  # the first's pages go to the host
    assert verdicts and set(verdicts) == {Verdict.FOLDED}
    view = index.to_spec().view("e0")
    assert view is not None and view.cached == cached_entries(engine.to_spec()).keys()
    assert any(tier == HOST for _, tier in view.cached)  # the demoted pages, published on the host
    keys = keys_of(HOSTED, first)
    assert index.longest_prefix("e0", keys) == len(keys) == 3  # from the host tier
    engine.reset_cache()
    batch = engine.take_events()
    assert batch is not None and batch.events == (Cleared(),)
    assert index.fold("e0", batch) is Verdict.FOLDED and index.longest_prefix("e0", keys) == 0
    assert engine.take_events() is None  # nothing changed since: no batch, no number used


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_router_that_missed_a_batch_resynchronises_from_a_snapshot(flavour: Any) -> None:
    engine, index = flavour.Engine(HOSTED, Copier(flavour), name="e0", epoch=3), RouterIndex()
    engine.submit(EngineRequest(1, FIRST, 1))
    batches = []
    for _ in range(6):
        engine.step()
        batch = engine.take_events()
        if batch is not None:
            batches.append(batch)
    assert len(batches) >= 2 and [batch.seq for batch in batches] == list(range(len(batches)))
    assert all(batch.epoch == 3 for batch in batches)
    assert index.fold("e0", batches[-1]) is Verdict.GAP  # heard from mid-stream
    assert index.longest_prefix("e0", keys_of(HOSTED, EngineRequest(1, FIRST, 1))) == 0
    assert index.resync("e0", engine.snapshot()) is Verdict.RESYNCED
    resynced = index.to_spec().view("e0")
    assert resynced is not None and resynced.cached == cached_entries(engine.to_spec()).keys()
    assert index.fold("e0", batches[-1]) is Verdict.DUPLICATE  # the snapshot had it


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_restarted_engine_publishes_a_new_epoch_from_nothing(flavour: Any) -> None:
    index = RouterIndex()
    serve(flavour.Engine(HOSTED, Copier(flavour), name="e0"), index, EngineRequest(1, FIRST, 1))
    restarted = flavour.Engine(HOSTED, Copier(flavour), name="e0", epoch=1)
    other = EngineRequest(2, (5, 5, 5, 5, 1), 1)
    verdicts = serve(restarted, index, other)
    assert verdicts[0] is Verdict.RESTARTED
    assert index.longest_prefix("e0", keys_of(HOSTED, EngineRequest(1, FIRST, 1))) == 0
    assert index.longest_prefix("e0", keys_of(HOSTED, other)) == 2


def test_both_flavours_publish_the_same_batches() -> None:
    engines = [flavour.Engine(HOSTED, Copier(flavour), name="e0") for flavour in (spec_flavour, impl)]
    requests = [EngineRequest(1, FIRST, 2), EngineRequest(2, OTHER, 1), EngineRequest(3, FIRST + (11,), 2)]
    published: list[list[Any]] = [[], []]
    for request in requests:
        for engine, batches in zip(engines, published, strict=True):
            run(engine, request)
            batches.append(engine.take_events())
    assert published[0] == published[1]
    stored = [event for batch in published[0] if batch for event in batch.events if isinstance(event, Stored)]
    assert [event.parent for event in stored[:3]] == [None, *(event.key for event in stored[:2])]  # a chain
    assert fold_events(frozenset(), [e for batch in published[0] if batch for e in batch.events]) is not None


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_bad_name_or_epoch_is_refused(flavour: Any) -> None:
    for name, epoch in (("", 0), (7, 0), ("e0", -1), ("e0", "1")):
        with pytest.raises(InvalidArgument):
            flavour.Engine(HOSTED, Copier(flavour), name=name, epoch=epoch)


def test_the_events_check_fails_a_batch_wrong_at_any_edge() -> None:
    """The engine machine's events check passes the engine's own batch and fails it with its last
    event dropped, a host store dropped, a parent changed or the wrong number."""
    engine = impl.Engine(HOSTED, Copier(impl), name="e0")
    run(engine, EngineRequest(1, FIRST, 1))
    run(engine, EngineRequest(2, OTHER, 1))
    after = engine.to_spec()
    batch = engine.take_events()
    assert batch is not None and any(isinstance(e, Stored) and e.tier == HOST for e in batch.events)
    assert events_failure(frozenset(), 0, batch, after, batch) is None
    host_store = next(i for i, e in enumerate(batch.events) if isinstance(e, Stored) and e.tier == HOST)
    deeper = next(i for i, e in enumerate(batch.events) if isinstance(e, Stored) and e.parent is not None)
    child = batch.events[deeper]
    assert isinstance(child, Stored)
    orphan = replace(child, parent=None)
    wrong = [
        replace(batch, events=batch.events[:-1]),
        replace(batch, events=batch.events[:host_store] + batch.events[host_store + 1 :]),
        replace(batch, events=(*batch.events[:deeper], orphan, *batch.events[deeper + 1 :])),
        replace(batch, seq=1),
    ]
    for broken in wrong:
        failure = events_failure(frozenset(), 0, broken, after, broken)
        assert failure is not None and failure.kind is FailureKind.EVENTS, broken
    failure = events_failure(frozenset(), 0, batch, after, wrong[0])
    assert failure is not None and failure.kind is FailureKind.LOCKSTEP


def test_the_events_pages_example_runs() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "events.md").read_text()
    block = page[page.index("```python\n") + len("```python\n") :]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block[: block.index("```")], "docs/events.md", "exec"), {})
    assert printed.getvalue().strip() == "('engine-0', 2)"
