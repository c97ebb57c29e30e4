"""kvsched's KV groups behind the adapter protocol, with "groups" and "drafts": impl's `KvGroups`
(`kvsched.impl.kv_groups`) over a full-attention group and a sliding window of two pages, one
pool, page 0 the null page, prefix caching on, up to three drafts a pass.

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
evictable, so it is free.

`broken(name)` is the same adapter over one of `kvsched.testing.group_variants`: the upstream
hybrid-KV bugs, each a `KvGroups` with the one mistake the bug made, importable here by its name.
Those the harness sees are in `FOUND`; the rest are out of its sight (`UNSEEN`, with why).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from kvsched.impl.kv_groups import KvGroups
from kvsched.spec.errors import KvschedError
from kvsched.spec.kv_groups import NULL
from kvsched.spec.kv_layout import Full, Layout, Window
from kvsched.testing.adapter import ManagerFactory, PoolView
from kvsched.testing.group_variants import VARIANTS

DRAFTS = 3  # the most drafts a pass computes after its token


class KvschedGroups:
    """impl's KV groups for `pages` pages (page 0 the null page) of `page_size` tokens: a full
    group and a window of `2 * page_size` tokens."""

    capabilities = frozenset({"groups", "drafts", "atomic"})

    def __init__(self, pages: int, page_size: int, flavour: type[KvGroups] = KvGroups) -> None:
        self.groups = (Full(), Window(2 * page_size))
        tokens = pages * page_size + DRAFTS  # the full group holds no more: longer sequences are refused
        layout = Layout(
            self.groups, page_size=page_size, pages=pages, draft_tokens=DRAFTS, step_tokens=tokens, max_tokens=tokens
        )
        self.kv = flavour(layout)
        self.pages = pages
        self.kept: dict[int, int] = {}  # request -> the drafts the model kept, until its next sample

    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        before = copy.deepcopy(self.kv)
        try:
            found = self.kv.admit(request_id, tuple(tokens))
            self.kv.compute(request_id, len(tokens) - found)
        except KvschedError:
            self.kv = before
            return None
        return found

    def append(self, request_id: int, token: int) -> bool:
        return self.speculate(request_id, token, ())

    def speculate(self, request_id: int, token: int, drafts: Sequence[int]) -> bool:
        before = copy.deepcopy(self.kv)
        try:
            self.kv.accept(request_id, self.kept.get(request_id, 0), token)
            self.kv.compute(request_id, 1, tuple(drafts))
        except KvschedError:
            self.kv = before
            return False
        self.kept.pop(request_id, None)
        return True

    def accept(self, request_id: int, accepted: int) -> None:
        self.kept[request_id] = accepted

    def written(self, request_id: int, tokens: int) -> None:
        return None

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
        )


def manager(pages: int, page_size: int) -> KvschedGroups:
    """The adapter over impl's KV groups: `kvsched check kvsched.testing.adapters.kvsched_groups:manager`."""
    return KvschedGroups(pages, page_size)


def broken(name: str) -> ManagerFactory:
    """The adapter over the broken KV groups `name` (`kvsched.testing.group_variants.VARIANTS`),
    importable from this module by that name too (`kvsched check
    kvsched.testing.adapters.kvsched_groups:sglang_38269_null_page_freed`)."""
    flavour = VARIANTS[name]

    def build(pages: int, page_size: int) -> KvschedGroups:
        return KvschedGroups(pages, page_size, flavour)

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
)
UNSEEN = {  # out of the harness's sight through this adapter, and why
    "vllm_48489_free_loses_group_order": "eviction order is policy, which the harness leaves to the manager",
    "vllm_53912_snapshot_off_its_boundary": "recurrent states are not in the protocol's view",
    "sglang_27038_state_copy_drops_window_holds": "recurrent states are not in the protocol's view",
    "ucm_1059_truncation_touches_group_zero": (
        "the rejected drafts' pages it keeps in later groups are pages the protocol lets a manager hold"
        " ahead of its tokens (vLLM's lookahead slots), and the next pass writes over them"
    ),
}
