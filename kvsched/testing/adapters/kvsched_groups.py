"""kvsched's KV groups behind the adapter protocol, with "groups" and "drafts": impl's `KvGroups`
(`kvsched.impl.kv_groups`) over a full-attention group and a sliding window of two pages, one
pool, page 0 the null page, prefix caching on, up to three drafts a pass; `recurrent_manager` adds
a recurrent group, its states in slots of their own (one a page), snapshotted at page boundaries.

An admission is the groups' `admit` (the longest prefix both groups can serve) and one pass over
the rest of the prompt (`compute`); a decode is the sample (the groups' `accept`) and one pass over
it; `speculate` is the sample and one pass over it and the drafts after it. The protocol's
`accept` is kept until the request's next sample, which the groups' `accept` takes with it (the
drafts kept, then the token sampled after them): the rejected drafts' pages are let go then. A
pass begins by letting go of the window's pages wholly behind its first query, so the tables the
view shows after a call are the ones the harness's pass reads through. A call the groups refuse
with a typed error (`Exhausted`: no page for it) is a refusal, and the adapter puts back the state
it held before the call (the admit of a refused admission included). `written` changes nothing:
the groups cache each full page of accepted tokens as the pass over it ends. The cache's own hold
is not a holder in the protocol's counts, so the view subtracts it; a page only the cache holds is
evictable, so it is free. With a recurrent group, the state copies a call asked for are read
off the groups: a hit's snapshot copied into the request's slot as it is admitted, and each
snapshot the groups took of the request's state, before the pass (the groups' `accept`) or after.

`broken(name)` is the same adapter over one of `kvsched.testing.group_variants`: the upstream
hybrid-KV bugs, each a `KvGroups` with the one mistake the bug made, importable here by its name.
Those the harness sees are in `FOUND`; the rest are out of its sight (`UNSEEN`, with why).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

from kvsched.impl.kv_groups import KvGroups
from kvsched.spec.errors import KvschedError
from kvsched.spec.kv_groups import NULL, Content
from kvsched.spec.kv_layout import Full, Group, Layout, Recurrent, Window
from kvsched.testing.adapter import ManagerFactory, PoolView
from kvsched.testing.group_variants import VARIANTS

DRAFTS = 3  # the most drafts a pass computes after its token


Copy = tuple[int, int]


class KvschedGroups:
    """impl's KV groups for `pages` pages (page 0 the null page) of `page_size` tokens: a full
    group and a window of `2 * page_size` tokens, and with `recurrent` a recurrent group over as
    many state slots as pages."""

    capabilities = frozenset({"groups", "drafts", "atomic"})

    def __init__(
        self, pages: int, page_size: int, flavour: type[KvGroups] = KvGroups, *, recurrent: bool = False
    ) -> None:
        groups: tuple[Group, ...] = (Full(), Window(2 * page_size))
        self.groups = (*groups, Recurrent()) if recurrent else groups
        tokens = pages * page_size + DRAFTS  # the full group holds no more: longer sequences are refused
        layout = Layout(
            self.groups,
            page_size=page_size,
            pages=pages,
            state_slots=pages if recurrent else 0,
            draft_tokens=DRAFTS,
            step_tokens=tokens,
            max_tokens=tokens,
        )
        self.kv = flavour(layout)
        self.pages = pages
        self.kept: dict[int, int] = {}  # request -> the drafts the model kept, until its next sample
        self.copied: tuple[list[Copy], list[Copy]] = ([], [])  # the last call's state copies, before and after its pass

    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        before = copy.deepcopy(self.kv)
        try:
            found = self.kv.admit(request_id, tuple(tokens))
            resumed = self._resumed(before, request_id, tuple(tokens[:found]))
            taken = self._taken_since(before.snapshot_key, request_id)
            snapshots = dict(self.kv.snapshot_key)
            self.kv.compute(request_id, len(tokens) - found)
        except KvschedError:
            self.kv = before
            return None
        self.copied = (resumed + taken, self._taken_since(snapshots, request_id))
        return found

    def _resumed(self, before: KvGroups, request_id: int, prefix: tuple[int, ...]) -> list[Copy]:
        """The admission's copies of a hit's snapshots (in the groups before it) into its slots."""
        states = self.kv.requests[request_id].states
        return [
            (before.snapshot_of[(g, prefix)], slot)
            for g, slot in enumerate(states)
            if slot is not None and prefix and (g, prefix) in before.snapshot_of
        ]

    def _taken_since(self, snapshots: Mapping[int, Content], request_id: int) -> list[Copy]:
        """The snapshots of the request's states the groups took since they held `snapshots`."""
        states = self.kv.requests[request_id].states
        return [
            (slot, snapshot)
            for snapshot, key in self.kv.snapshot_key.items()
            if snapshots.get(snapshot) != key and (slot := states[key[0]]) is not None
        ]

    def state_copies(self) -> tuple[list[Copy], list[Copy]]:
        return self.copied

    def append(self, request_id: int, token: int) -> bool:
        return self.speculate(request_id, token, ())

    def speculate(self, request_id: int, token: int, drafts: Sequence[int]) -> bool:
        before = copy.deepcopy(self.kv)
        try:
            self.kv.accept(request_id, self.kept.get(request_id, 0), token)
            taken = self._taken_since(before.snapshot_key, request_id)
            snapshots = dict(self.kv.snapshot_key)
            self.kv.compute(request_id, 1, tuple(drafts))
        except KvschedError:
            self.kv = before
            return False
        self.kept.pop(request_id, None)
        self.copied = (taken, self._taken_since(snapshots, request_id))
        return True

    def accept(self, request_id: int, accepted: int) -> None:
        self.kept[request_id] = accepted

    def written(self, request_id: int, tokens: int) -> None:
        self.copied = ([], [])  # its snapshots are taken within the calls above

    def free(self, request_id: int) -> None:
        self.kv.free(request_id)
        self.kept.pop(request_id, None)

    def view(self) -> PoolView:
        kv = self.kv
        cached = dict(kv.key_of)
        only_cached = {page for page in cached if kv.refs[page] == 1}
        return PoolView(
            holders=tuple(kv.refs[page] - (page in cached) for page in range(self.pages)),
            free=frozenset(kv.free_pages) | only_cached,
            tables={},
            cached=cached,
            reserved=frozenset({NULL}),
            group_tables={rid: tuple(tuple(table) for table in held.tables) for rid, held in kv.requests.items()},
            state_slots=len(kv.slots),
            states={rid: tuple(s for s in held.states if s is not None) for rid, held in kv.requests.items()},
            snapshots=dict(kv.snapshot_key),
            state_free=frozenset(kv.free_slots) | set(kv.snapshot_key),
        )


def manager(pages: int, page_size: int) -> KvschedGroups:
    """The adapter over impl's KV groups: `kvsched check kvsched.testing.adapters.kvsched_groups:manager`."""
    return KvschedGroups(pages, page_size)


def recurrent_manager(pages: int, page_size: int) -> KvschedGroups:
    """The adapter over impl's KV groups with a recurrent group:
    `kvsched check kvsched.testing.adapters.kvsched_groups:recurrent_manager`."""
    return KvschedGroups(pages, page_size, recurrent=True)


def broken(name: str) -> ManagerFactory:
    """The adapter over the broken KV groups `name` (`kvsched.testing.group_variants.VARIANTS`),
    importable from this module by that name too (`kvsched check
    kvsched.testing.adapters.kvsched_groups:sglang_38269_null_page_freed`)."""
    flavour, recurrent = VARIANTS[name], name in RECURRENT

    def build(pages: int, page_size: int) -> KvschedGroups:
        return KvschedGroups(pages, page_size, flavour, recurrent=recurrent)

    build.__qualname__ = build.__name__ = name
    return build


def __getattr__(name: str) -> ManagerFactory:
    if name in VARIANTS:
        return broken(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


FOUND = (  # the upstream bugs the harness finds through the adapter
    "vllm_50457_hit_from_the_first_full_group",
    "vllm_47926_drafter_left_out_of_the_hit",
    "sglang_24153_window_page_released_twice",
    "sglang_27586_window_frees_a_cached_page",
    "sglang_29349_rejected_hit_keeps_its_holds",
    "sglang_38269_null_page_freed",
    "ucm_1059_truncation_touches_group_zero",
    "vllm_53912_snapshot_off_its_boundary",
    "sglang_27038_state_copy_drops_window_holds",
)
RECURRENT = frozenset(FOUND[-2:])  # bugs of recurrent state: their adapter has a recurrent group
UNSEEN = {  # out of the harness's sight through this adapter, and why
    "vllm_48489_free_loses_group_order": "eviction order is policy, which the harness leaves to the manager",
}
