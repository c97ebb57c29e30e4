"""Deliberately wrong reserves: `make vllm` runs vLLM's own tests over each and requires them to
fail, and the lockstep test requires the spec to tell each apart.

Select one for the pytest plugin with `KVSCHED_VLLM_RESERVE=variants:NAME` (this folder on
`PYTHONPATH`).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsched.impl.reserve import Reserve
from kvsched.spec.reserve import Freed


class NewestFirst(Reserve):
    """Parks a freed cached page at the front: the newest parked page is evicted first."""

    def free(self, pages: Sequence[int]) -> Freed:
        freed = super().free(pages)
        for page in reversed(freed.back):
            self.queue.move_to_end(page, last=False)
        return Freed((*freed.back, *freed.front), ())


class DropHashOnFree(Reserve):
    """Forgets a page's keys when its last holder frees it: nothing freed can be hit again."""

    def free(self, pages: Sequence[int]) -> Freed:
        freed = super().free(pages)
        for page in freed.front + freed.back:
            self.forget(page)
        return freed


class EvictFirstParks(Reserve):
    """Frees to the eviction end as a plain free does: a cached page whose content another tier
    holds is parked at the back, behind pages only this pool holds (an override that drops vLLM
    0.34's `evict_first` keyword)."""

    def free_evict_first(self, pages: Sequence[int]) -> Freed:
        return self.free(pages)


VARIANTS = {"NewestFirst": NewestFirst, "DropHashOnFree": DropHashOnFree, "EvictFirstParks": EvictFirstParks}
