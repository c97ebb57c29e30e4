"""A checkpoint of impl's pool, prefix store and scheduler: taken before an engine step, restored
exactly if the step fails (the engine's atomicity over a model call that raised).

It copies each object's whole storage, arrays and indexes alike; restoring writes the arrays back
in place (the objects keep their buffers, so views handed out stay views of them) and reinstates
the indexes. This module knows the classes' storage, as `kvsched.impl.refinement` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from kvsched.impl.pool import BlockPool
from kvsched.impl.prefix import PrefixKvStore
from kvsched.impl.scheduler import RequestScheduler

_POOL_ARRAYS = ("_refs", "_free", "_top")
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


def save(pool: BlockPool, store: PrefixKvStore, scheduler: RequestScheduler) -> Checkpoint:
    """A checkpoint of the three objects."""
    return Checkpoint(
        pool=tuple(getattr(pool, name).copy() for name in _POOL_ARRAYS),
        slots=tuple(array.copy() for array in scheduler._slots),
        scheduler=(dict(scheduler._slot_of), list(scheduler._empty), scheduler._decoding),
        store_arrays=tuple(getattr(store, name).copy() for name in _STORE_ARRAYS),
        store_indexes=(list(store._identities), dict(store._index), list(store._empty)),
        store_fields=tuple(getattr(store, name) for name in _STORE_FIELDS),
    )


def restore(checkpoint: Checkpoint, pool: BlockPool, store: PrefixKvStore, scheduler: RequestScheduler) -> None:
    """Put the three objects back exactly as `checkpoint` found them."""
    for name, saved in zip(_POOL_ARRAYS, checkpoint.pool, strict=True):
        np.copyto(cast(np.ndarray[Any, Any], getattr(pool, name)), saved)
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
