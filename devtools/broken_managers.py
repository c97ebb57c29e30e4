"""Safety mode's corpus: page managers broken for one check each, and the calls that show it.

Each `BrokenManager` is an adapter factory with one planted fault, the engine's calls that
reach the fault (`drive`, on a `SafetyMachine`) and the check that must catch it; the correct
manager it derives from passes the same calls. Listed, with every other corpus, in
`tests/bugs/catalogue.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from devtools import cow_toy, offload_toy
from kvsched.spec.host_tier import Copy as HostCopy
from kvsched.spec.kv_events import Cleared, KvEvent, Removed, Stored
from kvsched.testing.adapter import ManagerFactory, PoolView
from kvsched.testing.adapters import kvsched_parts
from kvsched.testing.outcome import FailureKind
from kvsched.testing.safety import SafetyMachine
from kvsched.testing.safety_search import land_every_copy

Drive = Callable[[SafetyMachine], None]


class Broken(kvsched_parts.KvschedManager):
    """kvsched's parts with one planted fault, switched by name."""

    fault = ""
    lost: frozenset[int] = frozenset()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kept: dict[int, object] = {}  # (key_outlives) page -> the key it keeps after its eviction
        self.seen: dict[int, object] = {}  # (key_outlives) the pages cached when last viewed
        self.two_cached = 0  # (key_on_two_pages) the views read with two pages cached

    def admit(self, request_id: int, tokens: Any) -> int | None:
        if self.fault == "refusal_allocates" and self.pool.free_count() < -(-len(tokens) // self.page_size):
            self.pool.allocate()  # a page taken, and the admission refused anyway
            return None
        cached = super().admit(request_id, tokens)
        if self.fault == "full_hit" and cached is not None and cached + self.page_size >= len(tokens):
            return len(tokens)
        if self.fault == "unwritten_hit" and cached == 0 and len(tokens) > self.page_size:
            return self.page_size  # claims a hit on a page it just allocated
        return cached

    def revalidated(self, found: kvsched_parts.Found) -> list[int]:
        if self.fault == "commit_trusts_lookup":  # vLLM #37076: the pages a lookup found, pinned as found
            return list(found.pages)
        return super().revalidated(found)

    def _promoted_pair(self, host_page: int, page: int) -> tuple[int, int]:
        if self.fault == "promote_wrong_host_page":  # TRT-LLM #8813: another block's KV restored
            return min(self.host.to_spec().cache, key=lambda entry: entry.page).page, page
        others = sorted(held for table in self.view().tables.values() if page not in table for held in table)
        if self.fault == "promote_into_other" and others:  # SGLang #24527: the copy lands in another's page
            return host_page, others[0]
        return super()._promoted_pair(host_page, page)

    def commit(self, request_id: int, tokens: Any, found: kvsched_parts.Found) -> int | None:
        cached = super().commit(request_id, tokens, found)
        if self.fault == "promote_reclaimed" and self.promote(request_id):  # SGLang PR #38480
            self.host.reset()  # the host pages the promotion's copies read, reclaimed before they are made
        return cached

    def demote(self) -> list[tuple[int, int]]:
        pairs = super().demote()
        if self.fault == "demote_unwritten":  # SGLang PR #33970: a page copied before its KV is written
            for request_id, table in sorted(self.view().tables.items()):
                pairs += [(page, 0) for page in table[self.published[request_id] :][:1]]
        if self.fault == "host_freed_twice":  # TRT-LLM PR #12834: a host page taken, still counted free
            self.host._free += [host_page for _, host_page in pairs]
        return pairs

    def _complete_demotion(self, copy: HostCopy) -> None:
        if self.fault == "host_page_lost":  # TRT-LLM PR #12834: a host page taken, counted nowhere
            return
        # vLLM #53498: the copy made, its key never registered (the host page back on the free stack)
        self.host.complete(copy, self.fault != "demote_never_registers")

    def end_lease(self, lease: int) -> list[tuple[int, int]]:
        if self.fault == "save_never_registers":  # vLLM #53498 on the save side: copies made, never registered
            saving = self.saves.pop(lease)
            for page in self.leases.pop(lease):
                self.pool.release(page)
            return [(copy.page, copy.host_page) for copy in saving]
        held = self.leases[lease]
        pairs = super().end_lease(lease)
        if self.fault == "save_unwritten" and pairs:  # SGLang PR #33970: a page saved before its KV is written
            return [*pairs, (held[-1], pairs[-1][1])]
        if self.fault == "save_crossed" and len(pairs) >= 2:  # TRT-LLM #8813 on the store side
            (first, one), (second, other), *rest = pairs
            return [(first, other), (second, one), *rest]
        return pairs

    def append(self, request_id: int, token: int) -> bool:
        if self.fault == "no_copy":  # a fork's shared last page written in place
            self.scheduler.record_tokens(request_id, 1)
            self.tokens[request_id].append(token)
            return True
        return super().append(request_id, token)

    def events(self) -> list[KvEvent]:
        events = super().events()
        if self.fault == "reset_unpublished":  # an engine reset that publishes no AllBlocksCleared
            events = [event for event in events if not isinstance(event, Cleared)]
        if self.fault == "stored_after_removed":  # vLLM #49125: a removed block stored again
            events += [
                Stored(event.key, None, self.page_size, event.tier) for event in events if isinstance(event, Removed)
            ]
        return events

    def view(self) -> PoolView:
        view = super().view()
        tables = dict(view.tables)
        if self.fault == "key_on_two_pages" and len(view.cached) >= 2:  # once read right, the last page's key
            self.two_cached += 1  # is the first's: a key names a page of other content
            if self.two_cached > 1:
                return replace(view, cached={**view.cached, max(view.cached): view.cached[min(view.cached)]})
        if self.fault == "key_outlives":  # vLLM's stale pool: a cached page handed out keeps its key
            held = {page for table in tables.values() for page in table}
            kept = {**self.kept, **self.seen}.items()
            self.kept = {page: key for page, key in kept if page in held and page not in view.cached}
            self.seen = dict(view.cached)
            return replace(view, cached={**self.kept, **view.cached})
        if self.fault == "leak" and self.lost:
            return PoolView(view.holders, view.free - self.lost, tables, view.cached)
        if self.fault == "host_key_twice" and view.host and view.host_free:  # a key re-demoted, the old copy kept
            page, key = min(view.host.items(), key=lambda item: str(item[1]))
            spare = min(view.host_free)
            host = {**view.host, spare: key}
            return replace(view, host=host, host_free=view.host_free - {spare})
        if self.fault == "holder_count" and tables:
            page = next(iter(tables.values()))[0]
            holders = list(view.holders)
            holders[page] += 1
            return PoolView(tuple(holders), view.free, tables, view.cached)
        return view

    def free(self, request_id: int) -> None:
        if self.fault == "free_drops_leases":  # SGLang #24527, DingoCache #76: the reader's pages freed too
            pages = set(self.scheduler.page_table(request_id)) - {None}
            for held in self.leases.values():
                for page in [page for page in held if page in pages]:
                    held.remove(page)
                    self.pool.release(page)
        if self.fault == "leak":  # its first page is released but never offered again
            self.lost = frozenset(page for page in self.scheduler.page_table(request_id)[:1] if page is not None)
        super().free(request_id)


def broken(fault: str) -> Callable[[int, int], Broken]:
    """A factory of kvsched's parts with `fault` planted."""

    def factory(pages: int, page_size: int) -> Broken:
        manager = Broken(pages, page_size)
        manager.fault = fault
        return manager

    return factory


def both_submit_the_same(machine: SafetyMachine) -> None:
    machine.submit(1, (0, 0, 1, 1))
    machine.decode(1)
    machine.submit(2, (0, 0, 1, 1, 2))


def fill_then_refuse(machine: SafetyMachine) -> None:
    machine.submit(1, (0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2))
    machine.submit(2, (2, 2, 2, 2, 2, 2))


def finish_everything(machine: SafetyMachine) -> None:
    machine.submit(1, (0, 1, 2))
    machine.finish(1)
    machine.teardown()


def look_up_then_reuse_then_commit(machine: SafetyMachine) -> None:
    """A page found by a lookup is evicted and reused for another prompt before the commit."""
    machine.submit(1, (0, 1, 2))
    machine.finish(1)  # page 0 cached, only the cache holds it
    machine.lookup(2, (0, 1, 2))  # finds it
    machine.submit(3, (2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2))  # every page: it is evicted and rewritten
    machine.finish(3)
    machine.commit(2)


def lease_then_finish_then_reuse(machine: SafetyMachine) -> None:
    """A reader holds a request's pages; the request finishes; another request takes pages."""
    machine.submit(1, (0, 1, 2, 0, 1, 2))
    lease = machine.lease(1)
    machine.finish(1)
    machine.submit(2, (2,) * 16)  # every page: the leased ones too, if the lease did not keep them
    assert lease is not None
    machine.end_lease(lease)


def fork_then_decode_the_child(machine: SafetyMachine) -> None:
    machine.submit(1, (0, 1, 2))
    machine.fork(1, 2)
    machine.decode(2)


def fork_then_decode_the_parent(machine: SafetyMachine) -> None:
    """A request with a half-written last page forks; the parent decodes into it."""
    machine.submit(1, (0, 0, 1))
    machine.fork(1, 2)
    machine.decode(1)


def two_tenants_one_prompt(machine: SafetyMachine) -> None:
    """The same prompt from two tenants (request ids of two parities)."""
    machine.submit(1, (0, 0, 0, 0, 1))
    machine.submit(2, (0, 0, 0, 0, 1))


def fork_then_decode_with_nothing_free(machine: SafetyMachine) -> None:
    machine.submit(1, (0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2))  # every page
    machine.fork(1, 2)
    machine.decode(2)  # the copy-on-write copy finds no free page: refused


# Each factory by name, so a printed counterexample imports it (`devtools.broken_managers:NAME`).
full_hit = broken("full_hit")
unwritten_hit = broken("unwritten_hit")
holder_count = broken("holder_count")
refusal_allocates = broken("refusal_allocates")
leak = broken("leak")
no_copy = broken("no_copy")
stored_after_removed = broken("stored_after_removed")
reset_unpublished = broken("reset_unpublished")
key_outlives = broken("key_outlives")
key_on_two_pages = broken("key_on_two_pages")


def free_drops_leases(pages: int, page_size: int) -> Broken:
    """SGLang #24527's and DingoCache PR #76's shape: a finish frees the pages a reader still holds."""
    manager = broken("free_drops_leases")(pages, page_size)
    manager.capabilities = kvsched_parts.every_verb(pages, page_size).capabilities
    return manager


def commit_trusts_lookup(pages: int, page_size: int) -> Broken:
    """vLLM #37076's shape: a commit pins the pages its lookup found, without asking again."""
    manager = broken("commit_trusts_lookup")(pages, page_size)
    manager.capabilities = kvsched_parts.every_verb(pages, page_size).capabilities
    return manager


def promote_wrong_host_page(pages: int, page_size: int) -> Broken:
    """TRT-LLM #8813's shape: a page found in the host tier is restored from another host page."""
    manager = Broken(pages, page_size, host_pages=pages)
    manager.fault, manager.capabilities = "promote_wrong_host_page", kvsched_parts.tiered(pages, page_size).capabilities
    return manager


def save_two_pages(machine: SafetyMachine) -> None:
    """A save of a request with two full cached pages, ended; then every request finished."""
    machine.submit(1, (0, 1, 2, 0, 1))
    lease = machine.lease(1)
    assert lease is not None
    machine.end_lease(lease)
    machine.teardown()


def tiered_broken(
    fault: str, doc: str, correct: Callable[[int, int], kvsched_parts.KvschedManager] = kvsched_parts.tiered
) -> Callable[[int, int], Broken]:
    """A factory of kvsched's parts with a host tier (as `correct`: `kvsched_parts.tiered`, or
    `every_verb`, whose leases are saves) and `fault`."""

    def factory(pages: int, page_size: int) -> Broken:
        like = correct(pages, page_size)
        manager = Broken(pages, page_size, host_pages=like.host.pages)
        manager.fault, manager.capabilities = fault, like.capabilities
        return manager

    factory.__doc__ = doc
    return factory


demote_unwritten = tiered_broken(
    "demote_unwritten", "SGLang PR #33970's shape: a live request's page is copied out before its KV is written."
)
demote_never_registers = tiered_broken(
    "demote_never_registers", "vLLM #53498's shape: a demotion's copy is made, but the host never registers its key."
)
host_freed_twice = tiered_broken(
    "host_freed_twice", "TRT-LLM PR #12834's shape: a host page a demotion took stays counted as free."
)
host_page_lost = tiered_broken(
    "host_page_lost", "TRT-LLM PR #12834's other half: a host page a demotion took is counted nowhere."
)
host_key_twice = tiered_broken("host_key_twice", "A key demoted again to a second host page, the first one kept.")
promote_into_other = tiered_broken(
    "promote_into_other", "SGLang #24527's shape: a promotion's copy lands in a page another request holds."
)
promote_reclaimed = tiered_broken(
    "promote_reclaimed", "SGLang PR #38480's shape: the host pages a promotion reads are reclaimed mid-copy."
)


def demote_evict_then_return(machine: SafetyMachine) -> None:
    """Two prompts cached, both demoted, evicted by a third, then the second asked for again."""
    machine.submit(1, (0, 0, 0, 0, 1))
    machine.finish(1)
    machine.submit(2, (1, 1, 1, 1, 1))
    machine.finish(2)
    machine.demote()
    machine.submit(3, (2,) * 16)  # every page: the cached ones evicted
    machine.finish(3)
    machine.submit(4, (1, 1, 1, 1, 1))  # found in the host tier only


def demote_a_live_request(machine: SafetyMachine) -> None:
    """A live request with a partly written page, then a demotion."""
    machine.submit(1, (0, 0, 1))
    machine.demote()


def demote_one(machine: SafetyMachine) -> None:
    """A finished prompt's cached pages demoted."""
    machine.submit(1, (0, 0, 0, 0, 1))
    machine.finish(1)
    machine.demote()


def promote_beside_a_live_request(machine: SafetyMachine) -> None:
    """As `demote_evict_then_return`, with another request live when the host pages come back."""
    machine.submit(1, (0, 0, 0, 0, 1))
    machine.finish(1)
    machine.demote()
    machine.submit(3, (2,) * 16)  # every page: the cached ones evicted
    machine.finish(3)
    machine.submit(5, (7, 7, 7))
    machine.submit(4, (0, 0, 0, 0, 1))  # found in the host tier only


def lease_then_finish_then_fill(machine: SafetyMachine) -> None:
    """A lease on a request's pages; the request finishes; another takes every page; the lease reads."""
    machine.submit(1, (0, 0, 1))
    number = machine.lease(1)
    machine.finish(1)
    machine.submit(3, (2,) * (2 * machine.pages))
    assert number is not None
    machine.end_lease(number)


def load_then_reuse_then_hit(machine: SafetyMachine) -> None:
    """A prompt demoted and evicted, loaded back from the host, its pages then taken by another
    prompt, then the first prompt again."""
    fill = 2 * machine.pages
    machine.submit(1, (0, 0, 0, 0, 1))
    machine.finish(1)
    machine.demote()
    machine.submit(3, (2,) * fill)
    machine.finish(3)
    machine.submit(5, (0, 0, 0, 0, 1))  # loaded from the host
    machine.finish(5)
    machine.submit(7, (1,) * fill)
    machine.finish(7)
    machine.submit(9, (0, 0, 0, 0, 1))


def overfill_the_host_then_return(machine: SafetyMachine) -> None:
    """More prompts demoted than the host holds, every device page reused, then the first prompt again."""
    prompts = [(a, a, b, b, 1) for a in range(3) for b in range(3) if a != b]
    for number, prompt in enumerate(prompts, start=1):  # two tenants: twelve keys
        machine.submit(number, prompt)
        machine.finish(number)
        machine.demote()
    machine.submit(20, (1,) * (2 * machine.pages))
    machine.finish(20)
    machine.submit(21, prompts[0])  # request 1's tenant


def store_then_fill(machine: SafetyMachine) -> None:
    """A prompt's pages stored to the host; another prompt takes every page while the stores fly."""
    machine.submit(1, (0, 0, 0, 0, 1))
    machine.finish(1)
    machine.demote()
    machine.submit(3, (2,) * (2 * machine.pages))
    land_every_copy(machine)


def stores_fail(machine: SafetyMachine) -> None:
    """A prompt's pages stored to the host; every store fails."""
    machine.submit(1, (0, 0, 0, 0, 1))
    machine.finish(1)
    machine.demote()
    land_every_copy(machine, ok=False)


def store_and_evict(machine: SafetyMachine) -> None:
    """A prompt cached and stored to the host, then every device page taken by another prompt."""
    machine.submit(1, (0, 0, 0, 0, 1))
    machine.finish(1)
    machine.demote()
    land_every_copy(machine)
    machine.submit(3, (2,) * (2 * machine.pages))
    machine.finish(3)


def stored_evicted_then_loads_fail(machine: SafetyMachine) -> None:
    """A prompt stored and evicted; asked for again, its loads fail; it decodes, and the prompt
    comes once more."""
    store_and_evict(machine)
    machine.submit(5, (0, 0, 0, 0, 1))
    land_every_copy(machine, ok=False)
    machine.decode(5)
    machine.submit(7, (0, 0, 0, 0, 1))


def finished_while_loading(machine: SafetyMachine) -> None:
    """A prompt stored and evicted; asked for again and finished while its loads fly; another
    prompt takes every page."""
    store_and_evict(machine)
    machine.submit(5, (0, 0, 0, 0, 1))
    machine.finish(5)
    machine.submit(7, (1,) * (2 * machine.pages))


def cache_two_pages(machine: SafetyMachine) -> None:
    """A prompt of two whole pages and one token: both pages cached, then a token decoded (nothing
    read from them by a prefix hit)."""
    machine.submit(1, (0, 1, 2, 3, 4))
    machine.decode(1)


def cache_then_reset(machine: SafetyMachine) -> None:
    """A prompt cached, finished, then the cache reset."""
    machine.submit(1, (0, 1, 2))
    machine.finish(1)
    machine.reset_cache()


def cache_then_evict(machine: SafetyMachine) -> None:
    """A prompt cached, then evicted by one that needs every page."""
    machine.submit(1, (0, 1, 2))
    machine.finish(1)
    machine.submit(7, (1,) * (2 * machine.pages))


@dataclass(frozen=True)
class BrokenManager:
    """One planted fault: its factory, the correct factory it derives from, the calls that reach
    it and the check that must catch it."""

    name: str
    factory: ManagerFactory
    correct: ManagerFactory
    drive: Drive
    kind: FailureKind


MANAGERS: dict[str, BrokenManager] = {
    manager.name: manager
    for manager in (
        BrokenManager("full_hit", full_hit, kvsched_parts.manager, both_submit_the_same, FailureKind.FULL_HIT),
        BrokenManager("unwritten_hit", unwritten_hit, kvsched_parts.manager, both_submit_the_same, FailureKind.GHOST),
        BrokenManager("key_outlives", key_outlives, kvsched_parts.manager, cache_then_evict, FailureKind.GHOST),
        BrokenManager("key_on_two_pages", key_on_two_pages, kvsched_parts.manager, cache_two_pages, FailureKind.GHOST),
        BrokenManager("holder_count", holder_count, kvsched_parts.manager, both_submit_the_same, FailureKind.INVARIANT),
        BrokenManager(
            "refusal_allocates",
            refusal_allocates,
            kvsched_parts.manager,
            fill_then_refuse,
            FailureKind.ATOMICITY,
        ),
        BrokenManager("leak", leak, kvsched_parts.manager, finish_everything, FailureKind.LEAK),
        BrokenManager("no_copy", no_copy, kvsched_parts.manager, fork_then_decode_the_child, FailureKind.EXCLUSIVE),
        BrokenManager(
            "stored_after_removed", stored_after_removed, kvsched_parts.manager, cache_then_evict, FailureKind.EVENTS
        ),
        BrokenManager(
            "reset_unpublished", reset_unpublished, kvsched_parts.manager, cache_then_reset, FailureKind.EVENTS
        ),
        BrokenManager(
            "free_drops_leases",
            free_drops_leases,
            kvsched_parts.every_verb,
            lease_then_finish_then_reuse,
            FailureKind.GHOST,
        ),
        BrokenManager(
            "commit_trusts_lookup",
            commit_trusts_lookup,
            kvsched_parts.every_verb,
            look_up_then_reuse_then_commit,
            FailureKind.GHOST,
        ),
        BrokenManager(
            "promote_wrong_host_page",
            promote_wrong_host_page,
            kvsched_parts.tiered,
            demote_evict_then_return,
            FailureKind.GHOST,
        ),
        BrokenManager(
            "save_never_registers",
            tiered_broken(
                "save_never_registers",
                "vLLM #53498's shape: a save's copies made, never registered.",
                kvsched_parts.every_verb,
            ),
            kvsched_parts.every_verb,
            save_two_pages,
            FailureKind.INVARIANT,
        ),
        BrokenManager(
            "save_unwritten",
            tiered_broken(
                "save_unwritten",
                "SGLang PR #33970's shape: a save copies a page not yet written.",
                kvsched_parts.every_verb,
            ),
            kvsched_parts.every_verb,
            save_two_pages,
            FailureKind.INVARIANT,
        ),
        BrokenManager(
            "save_crossed",
            tiered_broken(
                "save_crossed",
                "TRT-LLM #8813's shape: a save copies two pages each into the other's.",
                kvsched_parts.every_verb,
            ),
            kvsched_parts.every_verb,
            save_two_pages,
            FailureKind.INVARIANT,
        ),
        BrokenManager(
            "demote_unwritten", demote_unwritten, kvsched_parts.tiered, demote_a_live_request, FailureKind.INVARIANT
        ),
        BrokenManager(
            "demote_never_registers",
            demote_never_registers,
            kvsched_parts.tiered,
            demote_one,
            FailureKind.INVARIANT,
        ),
        BrokenManager("host_freed_twice", host_freed_twice, kvsched_parts.tiered, demote_one, FailureKind.INVARIANT),
        BrokenManager("host_page_lost", host_page_lost, kvsched_parts.tiered, demote_one, FailureKind.INVARIANT),
        BrokenManager("host_key_twice", host_key_twice, kvsched_parts.tiered, demote_one, FailureKind.INVARIANT),
        BrokenManager(
            "promote_into_other",
            promote_into_other,
            kvsched_parts.tiered,
            promote_beside_a_live_request,
            FailureKind.EXCLUSIVE,
        ),
        BrokenManager(
            "promote_reclaimed",
            promote_reclaimed,
            kvsched_parts.tiered,
            demote_evict_then_return,
            FailureKind.GHOST,
        ),
        BrokenManager(
            "offload_cow_above_2",
            offload_toy.cow_above_2,
            offload_toy.correct,
            fork_then_decode_the_parent,
            FailureKind.EXCLUSIVE,
        ),
        BrokenManager(
            "offload_unsalted", offload_toy.unsalted, offload_toy.correct, two_tenants_one_prompt, FailureKind.GHOST
        ),
        BrokenManager(
            "offload_free_drops_leases",
            offload_toy.free_drops_leases,
            offload_toy.correct,
            lease_then_finish_then_fill,
            FailureKind.GHOST,
        ),
        BrokenManager(
            "offload_loaded_unkeyed",
            offload_toy.loaded_unkeyed,
            offload_toy.correct,
            load_then_reuse_then_hit,
            FailureKind.GHOST,
        ),
        BrokenManager(
            "offload_host_keeps_old_key",
            offload_toy.host_keeps_old_key,
            offload_toy.correct,
            overfill_the_host_then_return,
            FailureKind.GHOST,
        ),
        BrokenManager(
            "offload_store_unpinned",
            offload_toy.store_unpinned,
            offload_toy.asynchronous,
            store_then_fill,
            FailureKind.INVARIANT,
        ),
        BrokenManager(
            "offload_failed_store_keyed",
            offload_toy.failed_store_keyed,
            offload_toy.asynchronous,
            stores_fail,
            FailureKind.INVARIANT,
        ),
        BrokenManager(
            "offload_failed_load_cached",
            offload_toy.failed_load_cached,
            offload_toy.asynchronous,
            stored_evicted_then_loads_fail,
            FailureKind.INVARIANT,
        ),
        BrokenManager(
            "offload_freed_under_load",
            offload_toy.freed_under_load,
            offload_toy.asynchronous,
            finished_while_loading,
            FailureKind.INVARIANT,
        ),
        BrokenManager(
            "cow_in_place", cow_toy.in_place, cow_toy.correct, fork_then_decode_the_child, FailureKind.EXCLUSIVE
        ),
        BrokenManager(
            "cow_release_first",
            cow_toy.release_first,
            cow_toy.correct,
            fork_then_decode_with_nothing_free,
            FailureKind.ATOMICITY,
        ),
    )
}
