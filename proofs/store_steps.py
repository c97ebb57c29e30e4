"""The prefix store's steps (spec/prefix.py) as z3 functions: the store half of `Encoding`.

Lookups, where `publish` puts a set, making it visible (the replaced set goes in flight),
detaching an entry for `remove` and `reclaim`, and reclaim's choice of victim.
"""

from __future__ import annotations

from typing import Any

import z3

from kvsched.proofs.model import (
    NONE,
    Arr,
    Bool,
    Int,
    Sys,
    between,
    bound,
    empty_row,
    in_entries,
    in_pages,
    one_if,
)


class StoreSteps:
    """The prefix store's steps; `Encoding` inherits them."""

    def entry_found(self, s: Sys, entry: Any, identity: Any) -> Bool:
        """`identity` is published in `entry`."""
        return z3.And(in_entries(s, entry), s.elen[entry] > 0, s.eid[entry] == identity)

    def entry_absent(self, s: Sys, identity: Any) -> Bool:
        """`identity` is published nowhere."""
        (e,) = bound("absent_e")
        return z3.ForAll([e], z3.Not(z3.And(s.elen[e] > 0, s.eid[e] == identity)))

    def publish_guard(self, s: Sys, length: Any) -> Bool:
        """`PageCapacity` is checked before any retain."""
        return length <= s.capacity

    def publish_slot(self, s: Sys, entry: Any, identity: Any) -> tuple[Bool, Int]:
        """Where `publish` puts the set (same identity, else first empty, else round-robin)."""
        (e,) = bound("slot_e")
        absent = self.entry_absent(s, identity)
        first_empty = z3.And(
            in_entries(s, entry),
            s.elen[entry] == 0,
            z3.ForAll([e], z3.Implies(between(0, e, entry), s.elen[e] > 0)),
        )
        full = z3.ForAll([e], z3.Implies(in_entries(s, e), s.elen[e] > 0))
        round_robin = z3.And(in_entries(s, entry), full, entry == s.victim % s.entries)
        chosen = z3.Or(self.entry_found(s, entry, identity), z3.And(absent, z3.Or(first_empty, round_robin)))
        victim: Int = z3.If(z3.And(absent, full), s.victim + 1, s.victim)
        return chosen, victim

    def make_visible(
        self, s: Sys, entry: Any, identity: Any, pages: Arr, pages_pos: Arr, length: Any, tokens: Any, victim: Any
    ) -> Sys:
        """The new set becomes the entry's; the replaced set's references go in flight."""
        (p,) = bound("p")
        new = one_if(pages_pos[p] != NONE)
        old = one_if(s.epos[entry][p] != NONE)
        return s.with_(
            ent=z3.Store(s.ent, entry, pages),
            epos=z3.Store(s.epos, entry, pages_pos),
            elen=z3.Store(s.elen, entry, length),
            eid=z3.Store(s.eid, entry, identity),
            etok=z3.Store(s.etok, entry, tokens),
            eused=z3.Store(s.eused, entry, s.clock),
            clock=s.clock + 1,
            victim=victim,
            scnt=z3.Lambda([p], s.scnt[p] + new - old),
            pend=z3.Lambda([p], s.pend[p] - new + old),
        )

    def detach_entry(self, s: Sys, entry: Any) -> Sys:
        """remove / reclaim, first half: the entry is emptied and its pages are in flight."""
        (p,) = bound("p")
        member = one_if(s.epos[entry][p] != NONE)
        return s.with_(
            ent=z3.Store(s.ent, entry, empty_row()),
            epos=z3.Store(s.epos, entry, empty_row()),
            elen=z3.Store(s.elen, entry, 0),
            eid=z3.Store(s.eid, entry, 0),
            etok=z3.Store(s.etok, entry, 0),
            eused=z3.Store(s.eused, entry, 0),
            scnt=z3.Lambda([p], s.scnt[p] - member),
            pend=z3.Lambda([p], s.pend[p] + member),
        )

    def is_idle(self, s: Sys, entry: Any) -> Bool:
        """Only the store holds the entry's pages."""
        (i,) = bound("idle_i")
        page = s.ent[entry][i]
        in_pool_and_only_stored = z3.And(in_pages(s, page), s.refs[page] == s.scnt[page])
        return z3.And(
            in_entries(s, entry),
            s.elen[entry] > 0,
            z3.ForAll([i], z3.Implies(between(0, i, s.elen[entry]), in_pool_and_only_stored)),
        )

    def reclaim_victim(self, s: Sys, target: Any, entry: Any) -> Bool:
        """`reclaim` evicts `entry` next: too few free pages, and it is the LRU idle entry."""
        (e,) = bound("lru_e")
        earlier = z3.Or(s.eused[entry] < s.eused[e], z3.And(s.eused[entry] == s.eused[e], entry < e))
        return z3.And(
            s.top < target,
            self.is_idle(s, entry),
            z3.ForAll([e], z3.Implies(z3.And(self.is_idle(s, e), e != entry), earlier)),
        )

    def reclaim_stops(self, s: Sys, target: Any) -> Bool:
        """`reclaim` stops: enough free pages, or no idle entry left."""
        (e,) = bound("stop_e")
        return z3.Or(s.top >= target, z3.ForAll([e], z3.Not(self.is_idle(s, e))))
