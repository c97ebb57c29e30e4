"""The stateful model-checking machine: any system under test, driven through every operation.

`KvschedMachine(factory, reference)` builds the system under test from `factory` and, unless
`reference` is None, a spec system beside it. Every rule builds events of the shared alphabet
(`kvsched.spec.events`) — valid, invalid (unknown ids, duplicates, out-of-range pages, exhausted
pools, full schedulers, double finishes, short buffers), out of domain, or fault-injected — and
runs each on both systems; `kvsched.testing.checks.check_step` checks every step (lockstep,
atomicity, typed errors, LIFO reuse, exclusive writes), and after every rule the invariants and
the ghost reads are checked; at teardown, liveness. A failure raises `CheckFailed`, naming its
kind, and prints the events that led to it.

`OwnershipAbuse` also releases pages their owners still count on, so the rollback paths of
`finish`, `release_all`, `publish` and `remove` run; there only lockstep and atomicity apply.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from kvsched.spec import PrefixIdentity
from kvsched.spec import events as ev
from kvsched.spec.slots import is_live
from kvsched.testing.harness import CampaignStats, MachineBase, prefix_history, prefix_identity
from kvsched.testing.rules_engine import EngineRules
from kvsched.testing.rules_owners import OwnerRules
from kvsched.testing.rules_requests import FORMS, RequestNumber, RequestRules, integer_as

__all__ = [
    "FORMS",
    "CampaignStats",
    "KvschedMachine",
    "MachineBase",
    "OwnershipAbuse",
    "RequestNumber",
    "integer_as",
    "prefix_history",
    "prefix_identity",
]


class KvschedMachine(RequestRules, EngineRules, OwnerRules):
    """Drives one system under test through every rule, in lockstep with the spec unless
    `reference` is None."""

    @initialize(pages=st.sampled_from([2, 1, 0]), keep=st.booleans(), last_page_holds=st.sampled_from([1, 0, 2]))
    def start_with_a_prefix(self, pages: int, keep: bool, last_page_holds: int) -> None:
        """Most programs start with a published prefix, so attach paths are exercised early;
        its last page may carry extra outside holds (a producer still writing it), which makes
        the pages' reference counts uneven."""
        for _ in range(pages):
            self.run(ev.Allocate())
        if pages:
            self.publish(prefix=0, pages=pages, tokens=pages * self.config.page_size - 1)
        if not keep:
            for page in self.external:
                self.run(ev.Release(page))
        if pages:
            for _ in range(last_page_holds):
                self.hold_prefix_page(pick=pages - 1)


class OwnershipAbuse(KvschedMachine):
    """The machine, releasing pages a table, a request or a store entry still counts on."""

    ownership = False

    @rule(pick=st.integers(0, 9))
    def release_from_an_owner(self, pick: int) -> None:
        """Drop a reference a request, a table or a store entry still counts on."""
        state = self.state()
        requests = [page for slot in state.scheduler.slots for page in slot.table if page is not None]
        others = [page for entry in state.store.entries if entry is not None for page in entry.page_set.pages]
        pages = sorted(requests) + sorted(others)  # mostly a request's page, so finish's rollback runs
        if pages:
            self.run(ev.Release(pages[pick % len(pages)]))

    @rule(pick=st.integers(0, 9), republish=st.booleans())
    def free_an_owner_with_a_stolen_page(self, pick: int, republish: bool) -> None:
        """Free the last page a request, table or store entry maps behind its back, then have the
        owner release everything (or republish the entry): its earlier pages drop to zero
        (pushed) before the stolen one fails, so the whole release must be undone in order."""
        state = self.state()
        owners: list[tuple[ev.Event, int]] = []
        for slot in state.scheduler.slots:
            mapped = [page for page in slot.table if page is not None]
            if is_live(slot) and mapped:
                owners.append((ev.Finish(slot.request_id), mapped[-1]))
        for index, table in enumerate(getattr(self.sut, "table_states", tuple)()):
            mapped = [page for page in table if page is not None]
            if mapped:
                owners.append((ev.TableRelease(index), mapped[-1]))
        for entry in state.store.entries:
            if entry is not None:
                identity: PrefixIdentity = entry.page_set.identity
                first = entry.page_set.pages[0]  # still held when the set has more than one page
                free: ev.Event = ev.Publish(identity, (first,), 1) if republish else ev.Remove(identity)
                owners.append((free, entry.page_set.pages[-1]))
        if not owners:
            return
        free_owner, page = owners[pick % len(owners)]
        for _ in range(self.ref_count(page) or 0):  # every reference: the page is free
            self.run(ev.Release(page))
        self.run(free_owner)
