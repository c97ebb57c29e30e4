"""Broken SGLang caches and adapters, each a factory for the safety harness and the check that
must catch it (`make sglang` runs a campaign on each and fails unless that check fails it).

- `duplicates_left_in_table`: mini-sglang PR #142's shape. Publication inserts the request's
  pages, and the tree frees the request's copies of pages it already had, but the request's row
  is not repointed at the tree's: it still maps the freed pages (a use after free).
- `evicts_before_locking`: admission evicts for the new tokens before it locks the matched
  prefix, so eviction may take the very pages the request is about to read.
- `dummy_page_handed_out`: an allocator whose free list starts at page 0, SGLang's dummy.
- `tenant_salt_dropped`: requests of every tenant share one namespace (no `extra_key`), so a
  prefix hit serves one tenant the KV another computed.
- the same over `UnifiedRadixCache`: `unified_evicts_before_locking` and `unified_salt_dropped`
  (the Python tree core), `unified_rust_evicts_before_locking` and `unified_rust_dummy_page` (the
  Rust one): every adapter `make sglang` runs has a broken variant of its own.
- `window_slides_past_its_query`: SGLang's all-SWA radix cache (prefill-aware) whose window
  slide frees one position more than its window leaves behind: the oldest position the next
  query reads (`GHOST`).
- over SGLang's hybrid cache (`UnifiedRadixCache` with full and SWA components, two pools:
  `kvsched.testing.adapters.sglang_hybrid`), on 16 pages: `hybrid_slides_past_its_query`, the same
  slide one position too far (`GHOST`); `tombstone_keeps_mapping`, SGLang PR #27586's shape: freeing
  a position's window KV leaves its full slot mapped to the SWA slot it gave back
  (`INVARIANT`: a free page a row still maps); `unlock_keeps_window_lock`, SGLang #24153's class: a
  release unlocks its tree lock's full part and never its window part (`LEAK`).
- over SGLang's Mamba cache (`UnifiedRadixCache` with full and Mamba components:
  `kvsched.testing.adapters.sglang_mamba`): `mamba_cow_skipped`, a hit whose snapshot is never
  named for the request's state (`GHOST`: it resumes from a fresh state), and the same over full,
  SWA and Mamba components (`swa_mamba_cow_skipped`); `mamba_cow_from_parent`, a copy-on-write from
  the snapshot of the node above the hit (`GHOST`: a state short of the hit's boundary, vLLM
  #53912's effect); `mamba_checkpoint_copy_leaked`, SGLang PR #29349's class, a checkpoint's copy
  the tree did not take never given back, and `mamba_state_kept_at_release`, a released state the
  tree did not take never freed (`LEAK` both).

`FOUND` are not deliberate: SGLang's own code, driven as its scheduler drives it, failing a check.
- `pure_swa_caches_slid_slots`: `PureSWARadixCache` for a model that is not prefill-aware. A
  decode's window slide frees the request's slots behind its window (`free_swa_out_of_window_slots`);
  at release, `checkpoint` inserts the whole row, freed slots included (its `key_limit` is set only
  by the prefill floor), so the tree caches slots the allocator hands out again, one slot under two
  keys when it is (`INVARIANT`). SGLang PR #31486 describes it (closed without merging).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsched.testing.adapters import sglang
from kvsched.testing.adapters.sglang import SglangRadixCache
from kvsched.testing.adapters.sglang_hybrid import SglangHybridCache
from kvsched.testing.adapters.sglang_mamba import SglangMambaCache, SglangSwaMambaCache
from kvsched.testing.adapters.sglang_window import SglangWindowCache, pure_swa
from kvsched.testing.checks import CheckFailed, CheckFailure, FailureKind
from kvsched.testing.safety import SafetyMachine
from kvsched.testing.safety_search import search_safety


def _duplicates_left_in_table() -> type:
    m = sglang.sglang()

    class DuplicatesLeftInTable(m.RadixCache):  # type: ignore[misc,name-defined]
        """SGLang's `checkpoint` without repointing the row at the tree's pages."""

        def checkpoint(self, req: Any, *, up_to: int) -> None:
            radix_key, _, _ = self._insert_cache(req, req.full_untruncated_fill_ids[:up_to], split_prompt=True)
            node = self.match_prefix(m.MatchPrefixParams(key=radix_key)).last_device_node
            req.kv.cache_protected_len = len(self.path_device_indices(node))  # the row is left as it was
            self.unlock(req.lock)
            req.lock = self.lock(node)
            req.last_node = node

    return DuplicatesLeftInTable


class EvictsBeforeLocking(SglangRadixCache):
    """The adapter's admission with the lock taken after eviction."""

    def _claim(self, node: Any, need: int, request: Any) -> Any:
        if not self._room(need) or not self.rows.available_size():
            return None
        self._evict_for(need)
        return self.tree.lock(node)


class SlidesPastItsQuery(SglangWindowCache):
    """The all-SWA adapter whose window slides as if one more position were computed."""

    def _slide(self, request_id: int, computed: int | None = None) -> None:
        super()._slide(request_id, len(self.requests[request_id]) + 1)


def window_slides_past_its_query(pages: int, page_size: int) -> SglangRadixCache:
    return SlidesPastItsQuery(pages, page_size, prefill_aware=True)


class HybridSlidesPastItsQuery(SglangHybridCache):
    """The hybrid adapter whose window slides as if one more position were computed."""

    def _slide(self, request_id: int, computed: int | None = None) -> None:
        super()._slide(request_id, len(self.requests[request_id]) + 1)


def hybrid_slides_past_its_query(pages: int, page_size: int) -> SglangRadixCache:
    return HybridSlidesPastItsQuery(pages, page_size)


class TombstoneKeepsMapping(SglangHybridCache):
    """SGLang PR #27586's shape: freeing a position's window KV (a slide, a tombstone) leaves its
    full slot mapped to the SWA slot it gave back."""

    def __init__(self, pages: int, page_size: int) -> None:
        super().__init__(pages, page_size)
        self.allocator.clear_full_to_swa_mapping = lambda full_indices: None


def tombstone_keeps_mapping(pages: int, page_size: int) -> SglangRadixCache:
    return TombstoneKeepsMapping(pages, page_size)


class UnlockKeepsWindowLock(SglangHybridCache):
    """SGLang #24153's class: a release unlocks the full part of its tree lock and never the window's."""

    def __init__(self, pages: int, page_size: int) -> None:
        super().__init__(pages, page_size)
        tree = self.tree
        tree.unlock = lambda lock: None if lock is None else tree.dec_lock_ref(lock.node, lock.receipt, skip_swa=True)


def unlock_keeps_window_lock(pages: int, page_size: int) -> SglangRadixCache:
    return UnlockKeepsWindowLock(pages, page_size)


def _dummy_page_allocator(paged: bool) -> type:
    m = sglang.sglang()
    base = m.PagedTokenToKVPoolAllocator if paged else m.TokenToKVPoolAllocator

    class DummyPageHandedOut(base):  # type: ignore[misc,valid-type]
        """A free list from page 0 (SGLang's starts at 1)."""

        def clear(self) -> None:
            super().clear()
            pages: Any = getattr(self, "free_pages")  # noqa: B009  (SGLang's, untyped here)
            setattr(self, "free_pages", m.torch.cat((m.torch.zeros(1, dtype=m.torch.int64), pages[:-1])))  # noqa: B010

    return DummyPageHandedOut


@dataclass(frozen=True)
class Variant:
    name: str
    factory: Callable[[int, int], SglangRadixCache]
    page_size: int
    caught_by: FailureKind
    program: tuple[str, ...]  # the shrunk counterexample a campaign found (over `pages`), pinned
    pages: int = 8  # the pool the pinned program and the campaign run on
    examples: int | None = None  # the campaign's programs, where the run's (--examples) find nothing


def duplicates_left_in_table(pages: int, page_size: int) -> SglangRadixCache:
    return SglangRadixCache(pages, page_size, paged=True, cache_class=_duplicates_left_in_table())


def evicts_before_locking(pages: int, page_size: int) -> SglangRadixCache:
    return EvictsBeforeLocking(pages, page_size, paged=False)


def dummy_page_handed_out(pages: int, page_size: int) -> SglangRadixCache:
    return SglangRadixCache(pages, page_size, paged=True, allocator_class=_dummy_page_allocator(True))


def tenant_salt_dropped(pages: int, page_size: int) -> SglangRadixCache:
    return SglangRadixCache(pages, page_size, paged=True, salted=False)


def unified_salt_dropped(pages: int, page_size: int) -> SglangRadixCache:
    return SglangRadixCache(pages, page_size, paged=True, salted=False, tree_core="python")


def unified_evicts_before_locking(pages: int, page_size: int) -> SglangRadixCache:
    return EvictsBeforeLocking(pages, page_size, paged=False, tree_core="python")


def unified_rust_evicts_before_locking(pages: int, page_size: int) -> SglangRadixCache:
    return EvictsBeforeLocking(pages, page_size, paged=False, tree_core="rust")


def unified_rust_dummy_page(pages: int, page_size: int) -> SglangRadixCache:
    return SglangRadixCache(pages, page_size, paged=True, tree_core="rust", allocator_class=_dummy_page_allocator(True))


EVICTS_BEFORE_LOCKING = (  # the program each such campaign shrank to
    "machine.submit(1, (0,))",
    "machine.finish(1)",
    "machine.submit(3, (2,))",
    "machine.submit(2, (1, 1, 2, 0))",
    "machine.submit(1, (0, 1, 0))",
)

# Request 2 (tenant 0) starts with the pages request 1 (tenant 1) computed: only the salt keeps them apart.
SALT_DROPPED = ("machine.submit(1, (0, 0))", "machine.decode(1)", "machine.decode(1)", "machine.submit(2, (0, 0, 1))")

VARIANTS: tuple[Variant, ...] = (
    Variant(
        "duplicates_left_in_table",
        duplicates_left_in_table,
        2,
        FailureKind.INVARIANT,
        ("machine.submit(1, (0, 0))", "machine.preempt(1)", "machine.resume(1)"),
    ),
    Variant("evicts_before_locking", evicts_before_locking, 1, FailureKind.INVARIANT, EVICTS_BEFORE_LOCKING),
    Variant("dummy_page_handed_out", dummy_page_handed_out, 2, FailureKind.INVARIANT, ()),
    Variant(
        "tenant_salt_dropped",
        tenant_salt_dropped,
        2,
        FailureKind.GHOST,
        SALT_DROPPED,
    ),
    # UnifiedRadixCache names nodes by id: locking one eviction took raises KeyError in SGLang.
    Variant(
        "unified_evicts_before_locking",
        unified_evicts_before_locking,
        1,
        FailureKind.UNTYPED,
        EVICTS_BEFORE_LOCKING,
    ),
    Variant(
        "unified_rust_evicts_before_locking",
        unified_rust_evicts_before_locking,
        1,
        FailureKind.UNTYPED,
        EVICTS_BEFORE_LOCKING,
    ),
    Variant("unified_rust_dummy_page", unified_rust_dummy_page, 2, FailureKind.INVARIANT, ()),
    Variant(
        "unified_salt_dropped",
        unified_salt_dropped,
        2,
        FailureKind.GHOST,
        SALT_DROPPED,
    ),
)


VARIANTS += (
    Variant(
        "window_slides_past_its_query",
        window_slides_past_its_query,
        1,
        FailureKind.GHOST,
        ("machine.submit(1, (0,))", *("machine.decode(1)",) * 5),
    ),
)


def skip_copy_on_write(cache: SglangMambaCache) -> SglangMambaCache:
    """A match that attaches a hit's prefix without naming its snapshot for the request's state:
    the request resumes from a fresh state."""
    cache.tree.components[cache.mamba_component].finalize_match_result_in_cache = lambda params, result: result
    return cache


def mamba_cow_skipped(pages: int, page_size: int) -> SglangRadixCache:
    return skip_copy_on_write(SglangMambaCache(pages, page_size))


def swa_mamba_cow_skipped(pages: int, page_size: int) -> SglangRadixCache:
    """The same in the tree with full, SWA and Mamba components."""
    return skip_copy_on_write(SglangSwaMambaCache(pages, page_size))


def mamba_cow_from_parent(pages: int, page_size: int) -> SglangRadixCache:
    """A hit's copy-on-write names the snapshot of the node above the one it matched, a state
    short of the hit's boundary (vLLM #53912's effect: a resumed state not at its key's tokens)."""
    cache = SglangMambaCache(pages, page_size)
    component = cache.tree.components[cache.mamba_component]
    finalize = component.finalize_match_result_in_cache

    def from_parent(params: Any, result: Any) -> Any:
        result = finalize(params, result)
        parent = cache.tree.tree_core.node_by_id(result.best_match_node).parent
        above = None if parent is None else parent.component_data[cache.mamba_component].value
        if params.req is not None and params.req.kv.mamba_cow_src_index is not None and above is not None:
            params.req.kv.mamba_cow_src_index = above[0]
        return result

    component.finalize_match_result_in_cache = from_parent
    return cache


def cleanup_skipped(finished: bool) -> Callable[[int, int], SglangRadixCache]:
    """The Mamba cache whose cleanup after caching a request lets no state slot go for a finished
    request (`finished`: a released state the tree did not take, as it had one there) or for a
    running one (a checkpoint's copy the tree did not take: SGLang PR #29349's class)."""

    def factory(pages: int, page_size: int) -> SglangRadixCache:
        cache = SglangMambaCache(pages, page_size)
        component = cache.tree.components[cache.mamba_component]
        cleanup = component.cleanup_after_caching_req

        def skipping(req: Any, is_finished: bool, *args: Any, **kwargs: Any) -> None:
            if is_finished != finished:
                cleanup(req, is_finished, *args, **kwargs)
            elif not finished:
                req.kv.mamba_last_track_seqlen = req.kv.mamba_prev_track_seqlen = None

        component.cleanup_after_caching_req = skipping
        return cache

    return factory


mamba_checkpoint_copy_leaked = cleanup_skipped(finished=False)
mamba_state_kept_at_release = cleanup_skipped(finished=True)


HYBRID_PAGES = 16  # two pools of 7 slots: a request outgrows its window before the pools run out
VARIANTS += (
    Variant(
        "hybrid_slides_past_its_query",
        hybrid_slides_past_its_query,
        1,
        FailureKind.GHOST,
        ("machine.submit(1, (0,))", *("machine.decode(1)",) * 3),
        HYBRID_PAGES,
    ),
    # the publish frees the prompt's first position from the window: its mapping stays, its slot is free
    Variant(
        "tombstone_keeps_mapping",
        tombstone_keeps_mapping,
        1,
        FailureKind.INVARIANT,
        ("machine.submit(1, (0, 1, 2, 0))",),
        HYBRID_PAGES,
    ),
    Variant(
        "unlock_keeps_window_lock",
        unlock_keeps_window_lock,
        1,
        FailureKind.LEAK,
        ("machine.submit(1, (0,))", "machine.teardown()"),
        HYBRID_PAGES,
    ),
)
VARIANTS += (
    Variant(
        "mamba_cow_skipped",
        mamba_cow_skipped,
        1,
        FailureKind.GHOST,
        ("machine.submit(1, (0,))", "machine.submit(3, (0, 1))"),
    ),
    Variant(
        "mamba_cow_from_parent",
        mamba_cow_from_parent,
        1,
        FailureKind.GHOST,
        (
            "machine.submit(1, (0,))",
            *("machine.decode(1)",) * 2,
            "machine.preempt(1)",
            "machine.submit(3, (0, 1))",
            "machine.resume(1)",
        ),
        examples=3000,  # a node above the hit must hold a snapshot of its own: 300 programs find none
    ),
    Variant(
        "mamba_checkpoint_copy_leaked",
        mamba_checkpoint_copy_leaked,
        1,
        FailureKind.LEAK,
        ("machine.submit(3, (0,))", "machine.submit(1, (0,))", "machine.teardown()"),
    ),
    Variant(
        "swa_mamba_cow_skipped",
        swa_mamba_cow_skipped,
        1,
        FailureKind.GHOST,
        ("machine.submit(1, (0,))", "machine.submit(3, (0, 1))"),
        HYBRID_PAGES,
    ),
    Variant(
        "mamba_state_kept_at_release",
        mamba_state_kept_at_release,
        1,
        FailureKind.LEAK,
        ("machine.submit(1, (0,))", "machine.teardown()"),
    ),
)
FOUND = (  # SGLang's own code failing a check (the module docstring)
    Variant(
        "pure_swa_caches_slid_slots",
        pure_swa,
        1,
        FailureKind.INVARIANT,
        ("machine.submit(2, (0,))", *("machine.decode(2)",) * 5, "machine.finish(2)", "machine.submit(1, (0,))"),
    ),
)


def pinned(variant: Variant) -> CheckFailure | None:
    """The variant's pinned program over a fresh manager: the check it fails, or None."""
    try:
        machine = SafetyMachine(variant.factory, pages=variant.pages, page_size=variant.page_size)
        for line in variant.program:
            exec(line, {"machine": machine})  # the pinned program
        machine.teardown()
    except CheckFailed as failed:
        return failed.failure
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="each broken SGLang variant must fail with its check")
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for variant in VARIANTS + FOUND:
        found = pinned(variant)
        campaign = search_safety(
            variant.factory,
            examples=variant.examples or args.examples,
            pages=variant.pages,
            page_size=variant.page_size,
            source=("devtools.sglang.variants", variant.name),
        )
        row = {
            "variant": variant.name,
            "expected": variant.caught_by.name,
            "pinned": None if found is None else found.kind.name,
            "campaign": None if campaign.failure is None else campaign.failure.kind.name,
            "programs": campaign.programs,
            "detail": None if campaign.failure is None else campaign.failure.detail,
        }
        row["caught"] = row["pinned"] == row["campaign"] == row["expected"]
        rows.append(row)
        print(
            f"{variant.name}: pinned {row['pinned']}, campaign {row['campaign']} after {campaign.programs} programs"
            f" (expected {row['expected']}): {'caught' if row['caught'] else 'NOT CAUGHT'}",
            file=sys.stderr,
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(row["caught"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
