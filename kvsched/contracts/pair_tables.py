"""Table pairs for `crosshair diffbehavior`: prefix installs into a standalone table, and batched
copy-on-write, on a spec system and on an impl system, compared by result (or error type and
message) and abstract state.

These reach impl paths a request's life alone does not: installing a page list that goes bad
part-way (an id out of range, not an int, past 64 bits) after earlier pages were retained, and
batches that copy a page three owners share, copy twice, or copy and then fail (the copy undone).
Every pair bounds its own inputs (diffbehavior ignores preconditions): outside the domain both
return None.
"""

from __future__ import annotations

from typing import Any

from kvsched.contracts.support import first, in_range, observe, play
from kvsched.spec import events as ev
from kvsched.spec.events import Event
from kvsched.testing.impl_system import impl_system
from kvsched.testing.system import SystemConfig, SystemUnderTest, spec_system

Outcome = tuple[Any, ...] | None
PAGE_CODES: tuple[object, ...] = (0, 1, 2, 6, -1, "1", 2**64)  # 6 = the pool's size: out of range
CONFIG = SystemConfig(requests=3, logical_pages=2, physical_pages=6, store_entries=1, store_pages=2, max_references=4)


def install_program(system: SystemUnderTest, extras: tuple[int, int, int], codes: tuple[int, ...]) -> Outcome:
    """Pages 0..2 with `extras[p]` outside holds each (0: free), then one install of the pages
    `PAGE_CODES[c]` for each code into an empty 2-entry standalone table: all of them or none."""
    setup: list[Event] = [ev.NewTable(2), ev.Allocate(), ev.Allocate(), ev.Allocate()]
    for page, count in enumerate(extras):
        setup += [ev.Retain(page) for _ in range(count - 1)] + ([ev.Release(page)] if count == 0 else [])
    play(system, setup)
    return observe(system, ev.TableInstall(0, tuple(PAGE_CODES[code] for code in codes)))


def _install_domain(e0: int, e1: int, e2: int, c0: int, c1: int, c2: int, count: int) -> bool:
    return in_range(e0, e1, e2, high=3) & in_range(c0, c1, c2, high=len(PAGE_CODES) - 1) & in_range(count, high=3)


def spec_install(e0: int, e1: int, e2: int, c0: int, c1: int, c2: int, count: int) -> Outcome:
    """`install_program` on the spec."""
    if not _install_domain(e0, e1, e2, c0, c1, c2, count):
        return None
    return install_program(spec_system(CONFIG), (e0, e1, e2), first(count, c0, c1, c2))


def impl_install(e0: int, e1: int, e2: int, c0: int, c1: int, c2: int, count: int) -> Outcome:
    """`install_program` on impl."""
    if not _install_domain(e0, e1, e2, c0, c1, c2, count):
        return None
    return install_program(impl_system(CONFIG), (e0, e1, e2), first(count, c0, c1, c2))


REQUEST_CODES = (10, 11, 12, 99, -1)  # three live requests, an unknown one, an invalid one


def batch_program(system: SystemUnderTest, forks: int, held: int, steps: tuple[int, ...], prepare: bool) -> Outcome:
    """Request 10 writes logical page 0 (and 1 when `held`), `forks` children share its pages,
    the producer takes `held` pages; then one `ensure_writable_batch` over the steps (pairs of
    a `REQUEST_CODES` index and a logical page) or, with `prepare`, every request decodes and
    one `prepare_decode_round(pool, 1)`: each step's action, all or nothing."""
    setup: list[Event] = [ev.Admit(10, None), ev.EnsureWritable(10, 0)]
    setup += [ev.EnsureWritable(10, 1)] if held else []
    setup += [ev.Fork(10, child) for child in range(11, 11 + forks)]
    setup += [ev.Allocate() for _ in range(held)]
    if prepare:
        for request_id in range(10, 11 + forks):
            setup += [ev.RecordToken(request_id), ev.MarkPrefillComplete(request_id)]
        play(system, setup)
        return observe(system, ev.PrepareDecodeRound(1))
    play(system, setup)
    ids = tuple(REQUEST_CODES[code] for code in steps[::2])
    return observe(system, ev.EnsureWritableBatch(ids, tuple(steps[1::2])))


def _batch_domain(forks: int, held: int, steps: tuple[int, ...], prepare: bool) -> bool:
    codes_ok = in_range(*steps[::2], high=len(REQUEST_CODES) - 1) & in_range(*steps[1::2], low=-1, high=2)
    return in_range(forks, high=2) & in_range(held, high=4) & codes_ok


def spec_batch(forks: int, held: int, r0: int, l0: int, r1: int, l1: int, r2: int, l2: int, prepare: bool) -> Outcome:
    """`batch_program` on the spec."""
    steps = (r0, l0, r1, l1, r2, l2)
    if not _batch_domain(forks, held, steps, prepare):
        return None
    return batch_program(spec_system(CONFIG), forks, held, steps, prepare)


def impl_batch(forks: int, held: int, r0: int, l0: int, r1: int, l1: int, r2: int, l2: int, prepare: bool) -> Outcome:
    """`batch_program` on impl."""
    steps = (r0, l0, r1, l1, r2, l2)
    if not _batch_domain(forks, held, steps, prepare):
        return None
    return batch_program(impl_system(CONFIG), forks, held, steps, prepare)


# Concrete inputs inside each pair's domain (see `kvsched.contracts.launch`): installs that go
# bad on a later page (out of range, not an int, past 64 bits, free); batches that copy a page
# three requests share, copy twice, copy and then run out of pages, and a decode round's batch.
SAMPLES: dict[str, tuple[tuple[int, ...], ...]] = {
    "install": (
        (1, 1, 1, 0, 1, 0, 2),
        (1, 2, 0, 0, 3, 0, 2),
        (1, 1, 0, 1, 5, 0, 2),
        (2, 1, 1, 0, 6, 0, 2),
        (1, 0, 1, 0, 1, 0, 2),
        (3, 3, 3, 0, 1, 2, 3),
    ),
    "batch": (
        (2, 0, 0, 0, 1, 0, 2, 0, 0),
        (2, 2, 0, 0, 1, 0, 2, 0, 0),
        (1, 3, 0, 0, 0, 1, 1, 0, 0),
        (1, 0, 1, 0, 3, 0, 0, 0, 0),
        (2, 0, 0, 0, 0, 0, 0, 0, 1),
        (2, 3, 0, 0, 0, 0, 0, 0, 1),
    ),
}
