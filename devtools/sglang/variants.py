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

    def _claim(self, node: Any, need: int) -> Any:
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
    program: tuple[str, ...]  # the shrunk counterexample a campaign found (pages=8), pinned


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
        machine = SafetyMachine(variant.factory, pages=8, page_size=variant.page_size)
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
            examples=args.examples,
            pages=8,
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
