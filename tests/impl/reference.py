"""Reference semantics of impl's batched operations, in terms of the spec's single calls.

These are what the spec will grow (the batched operations are impl API beyond seed A): a batch
is the sequence of single `ensure_writable` calls, all or nothing, raising the first failing
call's error.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsched import spec
from kvsched.spec.errors import InvalidArgument, KvschedError
from kvsched.spec.pool import CopyOnWrite


def ensure_writable_batch(
    scheduler: spec.RequestScheduler,
    pool: spec.BlockPool,
    request_ids: Sequence[object],
    logical_pages: Sequence[object],
) -> tuple[CopyOnWrite, ...]:
    """`scheduler.ensure_writable(request_ids[i], logical_pages[i], pool)` for every i, all or nothing."""
    if len(request_ids) != len(logical_pages):
        raise InvalidArgument(f"{len(request_ids)} request ids but {len(logical_pages)} logical pages")
    before = scheduler.state, pool.state
    actions = []
    try:
        for request_id, logical_page in zip(request_ids, logical_pages, strict=True):
            actions.append(scheduler.ensure_writable(request_id, logical_page, pool))  # type: ignore[arg-type]
    except KvschedError:
        scheduler.commit(before[0])
        pool.commit(before[1])
        raise
    return tuple(actions)
