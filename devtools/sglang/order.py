"""SGLang's eviction and free orders, as it documents them, checked on its own classes through the
adapter (a step of `make sglang`).

Eviction (`evict_policy.py`: the leaf with the lowest priority goes first):
    lru   least recently used: the oldest `last_access_time`
    mru   most recently used: the newest
    fifo  first created: the oldest `creation_time`
    filo  last created: the newest
    lfu   fewest hits (`hit_count`), then least recently used
Free order: `TokenToKVPoolAllocator.free` appends freed slots after the free ones (first freed,
first reused); `PagedTokenToKVPoolAllocator` puts freed pages before them (last freed, first reused).

Two prompts are published (A, then B), A is looked up again (a hit: accessed after B, created
before it), and a third admission needs exactly one leaf evicted: which prompt's pages left the
cache is the policy's answer.

    python -m devtools.sglang.order      (SGLang's venv; exit 1 on a difference)
"""

from __future__ import annotations

import sys
from array import array
from typing import Any

from kvsched.testing.adapter import tenant_of
from kvsched.testing.adapters.sglang import SglangRadixCache, sglang

A, B = (1, 1), (2, 2)
EVICTED = {"lru": B, "mru": A, "fifo": A, "filo": B, "lfu": B}


def evicted_by(policy: str) -> tuple[int, ...]:
    """The prompt whose pages the policy evicts first (page size 1, 5 usable slots)."""
    cache = SglangRadixCache(6, 1, paged=False, policy=policy)
    m = sglang()
    for request_id, prompt in ((1, A), (2, B)):
        cache.admit(request_id, prompt)
        cache.written(request_id, len(prompt))
        cache.free(request_id)  # published, unlocked: evictable
    salt = f"tenant-{tenant_of(1)}"  # A's namespace, as the adapter salts it
    cache.tree.match_prefix(m.MatchPrefixParams(key=m.RadixKey(array("q", A), salt)))  # A hit again
    before = cache.view().cached
    assert cache.admit(3, (3, 3, 3)) is not None  # 3 slots, 1 free: one 2-slot leaf evicted
    after = cache.view().cached
    gone: set[Any] = {key for page, key in before.items() if after.get(page) != key}
    (prompt,) = {key[1] for key in gone if len(key[1]) == 2}  # a key: (salt, the tokens to its end)
    return tuple(prompt)


def free_order(paged: bool) -> list[int]:
    """The pages a fresh allocator hands out after pages 1, 2 and 3 are taken and freed in that
    order, one at a time, the rest of the pool taken first."""
    cache = SglangRadixCache(5, 2 if paged else 1, paged=paged)
    allocator, size = cache.allocator, cache.page_size
    taken = [allocator.alloc(size) for _ in range(4)]  # every page: 1, 2, 3, 4
    for page in (1, 2, 3):
        allocator.free(taken[page - 1])
    return [int(allocator.alloc(size)[0]) // size for _ in range(3)]


def main() -> int:
    ok = True
    for policy, expected in EVICTED.items():
        evicted = evicted_by(policy)
        ok &= evicted == expected
        print(f"{policy}: evicts {'A' if evicted == A else 'B'} first (documented: {'A' if expected == A else 'B'})")
    for paged, order in ((False, [1, 2, 3]), (True, [3, 2, 1])):
        reused = free_order(paged)
        ok &= reused == order
        name = "PagedTokenToKVPoolAllocator" if paged else "TokenToKVPoolAllocator"
        print(f"{name}: pages freed 1, 2, 3 are reused as {reused} (documented: {order})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
