"""A checkpoint of impl's pool, prefix store and scheduler: taken before an engine step, restored
exactly if the step fails (the engine's atomicity over a model call that raised).

It copies each object's storage, arrays and indexes alike (of the pool's free stack, the live
part below its top); restoring writes the arrays back in place (the objects keep their buffers,
so views handed out stay views of them) and reinstates the indexes. This module knows the
classes' storage, as `kvsched.impl.refinement` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from kvsched.impl.pool import BlockPool
from kvsched.impl.prefix import PrefixKvStore
from kvsched.impl.scheduler import RequestScheduler

_STORE_ARRAYS = ("_pages", "_page_counts", "_token_counts", "_last_used")
_STORE_FIELDS = ("_next_victim", "_clock")


@dataclass(slots=True)
class Checkpoint:
    """Copies of everything the three objects hold."""

    pool: tuple[np.ndarray[Any, Any], ...]
    slots: tuple[np.ndarray[Any, Any], ...]
    scheduler: tuple[dict[int, int], list[int], int]
    store_arrays: tuple[np.ndarray[Any, Any], ...]
    store_indexes: tuple[list[Any], dict[Any, int], list[int]]
    store_fields: tuple[int, ...]

    @property
    def slot_states(self) -> np.ndarray[Any, Any]:
        """The scheduler's slot states when the checkpoint was taken."""
        return self.slots[1]


def save(
    pool: BlockPool, store: PrefixKvStore, scheduler: RequestScheduler, into: Checkpoint | None = None
) -> Checkpoint:
    """A checkpoint of the three objects; `into` (an earlier checkpoint of the same objects) has
    its buffers reused, so a checkpoint taken every step allocates no arrays. Only the live part
    of the free stack is kept: the entries at and above its top are never read."""
    top = int(pool._top[0])
    if into is None:
        saved_pool: tuple[np.ndarray[Any, Any], ...] = (pool._refs.copy(), np.empty_like(pool._free), pool._top.copy())
        slots = tuple(array.copy() for array in scheduler._slots)
        store_arrays = tuple(cast(np.ndarray[Any, Any], getattr(store, name)).copy() for name in _STORE_ARRAYS)
    else:
        saved_pool, slots, store_arrays = into.pool, into.slots, into.store_arrays
        np.copyto(saved_pool[0], pool._refs)
        np.copyto(saved_pool[2], pool._top)
        for buffer, array in zip(slots, scheduler._slots, strict=True):
            np.copyto(buffer, cast(np.ndarray[Any, Any], array))
        for buffer, name in zip(store_arrays, _STORE_ARRAYS, strict=True):
            np.copyto(buffer, cast(np.ndarray[Any, Any], getattr(store, name)))
    np.copyto(saved_pool[1][:top], pool._free[:top])
    return Checkpoint(
        pool=saved_pool,
        slots=slots,
        scheduler=(dict(scheduler._slot_of), list(scheduler._empty), scheduler._decoding),
        store_arrays=store_arrays,
        store_indexes=(list(store._identities), dict(store._index), list(store._empty)),
        store_fields=tuple(getattr(store, name) for name in _STORE_FIELDS),
    )


def restore(checkpoint: Checkpoint, pool: BlockPool, store: PrefixKvStore, scheduler: RequestScheduler) -> None:
    """Put the three objects back exactly as `checkpoint` found them."""
    refs, free, top = checkpoint.pool
    np.copyto(pool._refs, refs)
    live = int(top[0])
    pool._free[:live] = free[:live]
    np.copyto(pool._top, top)
    for array, saved in zip(scheduler._slots, checkpoint.slots, strict=True):
        np.copyto(cast(np.ndarray[Any, Any], array), saved)
    slot_of, empty, decoding = checkpoint.scheduler
    scheduler._slot_of, scheduler._empty, scheduler._decoding = dict(slot_of), list(empty), decoding
    for name, saved in zip(_STORE_ARRAYS, checkpoint.store_arrays, strict=True):
        np.copyto(cast(np.ndarray[Any, Any], getattr(store, name)), saved)
    identities, index, entries = checkpoint.store_indexes
    store._identities, store._index, store._empty = list(identities), dict(index), list(entries)
    for name, value in zip(_STORE_FIELDS, checkpoint.store_fields, strict=True):
        setattr(store, name, value)
