"""Leases: an asynchronous reader (a connector's save, a disaggregated send) holds pages.

    take  hold `pages` (one reference each) under the least unused lease id: they are never
          handed to another owner until the lease ends, whatever happens to the request whose
          pages they were
    end   the reader has read its pages: it lets go (`UnknownLease` for an id not held)

The leases are `work.leases` (in id order); their pages are among the system's `external`
holds. No step changes them.
"""

from __future__ import annotations

from kvsched.spec import pool as pool_ops
from kvsched.spec import refusals
from kvsched.spec.domain import as_int
from kvsched.spec.engine_state import Leased
from kvsched.spec.engine_work import Work


def take(work: Work, pages: tuple[int, ...]) -> int:
    """A lease on `pages`: its id."""
    pool = work.pool.state
    for page in pages:
        pool = pool_ops.retain(pool, page)
    work.pool.commit(pool)
    ids = {lease.lease_id for lease in work.leases}
    lease_id = next(number for number in range(len(ids) + 1) if number not in ids)
    work.leases = tuple(sorted((*work.leases, Leased(lease_id, pages)), key=lambda lease: lease.lease_id))
    return lease_id


def end(work: Work, lease_id: int) -> None:
    """End lease `lease_id`: its pages' references are let go."""
    number = as_int(lease_id)
    lease = next((lease for lease in work.leases if lease.lease_id == number), None)
    if lease is None:
        raise refusals.unknown_lease(lease_id)
    pool = work.pool.state
    for page in lease.pages:
        pool = pool_ops.release(pool, page)
    work.pool.commit(pool)
    work.leases = tuple(other for other in work.leases if other is not lease)
