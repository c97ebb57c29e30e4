"""The adapter protocol: what the safety harness needs from anyone's page manager.

An adapter wraps a paged KV manager (nano-vllm's `BlockManager`, vLLM's `BlockPool`, kvsched's
own parts, yours) behind the verbs every paged engine has. The harness plays the engine: it
decides which request runs, samples tokens, and writes a ghost KV cache itself after each
successful call. The adapter only forwards. Request ids and page ids are plain ints.

    admit(request_id, tokens) -> int | None
        Give the request pages for its prompt `tokens` (the manager may hit its prefix cache).
        Returns how many leading tokens the manager says are already computed (0 without a
        hit), or None when it refuses for lack of pages.
    append(request_id, token) -> bool
        The request's sequence grew by `token`: make room for its KV (one position). False
        when refused for lack of pages.
    written(request_id, tokens)
        The harness wrote the KV of the request's first `tokens` positions (a manager that
        caches after the write publishes full pages here; others ignore it).
    free(request_id)
        The request finished, or was preempted: release its pages.
    fork(parent_id, child_id) -> bool            (capability "fork")
        The child shares the parent's pages (copy-on-write on its next write).
    copies() -> Sequence[tuple[int, int]]        (capability "copy_on_write")
        The (source, destination) page copies the last successful `append` asked the engine
        to make before it writes (the harness copies its ghost KV along).
    reset_cache() -> bool                        (capability "reset_cache")
        Drop every cached page; False when refused (a cached page is in use).
    lookup(request_id, tokens) -> object         (capabilities "lookup" and "commit", together)
        The first phase of a two-phase admission: what the manager's cache holds for the prompt,
        as an answer of the manager's own (opaque to the harness). Changes nothing.
    commit(request_id, tokens, answer) -> int | None
        The second phase: admit as `admit` does, given the answer of a lookup made earlier, with
        other calls (other admissions, frees, evictions) between the two. The manager validates
        the answer again: a page it named that was evicted, or reused, since must not be attached.
    lease(request_id) -> object | None           (capabilities "lease" and "end_lease", together)
        An asynchronous reader (a connector's save, a disaggregated send, an offload) takes hold
        of the request's pages as they are now; an opaque lease, or None when refused. The pages
        stay the reader's whatever happens to the request (a finish, a preemption) until
    end_lease(lease) -> Sequence[tuple[int, int]] | None
        the reader has read them: the manager lets go. The view's `leased` counts each page's
        leases. A reader that saves into the host tier (a connector's store, with "demote")
        returns the (device page, host page) copies it made: each device page one the lease
        held, cached when the lease began, its host page then holding that key (the harness
        copies the KV the lease read). Until then the view's `host_pending` names those host
        pages.
    demote() -> Sequence[tuple[int, int]]        (capabilities "demote" and "promote", together)
        The manager copies cached device pages it would evict next into its host tier: the
        (device page, host page) copies it asks the engine to make (the harness copies its ghost
        KV along). The host tier then holds each under its page's key (the view's `host`); the
        device pages stay where they were (cached, evictable).
    promote(request_id) -> Sequence[tuple[int, int]]
        The (host page, device page) copies the last successful `admit` or `commit` of the
        request asked for: pages its prompt found in the host tier, past those found on the
        device, copied into its own fresh pages before anything reads them. The admission's
        computed tokens count them.
    complete(copy_id, ok) -> int | None        (capability "async_copies", with "demote" and "promote")
        A copy in flight between the tiers ends: done (`ok`) or failed. With "async_copies" a
        copy is not made within the call that starts it: `demote` starts stores, an admission
        that finds its prompt in the host tier starts loads into the request's pages, and any
        call may start copies of the manager's own (a store made while evicting, say). Each is
        in the view's `in_flight` from the call that started it until the harness completes it,
        between other calls, in any order. For a load into a request's page, `complete` returns
        how many of the request's tokens are computed now: after a failed load, only those
        before the page it should have filled (the harness computes the rest into the request's
        pages once none of its loads is in flight).
    events() -> Sequence[KvEvent]               (capability "events")
        The KV events the manager published since the last call, in order, as
        `kvsched.spec.kv_events` writes them (`Stored`, `Removed`, `Cleared`; a tier is "GPU" for
        the view's `cached`, "CPU" for its `host`), each key as the view names it. Read after
        every call: folded, they must give exactly the view's cached keys on both tiers, one
        `Stored` a page (a manager may cache one key on several pages), one `Removed` a page.
    speculate(request_id, token, drafts) -> bool  (capability "drafts")
        Speculative decoding: the request decoded `token` and the drafter proposes the tokens
        `drafts` after it; make room for the KV of the token and of every draft (one pass
        computes them all). False when refused.
    accept(request_id, accepted)                 (capability "drafts")
        The model kept the first `accepted` drafts of the request's last `speculate`: they are
        its tokens now. The rest are rejected: their KV is never read as the request's, and no
        page holding it may be cached under the accepted tokens (`written` names accepted
        positions only). The manager may let go of pages wholly past the accepted tokens, now
        or as its next call begins.
    view() -> PoolView
        The pool as plain ints, read after every call.

With "groups" (a hybrid manager: vLLM's `KVCacheCoordinator`, SGLang's SWA caches), the adapter
names its attention groups in `groups`, a tuple of `kvsched.spec.kv_layout` groups (`Full()`,
`Window(W)` of W tokens, `Chunked(C)`), and its view's `group_tables` maps each live request to one
table per group, in that order (its `tables` is then unread). The engine computes every position
in every group: after `admit` or `append` returns, the pass runs over the tables the view shows
(each position's page in each group must be a real page, the request's alone), and the query at
position q of a group reads only what that group's query reads: every earlier position in a full
group, q - W + 1 .. q - 1 in a window, its chunk in a chunked group. Each of those must hold, in
that group's page, that group's KV of the request's own tokens (GHOST): a table may hold a
reserved page (vLLM's null block, SGLang's page-0 sentinel) only where no query reads any more.
So a manager lets a window's pages go once the pass that last read them has run: at `written`,
or as its next `append` begins (vLLM's `remove_skipped_blocks`). A page's KV is its group's: a page
one group wrote served to another is a GHOST failure even where the tokens match. "groups" does
not go with "fork", "copy_on_write", "lease" or "demote" (their verbs name one table a request).

A hybrid manager with recurrent state (Mamba, GDN, linear attention: SGLang's `MambaRadixCache`,
kvsched's own groups) names `Recurrent()` among its groups; that group's table is empty. Each live
request then has one state slot in each recurrent group (the view's `states`), which the pass
reads and writes in place: the query at position q reads the state after positions 0 .. q - 1
(none at q = 0), and leaves the state after 0 .. q. A prefix hit resumes from a snapshot, a state
cached under a key (the view's `snapshots`); the manager caches one by copying a request's state
into a slot of its own. The harness makes those copies, as it does the page copies of
"copy_on_write", and checks what every state read finds (GHOST):

    state_copies() -> tuple[Sequence[tuple[int, int]], Sequence[tuple[int, int]]]
        The (source slot, destination slot) state copies the last successful `admit`, `append`
        or `speculate` asked the engine to make: those before its pass (a hit's snapshot into the
        request's state; a snapshot of the state its accepted tokens left), then those after it
        (a snapshot of the state the pass left). After `written`, the copies it asked for (a
        manager that publishes once the pass has run snapshots there; the harness makes them at
        once), none for most managers.

After `accept`, the request's state is the one after its accepted tokens (the model keeps a state
at every draft, as vLLM's speculative state blocks do, and the engine picks it). A snapshot's key
names the state it was first seen cached over, as a page's key names its KV.

A capability the manager lacks is left out of `capabilities`, never faked: the harness does
not call it. With "atomic", a refused `admit` or `append` must leave the view unchanged.

With "tenants", request r belongs to tenant `tenant_of(r)` and the manager salts its prefix cache
with it (vLLM's `cache_salt`, SGLang's `RadixKey.extra_key`): the harness's ghost KV then records
each position's tenant, so a prefix hit that serves another tenant's page is a GHOST failure even
when the tokens match.

The view's keys are taken to name content (a hash of the tokens, a token path): a key names the
KV it was first seen cached over, and the harness requires every page cached under it to hold
that KV (a key that outlives its content is a GHOST failure). With "location_keys", the keys name
where a page sits instead (SGLang's Rust tree core shows only slot chains), so the same key may
name other KV once its slots are reused, and that check is off.

With "single_owner" (SGLang's allocators and radix trees: no reference counts), every page not
reserved has exactly one owner at every step: the allocator's free list, the prefix cache (a
cached page, which live requests may share while they lock it, evictable once none does), or
one request's private tail. The adapter derives `holders` from the manager's own state (a tree
page's lock count, a private page's one table); the harness then also checks that no page is
lost between owners and that no uncached page is in two tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

CAPABILITIES = frozenset(
    {
        "fork",
        "copy_on_write",
        "reset_cache",
        "atomic",
        "single_owner",
        "tenants",
        "lookup",
        "commit",
        "lease",
        "end_lease",
        "demote",
        "promote",
        "async_copies",
        "events",
        "location_keys",
        "groups",
        "drafts",
    }
)
TENANTS = 2  # with "tenants": how many tenants the harness's requests belong to


def tenant_of(request_id: int) -> int:
    """The tenant a request belongs to under the "tenants" capability (a forked child, its
    parent's): the manager must salt its cache with it, and the harness checks that no
    request reads KV another tenant computed."""
    return request_id % TENANTS


@dataclass(frozen=True, slots=True)
class PoolView:
    """A page manager's state as plain ints.

    `holders[page]` is how many requests hold the page (a prefix cache's own hold is not
    counted: vLLM's `ref_cnt` and nano-vllm's `ref_count` count requests only). `free` is the
    set of pages the manager may hand out next, cached-but-unheld pages included. `tables`
    maps every live request to its block table, logical page order. `cached` maps each page
    the prefix cache can serve to its key (any hashable; only equality is used). `reserved`
    are pages the manager never hands out (vLLM's null block, SGLang's dummy page 0).
    `evictable` are cached pages no request holds that the manager reclaims only by evicting
    them from its cache (a radix tree's unlocked pages: not free, and not lost); a manager
    whose free set already holds its unheld cached pages (vLLM, nano-vllm) leaves it empty.
    `leased[page]` is how many leases (capability "lease") hold the page: a leased page is not
    free, and its leases are not among its `holders`. With a host tier (capability "demote"),
    `host_pages` is its size, `host` maps each host page that holds KV to its key (the key its
    device page was cached under), `host_free` are the host pages the tier may hand out next,
    and `host_pending` the host pages a save still in flight (a lease's, see `end_lease`) will
    write: every host page is exactly one of the three. With "async_copies", `in_flight` maps each
    copy in flight to (device page, host page, to the host): a store's host page is pending until
    it completes; neither page of a copy in flight is free; a load's device page is not cached
    until its load completes, and a failed one never is. With "groups", `group_tables` maps every
    live request to its table in each attention group (the module docstring); `holders` count a
    page once for each group's table that holds it. With a recurrent group, `state_slots` is how
    many state slots there are, `states` maps every live request to its slot in each recurrent
    group, `snapshots` maps each slot holding a cached state to its key, and `state_free` are the
    slots the manager may hand out next (an unused snapshot's included, as a free page may be an
    unheld cached one).
    """

    holders: tuple[int, ...]
    free: frozenset[int]
    tables: Mapping[int, tuple[int, ...]]
    cached: Mapping[int, object] = field(default_factory=dict)
    reserved: frozenset[int] = frozenset()
    evictable: frozenset[int] = frozenset()
    leased: Mapping[int, int] = field(default_factory=dict)
    host: Mapping[int, object] = field(default_factory=dict)
    host_free: frozenset[int] = frozenset()
    host_pages: int = 0
    host_pending: frozenset[int] = frozenset()
    in_flight: Mapping[int, tuple[int, int, bool]] = field(default_factory=dict)
    group_tables: Mapping[int, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    state_slots: int = 0
    states: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    snapshots: Mapping[int, object] = field(default_factory=dict)
    state_free: frozenset[int] = frozenset()


@runtime_checkable
class PageManager(Protocol):
    """What the safety harness drives; see the module docstring."""

    capabilities: frozenset[str]

    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None: ...

    def append(self, request_id: int, token: int) -> bool: ...

    def written(self, request_id: int, tokens: int) -> None: ...

    def free(self, request_id: int) -> None: ...

    def view(self) -> PoolView: ...


ManagerFactory = Callable[[int, int], PageManager]
"""Builds a fresh manager of `pages` pages of `page_size` tokens: `factory(pages, page_size)`."""
