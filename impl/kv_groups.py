"""The KV groups (`kvsched.spec.kv_groups`) over mutable state: the pool's counts, free stack and
contents as lists, its cache both ways as dicts (key to page; page to key, least recently used
first), the state slots likewise, each request's tables as lists.

Every call validates and sizes everything it needs before it changes anything, so a refusal
leaves the state as it was; `to_spec` is the abstraction function to the spec's `GroupState`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsched.spec import refusals
from kvsched.spec.domain import require_int
from kvsched.spec.kv_groups import (
    NULL,
    Cached,
    Content,
    GroupState,
    Held,
    Layout,
    Read,
    Recurrent,
    Snapshot,
    Tokens,
    first_kept,
    first_read,
    holds_at,
    pages_for,
    require_accept,
    require_layout,
    require_pass,
    require_tokens,
    state_holds,
    state_slot,
    written_content,
)


@dataclass(slots=True)
class Request:
    """A request's known tokens, computed count, tables, state slots and pending drafts."""

    tokens: Tokens
    computed: int
    tables: list[list[int]]
    states: list[int | None]
    drafts: Tokens = ()


class KvGroups:
    """impl's KV groups; the same API and refusals as the spec's."""

    def __init__(self, layout: Layout) -> None:
        self.layout = require_layout(layout)
        pages, slots = self.layout.pages, self.layout.state_slots
        self.refs = [0] * pages
        self.free_pages = list(reversed(range(1, pages)))
        self.content: list[Content | None] = [None] * pages
        self.page_of: dict[Content, int] = {}  # the cache: key to page
        self.key_of: dict[int, Content] = {}  # page to key, least recently used first
        self.slots: list[Content | None] = [None] * slots
        self.free_slots = list(reversed(range(slots)))
        self.snapshot_of: dict[Content, int] = {}  # key to slot
        self.snapshot_key: dict[int, Content] = {}  # slot to key, least recently used first
        self.requests: dict[int, Request] = {}
        self.recurrent = [isinstance(group, Recurrent) for group in self.layout.groups]

    def to_spec(self) -> GroupState:
        return GroupState(
            self.layout,
            tuple(self.refs),
            tuple(self.free_pages),
            tuple(self.content),
            tuple(Cached(page, key) for page, key in self.key_of.items()),
            tuple(self.slots),
            tuple(self.free_slots),
            tuple(Snapshot(slot, key) for slot, key in self.snapshot_key.items()),
            tuple(
                Held(rid, r.tokens, r.computed, tuple(map(tuple, r.tables)), tuple(r.states), r.drafts)
                for rid, r in sorted(self.requests.items())
            ),
        )

    # -- the pool and the slots -----------------------------------------------------------------------

    def _release(self, page: int) -> None:
        self.refs[page] -= 1
        if self.refs[page] == 0:
            self.free_pages.append(page)

    def _use(self, page: int) -> None:
        key_of = self.key_of
        if page in key_of:
            key_of[page] = key_of.pop(page)

    def _evictable(self) -> list[int]:
        refs = self.refs
        return [page for page in self.key_of if refs[page] == 1]

    def _require_pages(self, count: int, released: list[int]) -> None:
        """`Exhausted` unless `count` pages can be taken once `released` are let go (each then
        free, or evictable when only the cache still holds it)."""
        refs, key_of = self.refs, self.key_of
        gained = sum(refs[page] == 1 + (page in key_of) for page in released if page != NULL)
        available = len(self.free_pages) + len(self._evictable()) + gained
        if available < count:
            raise refusals.not_enough_free(count, available)

    def _take(self, count: int) -> list[int]:
        """`count` fresh pages (the caller made sure of them: `_require_pages`)."""
        victims = self._evictable()
        taken = []
        for _ in range(count):
            if not self.free_pages:
                page = victims.pop(0)
                del self.page_of[self.key_of.pop(page)]
                self._release(page)
            page = self.free_pages.pop()
            self.refs[page] = 1
            self.content[page] = None
            taken.append(page)
        return taken

    def _slot_free(self) -> bool:
        """A slot is free, or a snapshot can give its slot up."""
        return bool(self.free_slots or self.snapshot_key)

    def _pop_slot(self, content: Content | None) -> int:
        """The top free slot (the least recently used snapshot's, if none is free), holding `content`."""
        if not self.free_slots:
            oldest = next(iter(self.snapshot_key))
            del self.snapshot_of[self.snapshot_key.pop(oldest)]
            self.free_slots.append(oldest)
        slot = self.free_slots.pop()
        self.slots[slot] = content
        return slot

    # -- the operations ------------------------------------------------------------------------------

    def _group_hit(self, index: int, tokens: Tokens, length: int) -> list[int] | None:
        group, size = self.layout.groups[index], self.layout.page_size
        if isinstance(group, Recurrent):
            slot = self.snapshot_of.get((index, tokens[:length]))
            return [] if length == 0 else None if slot is None else [slot]
        table = [NULL] * first_kept(group, length, size)
        page_of = self.page_of
        for page in range(len(table), length // size):
            found = page_of.get((index, tokens[: (page + 1) * size]))
            if found is None:
                return None
            table.append(found)
        return table

    def _hit_length(self, tokens: Tokens) -> int:
        layout = self.layout
        if not layout.prefix_caching:
            return 0
        length = (len(tokens) - 1) // layout.page_size * layout.page_size
        groups = range(len(layout.groups))
        while length > 0 and any(self._group_hit(g, tokens, length) is None for g in groups):
            length -= layout.page_size
        return length

    def lookup(self, tokens: object) -> int:
        return self._hit_length(require_tokens("tokens", tokens, 1))

    def admit(self, request_id: object, tokens: object) -> int:
        rid = require_int("request id", request_id)
        known = require_tokens("tokens", tokens, 1)
        if len(known) > self.layout.max_tokens:
            raise refusals.too_many_tokens(rid, len(known), self.layout.max_tokens)
        if rid in self.requests:
            raise refusals.duplicate_request(rid)
        length = self._hit_length(known)
        hits = [self._group_hit(g, known, length) or [] for g in range(len(self.layout.groups))]
        recurrent = sum(self.recurrent)
        if recurrent and len(self.free_slots) + len(self.snapshot_key) < recurrent:
            raise refusals.no_state_slot(rid, len(self.slots))
        copies = {g: self.slots[hit[0]] for g, hit in enumerate(hits) if self.recurrent[g] and hit}
        tables: list[list[int]] = []
        states: list[int | None] = []
        for g, hit in enumerate(hits):
            if self.recurrent[g]:
                tables.append([])
                states.append(self._pop_slot(copies.get(g, (g, ()))))
                if hit and hit[0] in self.snapshot_key:
                    self.snapshot_key[hit[0]] = self.snapshot_key.pop(hit[0])
                continue
            for page in hit:
                if page != NULL:
                    self.refs[page] += 1
            for page in reversed(hit):
                if page != NULL:
                    self._use(page)
            tables.append(hit)
            states.append(None)
        self.requests[rid] = Request(known, length, tables, states)
        return length

    def compute(self, request_id: object, count: object, drafts: object = ()) -> tuple[Read, ...]:
        rid = require_int("request id", request_id)
        n = require_int("count", count)
        proposed = require_tokens("drafts", drafts, 0)
        held = self.requests.get(rid)
        if held is None:
            raise refusals.unknown_request(rid)
        layout = self.layout
        require_pass(layout, rid, held.tokens, held.computed, held.drafts, n, proposed)
        start, written = held.computed, held.tokens + proposed
        end, size = start + n + len(proposed), layout.page_size
        behind = [0 if self.recurrent[g] else first_kept(group, start, size) for g, group in enumerate(layout.groups)]
        grow = [0 if self.recurrent[g] else pages_for(end, size) - len(table) for g, table in enumerate(held.tables)]
        self._require_pages(sum(grow), [page for g, t in enumerate(held.tables) for page in t[: behind[g]]])
        for table, first in zip(held.tables, behind, strict=True):
            self._release_behind(table, first)
        reads = self._reads(held)
        fresh = self._take(sum(grow))
        for table, extra in zip(held.tables, grow, strict=True):
            table.extend(fresh[:extra])
            del fresh[:extra]
        for g, table in enumerate(held.tables):
            if self.recurrent[g]:
                self.slots[state_slot(held.states, g)] = (g, written[:end])
                continue
            for page in range(start // size, pages_for(end, size)):
                self._write(
                    g, table[page], max(start, page * size), page * size, written[: min(end, (page + 1) * size)]
                )
        held.computed, held.drafts = start + n, proposed
        self._settle(held)
        return reads

    def _reads(self, held: Request) -> tuple[Read, ...]:
        reads: list[Read] = []
        size, computed = self.layout.page_size, held.computed
        for g, group in enumerate(self.layout.groups):
            if self.recurrent[g]:
                content = self.slots[state_slot(held.states, g)]
                reads.append(Read(g, computed - 1, state_holds(content, g)))
                continue
            table = held.tables[g]
            for position in range(first_read(group, computed), computed):
                reads.append(Read(g, position, holds_at(self.content[table[position // size]], g, position)))
        return tuple(reads)

    def _write(self, group: int, page: int, first: int, start: int, through: Tokens) -> None:
        self.content[page] = written_content(self.content[page], group, first, start, through)

    def accept(self, request_id: object, accepted: object, token: object) -> None:
        rid = require_int("request id", request_id)
        kept = require_int("accepted", accepted)
        (sampled,) = require_tokens("token", (token,), 1)
        held = self.requests.get(rid)
        if held is None:
            raise refusals.unknown_request(rid)
        require_accept(self.layout, rid, held.tokens, held.computed, held.drafts, kept)
        tokens = held.tokens + held.drafts[:kept] + (sampled,)
        computed = held.computed + kept
        keep = pages_for(computed, self.layout.page_size)
        for g, table in enumerate(held.tables):
            if self.recurrent[g]:
                self.slots[state_slot(held.states, g)] = (g, tokens[:computed])
                continue
            self._truncate(g, table, keep)
        held.tokens, held.computed, held.drafts = tokens, computed, ()
        self._settle(held)

    def _settle(self, held: Request) -> None:
        """Cache the full accepted pages and snapshot the states at a page boundary (the spec's
        `_settle`)."""
        layout, size, computed = self.layout, self.layout.page_size, held.computed
        for g, table in enumerate(held.tables):
            if self.recurrent[g]:
                if self._snapshots_now(held):
                    self._snapshot(g, held)
                continue
            if layout.prefix_caching:
                page_of, key_of = self.page_of, self.key_of
                for page in range(computed // size):
                    key, physical = (g, held.tokens[: (page + 1) * size]), table[page]
                    if physical != NULL and key not in page_of and physical not in key_of:
                        page_of[key], key_of[physical] = physical, key
                        self.refs[physical] += 1

    # -- the seams a broken variant replaces (`kvsched.testing.group_variants`) ----------------------

    def _snapshots_now(self, held: Request) -> bool:
        """The request's states are snapshotted now: at a page boundary of its accepted tokens,
        no drafts pending."""
        layout = self.layout
        return layout.prefix_caching and held.computed % layout.page_size == 0 and not held.drafts

    def _release_behind(self, table: list[int], behind: int) -> None:
        """As a pass begins, a window's pages before `behind` (wholly behind its first query) are
        let go, the null page in their place (the spec's `_release_behind`)."""
        for page in reversed(table[:behind]):
            if page != NULL:
                self._release(page)
        table[:behind] = [NULL] * min(behind, len(table))

    def _truncate(self, group: int, table: list[int], keep: int) -> None:
        """Group `group`'s pages past the first `keep` (wholly rejected drafts) are let go."""
        for page in reversed(table[keep:]):
            self._release(page)
        del table[keep:]

    def _freed_tables(self, held: Request) -> list[list[int]]:
        """A freed request's tables, in the order their pages are let go."""
        return held.tables

    def _free_table(self, table: list[int]) -> None:
        """A freed request's table: its cached pages the most recently used (its first the
        most), then every page it holds let go."""
        pages = [page for page in table if page != NULL]
        for page in reversed(pages):
            self._use(page)
        for page in pages:
            self._release(page)

    def _snapshot(self, group: int, held: Request) -> None:
        key = (group, held.tokens[: held.computed])
        slot = held.states[group]
        if held.computed == 0 or key in self.snapshot_of or slot is None or not self._slot_free():
            return
        copy = self._pop_slot(self.slots[slot])
        self.snapshot_of[key], self.snapshot_key[copy] = copy, key

    def free(self, request_id: object) -> None:
        rid = require_int("request id", request_id)
        held = self.requests.pop(rid, None)
        if held is None:
            raise refusals.unknown_request(rid)
        for table in self._freed_tables(held):
            self._free_table(table)
        for slot in held.states:
            if slot is not None:
                self.slots[slot] = None
                self.free_slots.append(slot)
