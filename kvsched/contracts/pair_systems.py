"""System pairs for `crosshair diffbehavior`: one short program of public calls, run on a spec
system and on an impl system, compared by result (or error type *and message*) and by abstract
state after every call.

impl keeps its state in numpy arrays, so CrossHair concretizes an int once it enters an array
and then tests that concrete case; the programs are short and the domains small, so a few
seconds cover many of them. Every pair bounds its own inputs (diffbehavior ignores
preconditions): outside the domain both return None.
"""

from __future__ import annotations

from typing import Any

from kvsched.contracts.support import ORDERS, PAGES, identity, in_range, mask_pages, observe, play
from kvsched.impl.engine import Engine
from kvsched.impl.null_model import NullModel
from kvsched.spec import events as ev
from kvsched.spec.engine import Engine as SpecEngine
from kvsched.spec.engine_config import EngineConfig, EngineRequest
from kvsched.spec.events import Event
from kvsched.spec.model import NULL_VOCAB
from kvsched.spec.model import NullModel as SpecNullModel
from kvsched.testing.backends import FAULTS, HarnessBackend
from kvsched.testing.impl_system import impl_system
from kvsched.testing.outcome import capture
from kvsched.testing.system import SystemConfig, SystemUnderTest, spec_system

CONFIG = SystemConfig(
    requests=2, logical_pages=2, physical_pages=PAGES, store_entries=2, store_pages=2, max_references=4, page_size=2
)
Outcome = tuple[Any, ...] | None


def _pool_domain(e0: int, e1: int, e2: int, order: int, operation: int, page: int) -> bool:
    held = in_range(e0, e1, e2, high=CONFIG.max_references)  # up to the maximum: a retain can overflow
    return held & in_range(order, high=5) & in_range(operation, high=2) & in_range(page, low=-1, high=PAGES)


def pool_program(
    system: SystemUnderTest, extras: tuple[int, int, int], order: int, operation: int, page: int
) -> Outcome:
    """Hold `extras[p]` references on page p (the free stack ordered by `order`), then one
    operation: 0 allocate, 1 retain(page), 2 release(page), 3 writable(page, None for -1)
    (the `pool` pair runs 0..2, the `writable` pair 3)."""
    setup: list[Event] = [ev.Allocate() for _ in range(PAGES)]
    setup += [ev.Retain(held) for held, count in enumerate(extras) for _ in range(count - 1)]
    setup += [ev.Release(freed) for freed in ORDERS[order] if extras[freed] == 0]
    play(system, setup)
    events = (ev.Allocate(), ev.Retain(page), ev.Release(page), ev.Writable(None if page < 0 else page))
    return observe(system, events[operation])


def spec_pool(e0: int, e1: int, e2: int, order: int, operation: int, page: int) -> Outcome:
    """`pool_program` on the spec."""
    if not _pool_domain(e0, e1, e2, order, operation, page):
        return None
    return pool_program(spec_system(CONFIG), (e0, e1, e2), order, operation, page)


def impl_pool(e0: int, e1: int, e2: int, order: int, operation: int, page: int) -> Outcome:
    """`pool_program` on impl."""
    if not _pool_domain(e0, e1, e2, order, operation, page):
        return None
    return pool_program(impl_system(CONFIG), (e0, e1, e2), order, operation, page)


def _writable_domain(e0: int, e1: int, e2: int, order: int, page: int) -> bool:
    return in_range(e0, e1, e2, high=3) & in_range(order, high=5) & in_range(page, low=-1, high=PAGES)


def spec_writable(e0: int, e1: int, e2: int, order: int, page: int) -> Outcome:
    """`pool_program`'s copy-on-write step on the spec: its own pair, so every path CrossHair
    explores reaches `writable` (shared, exclusive, free, out-of-range and None pages, with the
    pool exhausted or not)."""
    if not _writable_domain(e0, e1, e2, order, page):
        return None
    return pool_program(spec_system(CONFIG), (e0, e1, e2), order, 3, page)


def impl_writable(e0: int, e1: int, e2: int, order: int, page: int) -> Outcome:
    """`pool_program`'s copy-on-write step on impl."""
    if not _writable_domain(e0, e1, e2, order, page):
        return None
    return pool_program(impl_system(CONFIG), (e0, e1, e2), order, 3, page)


def _store_domain(a_mask: int, b_mask: int, c_mask: int, e0: int, e1: int, e2: int, target: int) -> bool:
    return in_range(a_mask, b_mask, c_mask, high=7) & in_range(e0, e1, e2, high=1) & in_range(target, low=-1, high=4)


def store_program(
    system: SystemUnderTest, masks: tuple[int, int, int], extras: tuple[int, int, int], attach: bool, target: int
) -> Outcome:
    """The producer allocates every page and publishes prefixes 0, 1, 2 (their masks' pages; a
    third set replaces a victim); request 1 attaches prefix 0 when `attach`; the producer keeps
    page p only when `extras[p]`; then `reclaim(target)`. Every call's outcome."""
    play(system, [ev.Allocate() for _ in range(PAGES)])
    steps: list[Event] = [ev.Publish(identity(i), mask_pages(mask), 3) for i, mask in enumerate(masks) if mask]
    steps += [ev.Admit(1, identity(0))] if attach else []
    trace = [observe(system, event) for event in steps]
    play(system, [ev.Release(page) for page, keep in enumerate(extras) if not keep])
    trace.append(observe(system, ev.Reclaim(target)))
    return tuple(trace)


def spec_store(a_mask: int, b_mask: int, c_mask: int, e0: int, e1: int, e2: int, attach: bool, target: int) -> Outcome:
    """`store_program` on the spec."""
    if not _store_domain(a_mask, b_mask, c_mask, e0, e1, e2, target):
        return None
    return store_program(spec_system(CONFIG), (a_mask, b_mask, c_mask), (e0, e1, e2), attach, target)


def impl_store(a_mask: int, b_mask: int, c_mask: int, e0: int, e1: int, e2: int, attach: bool, target: int) -> Outcome:
    """`store_program` on impl."""
    if not _store_domain(a_mask, b_mask, c_mask, e0, e1, e2, target):
        return None
    return store_program(impl_system(CONFIG), (a_mask, b_mask, c_mask), (e0, e1, e2), attach, target)


def _event(operation: int, request_id: int) -> Event:
    events: tuple[Event, ...] = (
        ev.Admit(request_id, None),
        ev.Admit(request_id, identity(0)),
        ev.Finish(request_id),
        ev.Fork(request_id, request_id + 1),
        ev.EnsureWritable(request_id, 0),
        ev.Fork(request_id, -1),
        ev.SeedDecodeToken(request_id, 2**32),
    )
    return events[operation]


def _scheduler_domain(*steps: int) -> bool:
    return in_range(*steps[::2], high=6) & in_range(*steps[1::2], low=-1, high=3)


def scheduler_program(system: SystemUnderTest, steps: tuple[int, ...]) -> Outcome:
    """Prefix 0 is published on page 0 (one token), then each (operation, request id) step runs:
    0 admit, 1 admit with prefix 0, 2 finish, 3 fork into id + 1, 4 ensure_writable(id, 0),
    5 fork into the invalid id -1, 6 seed the out-of-range token 2**32 (errors compare by message)."""
    play(system, [ev.Allocate(), ev.Publish(identity(0), (0,), 1), ev.Release(0)])
    return tuple(observe(system, _event(op, arg)) for op, arg in zip(steps[::2], steps[1::2], strict=True))


def spec_scheduler(o0: int, a0: int, o1: int, a1: int, o2: int, a2: int, o3: int, a3: int) -> Outcome:
    """`scheduler_program` on the spec."""
    if not _scheduler_domain(o0, a0, o1, a1, o2, a2, o3, a3):
        return None
    return scheduler_program(spec_system(CONFIG), (o0, a0, o1, a1, o2, a2, o3, a3))


def impl_scheduler(o0: int, a0: int, o1: int, a1: int, o2: int, a2: int, o3: int, a3: int) -> Outcome:
    """`scheduler_program` on impl."""
    if not _scheduler_domain(o0, a0, o1, a1, o2, a2, o3, a3):
        return None
    return scheduler_program(impl_system(CONFIG), (o0, a0, o1, a1, o2, a2, o3, a3))


def _attach_domain(own: int, count: int, page0: int, page1: int) -> bool:
    return in_range(own, count, high=2) & in_range(page0, page1, low=-1, high=PAGES)


def attach_program(system: SystemUnderTest, own: int, pages: tuple[int, ...]) -> Outcome:
    """Request 1 computes two full pages (0 and 1); request 2 is admitted and counts `own`
    tokens of its own (0: none; 1: half a page, so nothing may follow; 2: a full page of its
    own, page 2); then `attach_pages(2, pages)`, the automatic prefix cache's hit."""
    setup: list[Event] = [ev.Admit(1, None), ev.EnsureWritable(1, 0), ev.EnsureWritable(1, 1), ev.RecordTokens(1, 4)]
    setup.append(ev.Admit(2, None))
    if own:
        setup += [ev.EnsureWritable(2, 0), ev.RecordTokens(2, own)]
    play(system, setup)
    return observe(system, ev.AttachPages(2, pages))


def spec_attach(own: int, count: int, page0: int, page1: int) -> Outcome:
    """`attach_program` on the spec, attaching the first `count` of (page0, page1)."""
    if not _attach_domain(own, count, page0, page1):
        return None
    return attach_program(spec_system(CONFIG), own, (page0, page1)[:count])


def impl_attach(own: int, count: int, page0: int, page1: int) -> Outcome:
    """`attach_program` on impl."""
    if not _attach_domain(own, count, page0, page1):
        return None
    return attach_program(impl_system(CONFIG), own, (page0, page1)[:count])


def _round_domain(token0: int, token1: int, fault: int) -> bool:
    return in_range(token0, token1, high=49) & in_range(fault, high=len(FAULTS) - 1)


def _buffers_domain(token0: int, token1: int, short: int) -> bool:
    return in_range(token0, token1, high=49) & in_range(short, low=1, high=3)


def round_program(
    system: SystemUnderTest,
    hits: tuple[bool, bool],
    seeds: tuple[bool, bool],
    tokens: tuple[int, int],
    fault: int,
    short: int,
) -> Outcome:
    """Requests 10 and 11 are admitted (a prefix hit decodes at once; a miss prefills one token
    first), seeded when `seeds[i]`, given a writable next page, and one decode round runs with
    backend fault `FAULTS[fault]` and, for `short` 1..3, one record too few in the items, tables
    or outputs buffer. The round's outcome, and the batch the backend saw."""
    setup: list[Event] = [ev.Allocate(), ev.Publish(identity(0), (0,), 1), ev.Release(0)]
    for index, request_id in enumerate((10, 11)):
        setup.append(ev.Admit(request_id, identity(0) if hits[index] else None))
        if not hits[index]:
            setup += [ev.EnsureWritable(request_id, 0), ev.RecordToken(request_id), ev.MarkPrefillComplete(request_id)]
        if seeds[index]:
            setup.append(ev.SeedDecodeToken(request_id, tokens[index]))
        setup.append(ev.EnsureWritable(request_id, 0))
    play(system, setup)
    backend = HarnessBackend(FAULTS[fault], CONFIG.page_size)
    outcome = observe(system, ev.DecodeRound(FAULTS[fault], ev.SHORT_BUFFERS[short - 1] if short else ""), backend)
    return outcome, backend.seen


def spec_round(hit0: bool, hit1: bool, seed0: bool, seed1: bool, token0: int, token1: int, fault: int) -> Outcome:
    """`round_program` on the spec, full buffers: the backend's faults (the `round_buffers` pair
    has the short buffers, which fail before the backend is called)."""
    if not _round_domain(token0, token1, fault):
        return None
    return round_program(spec_system(CONFIG), (hit0, hit1), (seed0, seed1), (token0, token1), fault, 0)


def impl_round(hit0: bool, hit1: bool, seed0: bool, seed1: bool, token0: int, token1: int, fault: int) -> Outcome:
    """`round_program` on impl, full buffers."""
    if not _round_domain(token0, token1, fault):
        return None
    return round_program(impl_system(CONFIG), (hit0, hit1), (seed0, seed1), (token0, token1), fault, 0)


def spec_round_buffers(
    hit0: bool, hit1: bool, seed0: bool, seed1: bool, token0: int, token1: int, short: int
) -> Outcome:
    """`round_program` on the spec with one buffer a record short (a well-behaved backend)."""
    if not _buffers_domain(token0, token1, short):
        return None
    return round_program(spec_system(CONFIG), (hit0, hit1), (seed0, seed1), (token0, token1), 0, short)


def impl_round_buffers(
    hit0: bool, hit1: bool, seed0: bool, seed1: bool, token0: int, token1: int, short: int
) -> Outcome:
    """`round_program` on impl with one buffer a record short."""
    if not _buffers_domain(token0, token1, short):
        return None
    return round_program(impl_system(CONFIG), (hit0, hit1), (seed0, seed1), (token0, token1), 0, short)


ENGINE = EngineConfig(
    requests=2,
    pages=4,
    page_size=2,
    logical_pages=3,
    max_batch_size=2,
    max_batched_tokens=4,
    chunk_size=4,
    prefill_reserve_pages=0,
    max_queue=2,
    max_seq_len=6,
    prefix_caching=True,
)


class FailingModel:
    """A model whose `fail_at`-th call raises (1-based; 0: none does)."""

    def __init__(self, inner: Any, fail_at: int) -> None:
        self.inner, self.fail_at, self.calls = inner, fail_at, 0

    def _call(self, name: str, *arguments: Any) -> Any:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("the model failed")
        return getattr(self.inner, name)(*arguments)

    def execute_ragged(self, items: Any, block_tables: Any, out: Any) -> Any:
        return self._call("execute_ragged", items, block_tables, out)

    def execute_prefill(self, items: Any) -> Any:
        return self._call("execute_prefill", items)

    def copy_pages(self, pairs: Any) -> Any:
        return self._call("copy_pages", pairs)


def _engine_domain(t0: int, t1: int, t2: int, new0: int, new1: int, eos: int, fail_at: int) -> bool:
    tokens = in_range(t0, t1, t2, high=3) & in_range(eos, high=NULL_VOCAB - 1)
    return tokens & in_range(new0, new1, low=1, high=3) & in_range(fail_at, high=4)


def engine_program(engine: Any, prompts: tuple[tuple[int, ...], ...], news: tuple[int, int], eos: int) -> Outcome:
    """Requests 1 and 2 (request 1 stops at token `eos` too) are submitted, then the engine steps
    until it has no work (at most 12 steps): each step's output or error, then the state."""
    engine.submit(EngineRequest(1, prompts[0], news[0], eos_token_id=eos))
    engine.submit(EngineRequest(2, prompts[1], news[1]))
    steps: list[Any] = []
    for _ in range(12):
        if not engine.has_work():
            break
        outcome = capture(engine.step)
        output = outcome.value
        if output is not None:
            output = (dict(output.tokens), output.finished, output.preempted, output.tokens_run, output.cache)
        steps += [(output, outcome.error, outcome.message), engine.state]
    return tuple(steps)


def spec_engine_step(t0: int, t1: int, t2: int, new0: int, new1: int, eos: int, fail_at: int) -> Outcome:
    """`engine_program` on the spec's engine, its `fail_at`-th model call failing (0: none; the
    first is the prefill, the next are decode-only steps): prompts (t0, t1) and (t0, t2), one
    page each, are the same page when t1 == t2 (a cache hit for the second request)."""
    if not _engine_domain(t0, t1, t2, new0, new1, eos, fail_at):
        return None
    model = FailingModel(SpecNullModel(), fail_at)
    return engine_program(SpecEngine(ENGINE, model), ((t0, t1), (t0, t2)), (new0, new1), eos)


def impl_engine_step(t0: int, t1: int, t2: int, new0: int, new1: int, eos: int, fail_at: int) -> Outcome:
    """`engine_program` on impl's engine (its decode-only steps plan, run and commit)."""
    if not _engine_domain(t0, t1, t2, new0, new1, eos, fail_at):
        return None
    model = FailingModel(NullModel(), fail_at)
    return engine_program(Engine(ENGINE, model), ((t0, t1), (t0, t2)), (new0, new1), eos)


# Concrete inputs inside each pair's domain: the gate runs them before CrossHair (both pairs
# must return a non-None, equal outcome; running them also compiles every kernel the programs
# reach before CrossHair's side-effect wall goes up), so no pair can pass vacuously.
SAMPLES: dict[str, tuple[tuple[int, ...], ...]] = {
    "pool": ((0, 1, 0, 2, 0, 0), (2, 0, 1, 1, 2, 0), (1, 0, 3, 4, 1, 2), (0, 0, 0, 3, 2, 1), (4, 0, 1, 2, 1, 0)),
    # shared with a free page (a copy), shared in an exhausted pool (refused), exclusive, None
    "writable": ((0, 1, 2, 5, 2), (1, 1, 2, 5, 2), (2, 1, 1, 0, 1), (1, 0, 2, 3, -1)),
    # overlapping idle entries (a page two entries share); two idle entries, room for one eviction
    "store": (
        (4, 2, 0, 0, 1, 0, 0, 2),
        (1, 2, 4, 0, 0, 0, 1, 3),
        (3, 0, 6, 1, 1, 1, 0, 1),
        (3, 6, 0, 0, 0, 0, 0, 2),
        (1, 2, 0, 0, 0, 0, 0, 2),
    ),
    "scheduler": (
        (0, 1, 1, 2, 2, 1, 0, 1),
        (1, 0, 3, 0, 4, 1, 4, 0),
        (0, 0, 0, 0, 1, 3, 0, 2),
        (0, 1, 5, 1, 6, 1, 3, 1),
    ),
    "round": (
        (1, 0, 1, 1, 3, 4, 0),
        (0, 1, 1, 0, 5, 6, 2),
        (1, 1, 1, 1, 7, 8, 5),
        (1, 1, 1, 1, 4, 9, 2),
        (0, 0, 1, 1, 2, 1, 4),
    ),
    "round_buffers": ((0, 1, 1, 0, 5, 6, 1), (0, 0, 1, 1, 1, 2, 3), (1, 1, 1, 1, 3, 4, 2), (1, 0, 0, 1, 0, 0, 3)),
    # a hit of both pages, a repeated page, after a half page, past the table, a free page
    "attach": ((0, 2, 0, 1), (0, 2, 1, 1), (1, 1, 0, 0), (2, 2, 0, 1), (0, 1, 2, 0)),
    # the prefill fails; the first and the second decode-only step fail (the round's new page
    # taken back); request 1 stops at EOS after its prefill, and after one decode
    "engine_step": (
        (1, 2, 0, 3, 2, 0, 1),
        (1, 2, 0, 3, 2, 0, 2),
        (0, 1, 1, 3, 3, 0, 3),
        (1, 2, 2, 3, 2, 70, 0),
        (1, 2, 0, 3, 3, 2185, 0),
    ),
}
