"""Broken KV groups, one per hybrid-KV bug engines shipped in 2026, each impl's `KvGroups` with
the one mistake the upstream bug made, written as an override of one of its seams (or of the
one call the bug sits in).

Each is caught by a named check on a pinned program (`tests/impl/test_kv_groups.py`, a test named
after the upstream bug), and the explorer tells each apart from the spec.
"""

from __future__ import annotations

from kvsched.impl.kv_groups import KvGroups, Request
from kvsched.spec.domain import require_int
from kvsched.spec.kv_groups import ATTENTION, NULL, Full, Tokens


class FreeLosesGroupOrder(KvGroups):
    """vLLM #48489: the deferred-free path loses the per-group eviction order. A freed request's
    groups let their pages go last group first, so the cache's eviction order is not the spec's."""

    def _freed_tables(self, held: Request) -> list[list[int]]:
        return held.tables[::-1]


class HitFromTheFirstFullGroup(KvGroups):
    """vLLM PR #50457: the hybrid coordinator takes the hit from one full-attention group and
    reuses its blocks for the others. A group that cannot serve the prefix is handed the first
    full group's pages for it."""

    def _group_hit(self, index: int, tokens: Tokens, length: int) -> list[int] | None:
        found = super()._group_hit(index, tokens, length)
        first = next(g for g, group in enumerate(self.layout.groups) if isinstance(group, Full))
        if found is None and index != first and not self.recurrent[index]:
            return super()._group_hit(first, tokens, length)
        return found


class DrafterLeftOutOfTheHit(KvGroups):
    """vLLM PR #47926: prefix-restored tokens have no draft KV: the drafter reads KV never written
    for them. The hit asks every group but the drafter's (the last attention group), which is
    handed the target's pages."""

    def _group_hit(self, index: int, tokens: Tokens, length: int) -> list[int] | None:
        found = super()._group_hit(index, tokens, length)
        attention = [g for g, group in enumerate(self.layout.groups) if isinstance(group, ATTENTION)]
        if found is None and index == attention[-1] and len(attention) > 1:
            return super()._group_hit(attention[0], tokens, length)
        return found


class SnapshotOffItsBoundary(KvGroups):
    """vLLM #53912 / PR #47861: prefix caching with MTP corrupts hybrid Mamba/GDN output: the
    state cached is not the state at the hash boundary. A state is snapshotted with drafts
    pending (it has consumed them) under the accepted tokens' key."""

    def _snapshots_now(self, held: Request) -> bool:
        return self.layout.prefix_caching and held.computed % self.layout.page_size == 0


class WindowPageReleasedTwice(KvGroups):
    """SGLang #24153: the SWA radix cache decrements a lock already at zero under long context. A
    window's pages behind it are let go but stay in its table, to be let go again."""

    def _release_behind(self, table: list[int], behind: int) -> None:
        for page in table[:behind]:
            if page != NULL and self.refs[page] > 0:
                self._release(page)


class WindowFreesACachedPage(KvGroups):
    """SGLang PR #27586: a tombstone keeps a stale full-to-SWA mapping and `free_swa` frees a live
    slot. A page leaving a window is freed whoever else holds it (the cache)."""

    def _release_behind(self, table: list[int], behind: int) -> None:
        for page in table[:behind]:
            if page != NULL:
                self.refs[page] = 1
                self._release(page)
        table[:behind] = [NULL] * min(behind, len(table))


class RejectedHitKeepsItsHolds(KvGroups):
    """SGLang PR #29349 / #29351: an insert mutates the full tree's state, the follow-up match on
    the SWA (or Mamba) tree rejects it, and nothing rolls it back. Each longer prefix the first
    group could serve and a later group rejected keeps a hold on the first group's pages."""

    def admit(self, request_id: object, tokens: object) -> int:
        length = super().admit(request_id, tokens)
        known = self.requests[require_int("request id", request_id)].tokens
        size = self.layout.page_size
        for longer in range(length + size, (len(known) - 1) // size * size + 1, size):
            for page in self._group_hit(0, known, longer) or []:
                if page != NULL:
                    self.refs[page] += 1  # the first group's hold, never undone
        return length


class StateCopyDropsWindowHolds(KvGroups):
    """SGLang PR #27038 / #28161: Mamba copy-on-write releases the SWA locks up to the root. A hit
    that copies a recurrent snapshot lets go of the window pages the request attached."""

    def admit(self, request_id: object, tokens: object) -> int:
        length = super().admit(request_id, tokens)
        if length and any(self.recurrent):
            held = self.requests[require_int("request id", request_id)]
            for g, group in enumerate(self.layout.groups):
                if isinstance(group, ATTENTION) and not isinstance(group, Full):
                    for page in held.tables[g]:
                        if page != NULL:
                            self._release(page)
        return length


class NullPageFreed(KvGroups):
    """SGLang PR #38269: `free_swa_segment` double-frees the SWA page-0 sentinel. A freed window
    table lets go of its null entries too, as of any page: the null page's count goes down and
    the null page goes on the free stack, once for each entry."""

    def _free_table(self, table: list[int]) -> None:
        super()._free_table([page for page in table if page != NULL])
        for page in table:
            if page == NULL:
                self.refs[NULL] -= 1
                self.free_pages.append(NULL)


class TruncationTouchesGroupZero(KvGroups):
    """UCM PR #1059: a hybrid truncation touches only group 0; later groups keep stale hits,
    negative allocations and a corrupted free queue. Rejected drafts' pages are let go in the
    first group only."""

    def _truncate(self, group: int, table: list[int], keep: int) -> None:
        if group == 0:
            super()._truncate(group, table, keep)


VARIANTS: dict[str, type[KvGroups]] = {
    "vllm_48489_free_loses_group_order": FreeLosesGroupOrder,
    "vllm_50457_hit_from_the_first_full_group": HitFromTheFirstFullGroup,
    "vllm_47926_drafter_left_out_of_the_hit": DrafterLeftOutOfTheHit,
    "vllm_53912_snapshot_off_its_boundary": SnapshotOffItsBoundary,
    "sglang_24153_window_page_released_twice": WindowPageReleasedTwice,
    "sglang_27586_window_frees_a_cached_page": WindowFreesACachedPage,
    "sglang_29349_rejected_hit_keeps_its_holds": RejectedHitKeepsItsHolds,
    "sglang_27038_state_copy_drops_window_holds": StateCopyDropsWindowHolds,
    "sglang_38269_null_page_freed": NullPageFreed,
    "ucm_1059_truncation_touches_group_zero": TruncationTouchesGroupZero,
}
