"""KV of more than one kind: attention groups over one pool, recurrent state in slots, drafts.

A model's layers keep KV of different kinds, and each kind is a group of the layout:

    Full(page_bytes)            full attention: a query reads every earlier position
    Window(tokens, page_bytes)  sliding window: the query at position i reads positions
                                i - tokens + 1 .. i (gpt-oss, Gemma 3)
    Chunked(tokens, page_bytes) chunked local attention: it reads from the start of its chunk
                                of `tokens` positions (Llama 4)
    Recurrent()                 a recurrent state (Mamba, GDN, linear attention): one state per
                                request, which has consumed every token so far

Every attention group keeps a table per request over **one pool** of pages of `page_size`
tokens (vLLM's choice: one `BlockPool` for every group). One pool lets a page serve whichever
group needs it now, so a window's released pages feed the full group's growth; a pool per kind
(SGLang's full and SWA pools) must be sized for each kind's worst case apart and strands free
pages in one while the other is exhausted. So the groups' pages must be the same size in bytes;
a layout whose groups differ is refused (vLLM pads them to one size instead). Recurrent states
live in `state_slots` of their own: a state is not paged by tokens. Page 0 is the **null page**
(vLLM's null block): a table's entry for a page released outside its window. It is never
handed out, counted, cached or freed.

The operations (each a pure function of the state; a refusal raises and changes nothing):

    lookup(tokens)   the longest prefix every group can serve (a query), in whole pages, short
                     of the last token (every request computes at least one): a full group needs
                     every page cached; a window or chunked group only the pages the next query
                     reads; a recurrent group a snapshot taken at exactly that boundary
    admit(id, tokens)   a request over its known tokens, attached to lookup's prefix: the cached
                     pages each group needs (the rest of a window's prefix is the null page) and,
                     for each recurrent group, a state slot holding a copy of its snapshot
    compute(id, count, drafts)  the forward pass over the next `count` known tokens and, when
                     they reach the last known token, up to `draft_tokens` draft tokens after it:
                     first each window's pages wholly behind the pass's first query released
                     (vLLM's `remove_skipped_blocks`: a request keeps what its last pass read
                     until its next pass begins, so the tables a call leaves are those the
                     engine's pass reads through); pages for every position written (the free
                     stack, then evicting cached pages only the cache holds, least recently
                     used first), every position read returned (what it holds), every position
                     written, the state advanced over all of them. Then, over the accepted
                     tokens only: each full page cached under its group and tokens (one page per
                     key) and a snapshot of each state at a page boundary
    accept(id, accepted, token)  the model kept the first `accepted` drafts and sampled `token`
                     after them (with no drafts, after a pass that computed the last known
                     token: the token it sampled, `accepted` 0): those become known tokens,
                     the rejected drafts' KV is never read (pages wholly past the accepted
                     tokens are released; a page part-accepted keeps them unread until it is
                     written over), the state is the one after the accepted tokens; then
                     caching and snapshots as in compute
    free(id)         a finish, cancel or preemption: every page and state slot it holds is let
                     go (its cached pages stay cached, the table's first page the most recently used)

Nothing rejected ever enters the cache: only pages whose every position is accepted are cached,
and only states after accepted tokens are snapshotted.

Ghost content: each page records the group whose KV it holds and the tokens it holds it for, as
the token prefix through its last written position (`UNWRITTEN` where a position of it was never
written); each state slot records its group and the tokens its state has consumed. A read returns
what it found (`Read`), so a check can say whether it is what the request's tokens say it must be.
`GROUP_INVARIANTS` are the predicates every reachable state satisfies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from kvsched.spec import refusals
from kvsched.spec.batch import U32_MAX
from kvsched.spec.domain import require_int
from kvsched.spec.kv_layout import (
    ATTENTION,
    Chunked,
    Full,
    Group,
    Layout,
    Recurrent,
    Window,
    first_kept,
    first_read,
    pages_for,
    require_layout,
)

__all__ = [
    "ATTENTION",
    "GROUP_INVARIANTS",
    "NULL",
    "UNWRITTEN",
    "Chunked",
    "Full",
    "Group",
    "GroupState",
    "KvGroups",
    "Layout",
    "Read",
    "Recurrent",
    "Window",
    "first_kept",
    "first_read",
    "pages_for",
    "require_accept",
    "require_layout",
    "require_pass",
    "state_holds",
    "state_slot",
    "written_content",
]

R = TypeVar("R")
NULL = 0  # the null page
UNWRITTEN = -1  # a position of a page that no pass has written
Tokens = tuple[int, ...]
Content = tuple[int, Tokens]  # (group, the tokens whose KV or state it holds)


# -- the state ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cached:
    """A page cached under its key: (group, the tokens through the page's last position)."""

    page: int
    key: Content


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A recurrent state kept under its key: (group, the tokens it consumed)."""

    slot: int
    key: Content


@dataclass(frozen=True, slots=True)
class Held:
    """A request: its known tokens, how many are computed and accepted, a table per group
    (a recurrent group's is empty), a state slot per recurrent group (None for the others), and
    the draft tokens written past its known tokens, awaiting accept."""

    request_id: int
    tokens: Tokens
    computed: int
    tables: tuple[tuple[int, ...], ...]
    states: tuple[int | None, ...]
    drafts: Tokens = ()

    @property
    def written(self) -> Tokens:
        """The tokens whose KV its pages hold: the known ones, then the drafts."""
        return self.tokens + self.drafts

    @property
    def end(self) -> int:
        """Positions written: the computed ones and the drafts."""
        return self.computed + len(self.drafts)


@dataclass(frozen=True, slots=True)
class GroupState:
    """The pool (counts, free stack with its top last, content), its cache least recently used
    first, the state slots (content, free stack), the snapshots least recently used first, and
    the requests by id."""

    layout: Layout
    refs: tuple[int, ...]
    free: tuple[int, ...]
    content: tuple[Content | None, ...]
    cache: tuple[Cached, ...] = ()
    slots: tuple[Content | None, ...] = ()
    free_slots: tuple[int, ...] = ()
    snapshots: tuple[Snapshot, ...] = ()
    requests: tuple[Held, ...] = ()


@dataclass(frozen=True, slots=True)
class Read:
    """What a pass read: in `group`, at `position`, the page (or state) held the KV of `holds`
    (None: nothing there). Right when `holds` is the request's tokens through `position`."""

    group: int
    position: int
    holds: Tokens | None


def initial_groups(layout: object) -> GroupState:
    """An empty layout: every page but the null page free (page 1 handed out first), every slot free."""
    chosen = require_layout(layout)
    pages, slots = chosen.pages, chosen.state_slots
    return GroupState(
        chosen,
        (0,) * pages,
        tuple(reversed(range(1, pages))),
        (None,) * pages,
        slots=(None,) * slots,
        free_slots=tuple(reversed(range(slots))),
    )


def holding(state: GroupState, request_id: int) -> Held | None:
    return next((held for held in state.requests if held.request_id == request_id), None)


def cached_page(state: GroupState, key: Content) -> int | None:
    return next((entry.page for entry in state.cache if entry.key == key), None)


def is_cached(state: GroupState, page: int) -> bool:
    return any(entry.page == page for entry in state.cache)


def snapshot_of(state: GroupState, key: Content) -> int | None:
    return next((snap.slot for snap in state.snapshots if snap.key == key), None)


def evictable(state: GroupState) -> list[Cached]:
    """Cached pages only the cache holds, least recently used first."""
    return [entry for entry in state.cache if state.refs[entry.page] == 1]


def page_key(group: int, tokens: Tokens, page: int, page_size: int) -> Content:
    """The key of a table's `page`: its group and the tokens through its last position."""
    return group, tokens[: (page + 1) * page_size]


def state_slot(states: Sequence[int | None], group: int) -> int:
    """A request's state slot in recurrent `group`."""
    slot = states[group]
    assert slot is not None
    return slot


def state_holds(content: Content | None, group: int) -> Tokens | None:
    """The tokens a state slot of `content` has consumed, if it holds `group`'s state."""
    return content[1] if content is not None and content[0] == group else None


def holds_at(content: Content | None, group: int, position: int) -> Tokens | None:
    """The tokens whose KV a page of `content` holds at `position`, if it holds `group`'s there."""
    if content is None or content[0] != group or len(content[1]) <= position:
        return None
    return content[1][: position + 1]


# -- changing the pool and the slots (pure; each returns the new state) ------------------------------


def _retain(state: GroupState, page: int) -> GroupState:
    refs = list(state.refs)
    refs[page] += 1
    free = state.free if state.refs[page] else tuple(p for p in state.free if p != page)
    return replace(state, refs=tuple(refs), free=free)


def _release(state: GroupState, page: int) -> GroupState:
    refs = list(state.refs)
    refs[page] -= 1
    return replace(state, refs=tuple(refs), free=state.free + (page,) if refs[page] == 0 else state.free)


def _write(state: GroupState, page: int, content: Content | None) -> GroupState:
    contents = list(state.content)
    contents[page] = content
    return replace(state, content=tuple(contents))


def _uncache(state: GroupState, page: int) -> GroupState:
    return _release(replace(state, cache=tuple(e for e in state.cache if e.page != page)), page)


def _use(state: GroupState, pages: Iterable[int]) -> GroupState:
    """The cached ones of `pages` become the most recently used, the last given the most."""
    order = [page for page in pages if is_cached(state, page)]
    used = tuple(entry for page in order for entry in state.cache if entry.page == page)
    return replace(state, cache=tuple(e for e in state.cache if e.page not in order) + used)


def _take(state: GroupState, count: int) -> tuple[GroupState, list[int]]:
    """`count` fresh pages, held once and unwritten: the free stack's top, then the least
    recently used page only the cache holds. Short of pages: `Exhausted`, nothing taken."""
    available = len(state.free) + len(evictable(state))
    if available < count:
        raise refusals.not_enough_free(count, available)
    taken: list[int] = []
    for _ in range(count):
        if not state.free:
            state = _uncache(state, evictable(state)[0].page)
        page = state.free[-1]
        state = _write(_retain(state, page), page, None)
        taken.append(page)
    return state, taken


def _set_slot(state: GroupState, slot: int, content: Content | None) -> GroupState:
    slots = list(state.slots)
    slots[slot] = content
    return replace(state, slots=tuple(slots))


def _take_slot(state: GroupState) -> GroupState | None:
    """A free state slot on top of the free stack (the least recently used snapshot given up
    for it if none is free); None when every slot holds a running state."""
    if state.free_slots:
        return state
    if not state.snapshots:
        return None
    oldest = state.snapshots[0]
    state = replace(state, snapshots=state.snapshots[1:], free_slots=(oldest.slot,))
    return _set_slot(state, oldest.slot, None)


def _pop_slot(state: GroupState, content: Content | None) -> tuple[GroupState, int]:
    slot = state.free_slots[-1]
    return _set_slot(replace(state, free_slots=state.free_slots[:-1]), slot, content), slot


def _put(state: GroupState, held: Held) -> GroupState:
    others = [h for h in state.requests if h.request_id != held.request_id]
    return replace(state, requests=tuple(sorted((*others, held), key=lambda h: h.request_id)))


# -- the transitions ---------------------------------------------------------------------------------


def require_tokens(name: str, tokens: object, low: int) -> Tokens:
    """A tuple of at least `low` token ids, each within 0..2**32-1."""
    if not isinstance(tokens, tuple) or len(tokens) < low:
        raise refusals.wrong_kind(name, f"a tuple of at least {low} token ids", tokens)
    for token in tokens:
        if require_int("token", token) < 0 or token > U32_MAX:
            raise refusals.wrong_kind("token", "a token id within 0..2**32-1", token)
    return tokens


def group_hit(state: GroupState, index: int, tokens: Tokens, length: int) -> tuple[int, ...] | None:
    """What group `index` attaches for a prefix of `length` tokens (whole pages): its table (the
    null page before the first it keeps) or, for a recurrent group, its snapshot's slot;
    None if it cannot serve that prefix."""
    group, size = state.layout.groups[index], state.layout.page_size
    if isinstance(group, Recurrent):
        slot = snapshot_of(state, (index, tokens[:length]))
        return () if length == 0 else None if slot is None else (slot,)
    table = [NULL] * first_kept(group, length, size)
    for page in range(len(table), length // size):
        found = cached_page(state, page_key(index, tokens, page, size))
        if found is None:
            return None
        table.append(found)
    return tuple(table)


def hit_length(state: GroupState, tokens: Tokens) -> int:
    """The longest prefix of `tokens`, in whole pages and short of the last token, that every
    group can serve."""
    layout = state.layout
    if not layout.prefix_caching:
        return 0
    length = (len(tokens) - 1) // layout.page_size * layout.page_size
    while length > 0 and any(group_hit(state, g, tokens, length) is None for g in range(len(layout.groups))):
        length -= layout.page_size
    return length


def lookup(state: GroupState, tokens: object) -> int:
    """How many of `tokens` an admission now finds computed (a query)."""
    return hit_length(state, require_tokens("tokens", tokens, 1))


def admit(state: GroupState, request_id: object, tokens: object) -> tuple[GroupState, int]:
    """Admit a request over its known `tokens` with the longest prefix found; the prefix's length."""
    rid = require_int("request id", request_id)
    known = require_tokens("tokens", tokens, 1)
    if len(known) > state.layout.max_tokens:
        raise refusals.too_many_tokens(rid, len(known), state.layout.max_tokens)
    if holding(state, rid) is not None:
        raise refusals.duplicate_request(rid)
    length = hit_length(state, known)
    found = state  # the snapshots copied are read as lookup found them, before any slot is taken
    tables: list[tuple[int, ...]] = []
    states: list[int | None] = []
    for index, group in enumerate(state.layout.groups):
        hit = group_hit(state, index, known, length)
        assert hit is not None
        if isinstance(group, Recurrent):
            taken = _take_slot(state)
            if taken is None:
                raise refusals.no_state_slot(rid, len(state.slots))
            state, slot = _pop_slot(taken, found.slots[hit[0]] if hit else (index, ()))
            state = replace(state, snapshots=_used_snapshot(state.snapshots, hit))
            tables.append(())
            states.append(slot)
            continue
        for page in hit:
            if page != NULL:
                state = _retain(state, page)
        state = _use(state, (page for page in reversed(hit) if page != NULL))
        tables.append(hit)
        states.append(None)
    return _put(state, Held(rid, known, length, tuple(tables), tuple(states))), length


def _used_snapshot(snapshots: tuple[Snapshot, ...], hit: tuple[int, ...]) -> tuple[Snapshot, ...]:
    """The snapshot in `hit` (if any) becomes the most recently used."""
    used = tuple(snap for snap in snapshots if snap.slot in hit)
    return tuple(snap for snap in snapshots if snap.slot not in hit) + used


def require_pass(
    layout: Layout, rid: int, tokens: Tokens, computed: int, pending: Tokens, n: int, drafts: Tokens
) -> None:
    """Refuse a pass of `n` known tokens and `drafts` over a request of `tokens`, `computed` of
    them, with `pending` drafts awaiting accept, unless the layout allows it."""
    if pending:
        raise refusals.drafts_pending(rid)
    left = len(tokens) - computed
    if not 1 <= n <= left:
        raise refusals.bad_count(rid, n, left)
    if drafts and (n != left or len(drafts) > layout.draft_tokens):
        raise refusals.bad_drafts(rid, len(drafts), layout.draft_tokens, n == left)
    if n + len(drafts) > layout.step_tokens:
        raise refusals.pass_too_long(rid, n + len(drafts), layout.step_tokens)
    if len(tokens) + len(drafts) > layout.max_tokens:
        raise refusals.too_many_tokens(rid, len(tokens) + len(drafts), layout.max_tokens)


def require_accept(layout: Layout, rid: int, tokens: Tokens, computed: int, pending: Tokens, kept: int) -> None:
    """Refuse keeping `kept` of the `pending` drafts of a request of `tokens`, `computed` of them
    (and a sample after them), unless it can."""
    if not pending and computed < len(tokens):
        raise refusals.not_sampling(rid, len(tokens) - computed)
    if not 0 <= kept <= len(pending):
        raise refusals.bad_accept(rid, kept, len(pending))
    if len(tokens) + kept + 1 > layout.max_tokens:
        raise refusals.too_many_tokens(rid, len(tokens) + kept + 1, layout.max_tokens)


def compute(
    state: GroupState, request_id: object, count: object, drafts: object = ()
) -> tuple[GroupState, tuple[Read, ...]]:
    """The forward pass over the next `count` known tokens and `drafts` (see the module); what it read."""
    rid = require_int("request id", request_id)
    n = require_int("count", count)
    proposed = require_tokens("drafts", drafts, 0)
    held = holding(state, rid)
    if held is None:
        raise refusals.unknown_request(rid)
    layout = state.layout
    require_pass(layout, rid, held.tokens, held.computed, held.drafts, n, proposed)
    start, written = held.computed, held.tokens + proposed
    end = start + n + len(proposed)
    state, held = _release_behind(state, held)
    reads = _reads(state, held)
    size = layout.page_size
    grow = [
        pages_for(end, size) - len(held.tables[g]) if isinstance(group, ATTENTION) else 0
        for g, group in enumerate(layout.groups)
    ]
    state, fresh = _take(state, sum(grow))
    tables = list(held.tables)
    for g, extra in enumerate(grow):
        tables[g] = tables[g] + tuple(fresh[:extra])
        fresh = fresh[extra:]
    for g, group in enumerate(layout.groups):
        if isinstance(group, Recurrent):
            state = _set_slot(state, state_slot(held.states, g), (g, written[:end]))
            continue
        for page in range(start // size, pages_for(end, size)):
            through = written[: min(end, (page + 1) * size)]
            state = _write_positions(state, g, tables[g][page], max(start, page * size), page * size, through)
    held = replace(held, computed=start + n, tables=tuple(tables), drafts=proposed)
    return _settle(state, held), reads


def _reads(state: GroupState, held: Held) -> tuple[Read, ...]:
    """What the pass's queries read of what was there before it: each attention group's kept
    positions before the first query, each recurrent group's state."""
    reads: list[Read] = []
    for g, group in enumerate(state.layout.groups):
        if isinstance(group, Recurrent):
            holds = state_holds(state.slots[state_slot(held.states, g)], g)
            reads.append(Read(g, held.computed - 1, holds))
            continue
        for position in range(first_read(group, held.computed), held.computed):
            page = held.tables[g][position // state.layout.page_size]
            reads.append(Read(g, position, holds_at(state.content[page], g, position)))
    return tuple(reads)


def _write_positions(state: GroupState, group: int, page: int, first: int, start: int, through: Tokens) -> GroupState:
    return _write(state, page, written_content(state.content[page], group, first, start, through))


def written_content(before: Content | None, group: int, first: int, start: int, through: Tokens) -> Content:
    """What a page (whose first position is `start`, holding `before`) holds once a pass wrote it
    from position `first` to the end of `through`, the tokens whose KV it computes; anything it
    held past them is gone. The positions before `first` keep what they held: when that was not
    the KV of `through` too, the page holds stale KV there (`UNWRITTEN` where it held nothing),
    and says so."""
    held = before[1] if before is not None and before[0] == group else ()
    if first == start or held[:first] == through[:first]:
        return group, through
    stale = held[:first] + (UNWRITTEN,) * (first - len(held[:first]))
    return group, stale + through[first:]


def accept(state: GroupState, request_id: object, accepted: object, token: object) -> GroupState:
    """The model kept the first `accepted` drafts and sampled `token` after them (see the module);
    with no drafts, after a pass over its last known token, it sampled `token` (`accepted` 0)."""
    rid = require_int("request id", request_id)
    kept = require_int("accepted", accepted)
    (sampled,) = require_tokens("token", (token,), 1)
    held = holding(state, rid)
    if held is None:
        raise refusals.unknown_request(rid)
    require_accept(state.layout, rid, held.tokens, held.computed, held.drafts, kept)
    tokens = held.tokens + held.drafts[:kept] + (sampled,)
    computed = held.computed + kept
    keep = pages_for(computed, state.layout.page_size)
    tables = list(held.tables)
    for g, group in enumerate(state.layout.groups):
        if isinstance(group, Recurrent):  # the state after the accepted tokens
            state = _set_slot(state, state_slot(held.states, g), (g, tokens[:computed]))
            continue
        for page in reversed(tables[g][keep:]):
            state = _release(state, page)
        tables[g] = tables[g][:keep]
    return _settle(state, Held(rid, tokens, computed, tuple(tables), held.states))


def _release_behind(state: GroupState, held: Held) -> tuple[GroupState, Held]:
    """As a pass begins: each window's (chunk's) pages wholly behind the pass's first query are
    let go, the null page in their place. Until then a request keeps the pages its last pass read,
    so the tables a call leaves are the ones the engine's pass reads through (vLLM's
    `remove_skipped_blocks`, at the next allocation)."""
    size = state.layout.page_size
    tables = list(held.tables)
    for g, group in enumerate(state.layout.groups):
        if isinstance(group, Recurrent):
            continue
        behind = first_kept(group, held.computed, size)
        for page in reversed(tables[g][:behind]):
            if page != NULL:
                state = _release(state, page)
        tables[g] = (NULL,) * min(behind, len(tables[g])) + tables[g][behind:]
    held = replace(held, tables=tuple(tables))
    return _put(state, held), held


def _settle(state: GroupState, held: Held) -> GroupState:
    """After a pass or an accept, over the accepted tokens: cache each full page and snapshot
    each state at a page boundary."""
    layout, size = state.layout, state.layout.page_size
    for g, group in enumerate(layout.groups):
        if isinstance(group, Recurrent):
            if layout.prefix_caching and held.computed % size == 0 and not held.drafts:
                state = _snapshot(state, g, held)
            continue
        if layout.prefix_caching:
            for page in range(held.computed // size):
                key, physical = page_key(g, held.tokens, page, size), held.tables[g][page]
                if physical != NULL and cached_page(state, key) is None and not is_cached(state, physical):
                    state = _retain(replace(state, cache=(*state.cache, Cached(physical, key))), physical)
    return _put(state, held)


def _snapshot(state: GroupState, group: int, held: Held) -> GroupState:
    """Keep a copy of the request's state under its tokens, if no snapshot has them and a slot
    is free (the least recently used snapshot gives its slot up)."""
    key = (group, held.tokens[: held.computed])
    slot = held.states[group]
    if held.computed == 0 or snapshot_of(state, key) is not None or slot is None:
        return state
    taken = _take_slot(state)
    if taken is None:
        return state
    state, copy = _pop_slot(taken, state.slots[slot])
    return replace(state, snapshots=(*state.snapshots, Snapshot(copy, key)))


def free(state: GroupState, request_id: object) -> GroupState:
    """The request lets go of every page and state slot it holds."""
    rid = require_int("request id", request_id)
    held = holding(state, rid)
    if held is None:
        raise refusals.unknown_request(rid)
    for table in held.tables:
        pages = [page for page in table if page != NULL]
        state = _use(state, reversed(pages))
        for page in pages:
            state = _release(state, page)
    for slot in held.states:
        if slot is not None:
            state = replace(_set_slot(state, slot, None), free_slots=(*state.free_slots, slot))
    return replace(state, requests=tuple(h for h in state.requests if h.request_id != rid))


# -- what always holds -------------------------------------------------------------------------------


def counts_are_holders(state: GroupState) -> bool:
    """Every page's count is its holders: each table entry of every group, and the cache."""
    holders = [0] * len(state.refs)
    for held in state.requests:
        for table in held.tables:
            for page in table:
                holders[page] += page != NULL
    for entry in state.cache:
        holders[entry.page] += 1
    return list(state.refs) == holders


def free_is_unheld(state: GroupState) -> bool:
    """The free stack holds every page nobody holds, once, and no other; the null page is never
    free, held or cached."""
    unheld = {page for page, n in enumerate(state.refs) if n == 0 and page != NULL}
    return len(set(state.free)) == len(state.free) and set(state.free) == unheld and state.refs[NULL] == 0


def cached_pages_hold_their_keys(state: GroupState) -> bool:
    """A page cached under (group, tokens) holds that group's KV of exactly those tokens; one
    page per key, one key per page."""
    return (
        all(state.content[entry.page] == entry.key for entry in state.cache)
        and len({entry.key for entry in state.cache}) == len(state.cache)
        and len({entry.page for entry in state.cache}) == len(state.cache)
    )


def tables_hold_their_tokens(state: GroupState) -> bool:
    """Each group's table of a request spans exactly the positions it wrote (accepted tokens and
    drafts); each page of it holds that group's KV of the request's tokens at every position it
    wrote there; pages it is still writing (a position at or past its accepted tokens) are its
    alone and uncached."""
    size = state.layout.page_size
    for held in state.requests:
        for g, group in enumerate(state.layout.groups):
            table = held.tables[g]
            if isinstance(group, Recurrent):
                if table:
                    return False
                continue
            if len(table) != pages_for(held.end, size):
                return False
            for index, page in enumerate(table):
                if page == NULL:
                    continue
                last = min(held.end, (index + 1) * size) - 1
                if holds_at(state.content[page], g, last) != held.written[: last + 1]:
                    return False
                if (index + 1) * size > held.computed and (state.refs[page] != 1 or is_cached(state, page)):
                    return False
    return True


def windows_keep_what_they_read(state: GroupState) -> bool:
    """A request's window (or chunk) table holds a real page wherever its next query may read and
    the null page only wholly behind it; and the pages wholly behind the first query of its last
    pass are null (released as that pass began; a pass and its accept advance a request by at
    most `step_tokens`)."""
    size, step = state.layout.page_size, state.layout.step_tokens
    for held in state.requests:
        for g, group in enumerate(state.layout.groups):
            if isinstance(group, Recurrent):
                continue
            behind = first_kept(group, held.computed, size)
            released = first_kept(group, max(0, held.computed - step), size)
            table = held.tables[g]
            if any(page != NULL for page in table[:released]) or NULL in table[behind:]:
                return False
    return True


def states_are_owned_once(state: GroupState) -> bool:
    """Every state slot is free, a request's state or a snapshot, exactly one of them; a request
    holds one slot per recurrent group, whose state has consumed its written tokens; a
    snapshot holds the state after exactly its key's tokens."""
    owners = list(state.free_slots) + [snap.slot for snap in state.snapshots]
    for held in state.requests:
        for g, group in enumerate(state.layout.groups):
            slot = held.states[g]
            if isinstance(group, Recurrent) != (slot is not None):
                return False
            if slot is not None:
                owners.append(slot)
                if state.slots[slot] != (g, held.written[: held.end]):
                    return False
    return (
        sorted(owners) == list(range(len(state.slots)))
        and all(state.slots[snap.slot] == snap.key for snap in state.snapshots)
        and len({snap.key for snap in state.snapshots}) == len(state.snapshots)
    )


GROUP_INVARIANTS = (
    counts_are_holders,
    free_is_unheld,
    cached_pages_hold_their_keys,
    tables_hold_their_tokens,
    windows_keep_what_they_read,
    states_are_owned_once,
)


class KvGroups:
    """The KV groups as an object: each call runs its transition on the stored state."""

    def __init__(self, layout: Layout) -> None:
        self.state = initial_groups(layout)

    def to_spec(self) -> GroupState:
        return self.state

    def _run(self, result: tuple[GroupState, R]) -> R:
        self.state = result[0]
        return result[1]

    def lookup(self, tokens: object) -> int:
        return lookup(self.state, tokens)

    def admit(self, request_id: object, tokens: object) -> int:
        return self._run(admit(self.state, request_id, tokens))

    def compute(self, request_id: object, count: object, drafts: object = ()) -> tuple[Read, ...]:
        return self._run(compute(self.state, request_id, count, drafts))

    def accept(self, request_id: object, accepted: object, token: object) -> None:
        self.state = accept(self.state, request_id, accepted, token)

    def free(self, request_id: object) -> None:
        self.state = free(self.state, request_id)
