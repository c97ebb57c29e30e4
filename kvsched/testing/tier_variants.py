"""Broken tiered caches, one per KV bug engines shipped in 2025-2026 that the tiered cache's verbs
can express, each impl's `TieredCache` with the one mistake the upstream bug made.

Each is caught by a named check on a pinned program (`tests/impl/test_tiers.py`, a test named after
the upstream bug), and the machine and the explorer tell each apart from the spec.
"""

from __future__ import annotations

from kvsched.impl.tiers import Pages, TieredCache
from kvsched.spec.tiers import PROMOTE, Admitted, Key, Match


class AbortFreesPagesUnderACopy(TieredCache):
    """SGLang #24527 (PR #35049): an abort frees the pages a copy is still writing, and the late
    write lands in the next owner's page. `free` lets go of a promotion's destination for the copy
    too; the copy, when it completes, writes it anyway."""

    def free(self, request_id: object) -> None:
        held = self.requests.get(request_id) if isinstance(request_id, int) else None
        super().free(request_id)
        for page in held.pages if held is not None else ():
            if page in self.incoming:
                self.device.release(page)  # the copy's hold, let go with the request's

    def complete(self, transfer_id: object, ok: object = True) -> None:
        transfer = self.transfers.get(transfer_id) if isinstance(transfer_id, int) else None
        if transfer is not None and transfer.kind == PROMOTE and transfer.page not in self._held():
            self.device.retain(transfer.page)  # it lets go of a hold it no longer has: as if it had one
        super().complete(transfer_id, ok)

    def _held(self) -> set[int]:
        return {page for held in self.requests.values() for page in held.pages}


class PreemptionFreesPagesALeaseReads(TieredCache):
    """DingoCache PR #76: preemption frees the pages an offload store is still reading, and the
    store keeps poisoned KV. `free` lets go of its pages' leases with the request."""

    def free(self, request_id: object) -> None:
        held = self.requests.get(request_id) if isinstance(request_id, int) else None
        super().free(request_id)
        for page in held.pages if held is not None else ():
            for lease in self.leases.values():
                if lease.page == page and self.device.refs[page] > 0:
                    self.device.release(page)


class HostPageReclaimedMidCopy(TieredCache):
    """SGLang PR #38480: the host tier's lock is lost (a radix split), and a host page a promotion
    is still reading is reclaimed. A demotion may take any cached host page, held or not."""

    def __init__(self, device_pages: int, host_pages: int) -> None:
        super().__init__(device_pages, host_pages)
        self.host = _Unlocked.empty(len(self.host.refs))


class _Unlocked(Pages):
    def available(self) -> int:
        return len(self.free) + len(self.key_of)

    def take(self, count: int) -> list[int]:
        if self.free or not self.key_of:
            return super().take(count)
        page = next(iter(self.key_of))  # the least recently used, whoever else holds it
        del self.page_of[self.key_of.pop(page)]
        self.refs[page], self.content[page] = 1, None
        return [page]


class CommitTrustsTheDeviceMatch(TieredCache):
    """vLLM #37076 (PR #37164): a lookup finds a free cached block, which is reallocated to another
    request before the pin: the pin attaches it anyway (cross-request KV). `commit` attaches the
    device pages a lookup found without asking the cache again."""

    def commit(self, request_id: object, keys: object, match: object = None) -> Admitted:
        if isinstance(match, Match) and match.device:
            for key, page in match.device:
                if isinstance(page, int) and 0 <= page < len(self.device.refs) and self.device.page_of.get(key) != page:
                    self.device.page_of[key] = page  # as if still cached: the pin believes the lookup
                    self.device.key_of.setdefault(page, key)
        return super().commit(request_id, keys, match)


class CommitTrustsTheHostMatch(TieredCache):
    """vLLM #39702 (PR #42289): CPU offload's check-then-act race between matching and allocating:
    the host block matched is reused before it is loaded. `commit` promotes the host pages a lookup
    found without asking the host cache again."""

    def commit(self, request_id: object, keys: object, match: object = None) -> Admitted:
        if isinstance(match, Match) and match.host:
            for key, page in match.host:
                if isinstance(page, int) and 0 <= page < len(self.host.refs) and self.host.page_of.get(key) != page:
                    self.host.page_of[key] = page
        return super().commit(request_id, keys, match)


class HostHashesNeverRegistered(TieredCache):
    """vLLM #53498: CPU offload never registers the host hashes, so every host lookup misses. A
    demotion's host page is never cached."""

    def complete(self, transfer_id: object, ok: object = True) -> None:
        transfer = self.transfers.get(transfer_id) if isinstance(transfer_id, int) else None
        if transfer is not None and transfer.kind != PROMOTE and ok is True:
            super().complete(transfer_id, False)  # copied, but never registered: as good as lost
            self.host.content[transfer.host_page] = self.device.content[transfer.page]
            return
        super().complete(transfer_id, ok)


class ReusedHostPageKeepsItsKey(TieredCache):
    """TRT-LLM #8813 (PRs #8830, #9056): reusing an offloaded block restores another block's KV.
    Evicting a host page drops the cache's hold but leaves its key naming the page."""

    def __init__(self, device_pages: int, host_pages: int) -> None:
        super().__init__(device_pages, host_pages)
        self.host = _StaleKeys.empty(len(self.host.refs))


class _StaleKeys(Pages):
    def uncache(self, page: int) -> None:
        key = self.key_of.pop(page)
        self.release(page)
        self.page_of[key] = page  # still found under its old key
        self.stale = {**getattr(self, "stale", {}), key: page}

    def cache(self, page: int, key: Key) -> None:
        for stale_key, stale_page in list(getattr(self, "stale", {}).items()):
            if stale_page == page:
                self.page_of[stale_key] = page  # the old key still names the reused page
        super().cache(page, key)


class SameBlockTwiceInOneFree(TieredCache):
    """vLLM #42571 (PR #42612): the same block twice in one free call (a sliding window and eager
    CPU offload both free it): a double free. `free` lets go of a page a demotion is copying for
    the copy too."""

    def free(self, request_id: object) -> None:
        held = self.requests.get(request_id) if isinstance(request_id, int) else None
        super().free(request_id)
        copying = {t.page for t in self.transfers.values() if t.kind != PROMOTE}
        for page in held.pages if held is not None else ():
            if page in copying and self.device.refs[page] > 0:
                self.device.release(page)


class CopyReadsAnUnwrittenPage(TieredCache):
    """SGLang PR #33970: a transfer reads chunked-prefill pages before the forward pass wrote them.
    A lease may begin on a page nothing is written in yet."""

    def lease(self, page: object) -> int:
        device = self.device
        if (
            isinstance(page, int)
            and 0 <= page < len(device.refs)
            and device.refs[page]
            and device.content[page] is None
        ):
            device.content[page] = "unwritten"  # what the reader sees: whatever the page held
            try:
                return super().lease(page)
            finally:
                device.content[page] = None
        return super().lease(page)


VARIANTS: dict[str, type[TieredCache]] = {
    "sglang_24527_abort_frees_pages_under_a_copy": AbortFreesPagesUnderACopy,
    "dingocache_76_preemption_frees_pages_a_lease_reads": PreemptionFreesPagesALeaseReads,
    "sglang_38480_host_page_reclaimed_mid_copy": HostPageReclaimedMidCopy,
    "vllm_37076_commit_trusts_the_device_match": CommitTrustsTheDeviceMatch,
    "vllm_39702_commit_trusts_the_host_match": CommitTrustsTheHostMatch,
    "vllm_53498_host_hashes_never_registered": HostHashesNeverRegistered,
    "trtllm_8813_reused_host_page_keeps_its_key": ReusedHostPageKeepsItsKey,
    "vllm_42571_same_block_twice_in_one_free": SameBlockTwiceInOneFree,
    "sglang_33970_copy_reads_an_unwritten_page": CopyReadsAnUnwrittenPage,
}
