"""Safety mode's copies in flight (capability "async_copies"): copies between the tiers that
outlive the call that started them, as engines make them.

A manager with "async_copies" makes no copy within a call: `demote` starts stores, an admission
that finds its prompt in the host tier starts loads into the request's pages, and any call may
start copies of its own (a store made while evicting, a prefetch). The view's `in_flight` lists
each from the call that started it; the harness completes or fails it between other calls, in
any order. The ghost KV moves when a copy completes, never when it starts, and reads what the
source holds then: a page reused while a copy still reads it sends its new owner's KV along.

Checked (`INVARIANT` unless said), after every call while a copy is in flight and when it ends:
- a store starts from a page cached under a key, a load from a host page that holds one;
- no page of a copy in flight is free, on either tier: it is never handed out (SGLang #24527's
  shape: an abort frees pages a copy still writes);
- a store's host page holds no key until it completes; a load's page is not cached until its load
  completes (a hit would read what is not there yet);
- a copy leaves `in_flight` only when the harness completes it, and never changes on the way;
- a store that completes leaves its host page under the page's key; a failed one leaves no key
  there (a later load would serve whatever the page held);
- a failed load leaves no cached claim on its page (Dynamo #15079, LMCache #5151: blocks a failed
  load left marked computed serve garbage), and `complete` says how many of its request's tokens
  are computed now; the harness computes the rest, reading only what the request's pages hold
  (`GHOST` for a claim the pages cannot back).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvsched.testing.adapter import PoolView
from kvsched.testing.checks import FailureKind

if TYPE_CHECKING:
    from kvsched.testing.safety import SafetyMachine


@dataclass(frozen=True, slots=True)
class Flight:
    """A copy in flight as the harness first saw it: its pages, its direction, the key it carries
    and, for a load into a request's page, that request."""

    page: int
    host_page: int
    to_host: bool
    key: object
    request_id: int | None

    def describe(self, copy_id: int) -> str:
        if self.to_host:
            return f"copy {copy_id} (page {self.page} to host page {self.host_page})"
        return f"copy {copy_id} (host page {self.host_page} to page {self.page})"


class CopiesInFlight:
    """The copies in flight a `SafetyMachine` has seen, checked after every call."""

    def __init__(self, machine: SafetyMachine) -> None:
        self.machine = machine
        self.flights: dict[int, Flight] = {}

    def loads_into(self, request_id: int) -> list[int]:
        """The copies in flight that load into `request_id`'s pages."""
        return [copy_id for copy_id, flight in self.flights.items() if flight.request_id == request_id]

    def orphan(self, request_id: int) -> None:
        """The request was freed: its loads in flight fill a page nobody waits for (its id may
        come back as another request's)."""
        for copy_id, flight in self.flights.items():
            if flight.request_id == request_id:
                self.flights[copy_id] = replace(flight, request_id=None)

    def observe(self, view: PoolView) -> None:
        """After a call: the copies it started, and every copy in flight still where it must be."""
        fail = self.machine._fail
        for copy_id, (page, host_page, to_host) in sorted(view.in_flight.items()):
            seen = self.flights.get(copy_id)
            if seen is not None:
                if (seen.page, seen.host_page, seen.to_host) != (page, host_page, bool(to_host)):
                    fail(FailureKind.INVARIANT, f"{seen.describe(copy_id)} changed while in flight")
                continue
            key = view.cached.get(page) if to_host else view.host.get(host_page)
            if key is None:
                what = f"page {page}, which is not cached" if to_host else f"host page {host_page}, which holds no key"
                fail(FailureKind.INVARIANT, f"copy {copy_id} {'stores' if to_host else 'loads'} {what}")
            owner = None if to_host else next((r for r, table in sorted(view.tables.items()) if page in table), None)
            self.flights[copy_id] = Flight(page, host_page, bool(to_host), key, owner)
        gone = sorted(set(self.flights) - set(view.in_flight))
        if gone:
            fail(FailureKind.INVARIANT, f"copies {gone} left the view's in_flight without completing")
        for copy_id, flight in sorted(self.flights.items()):
            what = flight.describe(copy_id)
            if flight.page in view.free:
                fail(FailureKind.INVARIANT, f"page {flight.page} is free while {what} is in flight")
            if flight.host_page in view.host_free:
                fail(FailureKind.INVARIANT, f"host page {flight.host_page} is free while {what} is in flight")
            if flight.to_host and flight.host_page in view.host:
                fail(FailureKind.INVARIANT, f"host page {flight.host_page} holds a key while {what} still writes it")
            if not flight.to_host and flight.page in view.cached:
                fail(FailureKind.INVARIANT, f"page {flight.page} is cached while {what} still writes it")

    def finish(self, copy_id: int, flight: Flight, ok: bool, result: Any, view: PoolView) -> None:
        """`flight` ended (`ok`, or failed), `complete` answered `result`, the view is `view`:
        move the ghost KV and check what the copy left."""
        machine = self.machine
        what = flight.describe(copy_id)
        if flight.to_host:
            if ok:
                machine.host_kv[flight.host_page] = dict(machine.kv.get(flight.page, {}))
                if view.host.get(flight.host_page) != flight.key:
                    machine._fail(FailureKind.INVARIANT, f"{what} completed, but its host page holds no page's key")
            else:
                machine.host_kv.pop(flight.host_page, None)
                if flight.host_page in view.host:
                    machine._fail(FailureKind.INVARIANT, f"{what} failed, but its host page holds a key")
            machine.coverage["demoted"] += ok
            return
        if ok:
            machine.kv[flight.page] = dict(machine.host_kv.get(flight.host_page, {}))
        else:
            machine.kv[flight.page] = {}  # whatever a failed copy left: nothing a read may rely on
            if flight.page in view.cached:
                machine._fail(FailureKind.INVARIANT, f"{what} failed, but its page is cached")
        machine.coverage["promoted"] += ok
        request_id = flight.request_id
        if request_id is None or request_id not in machine.loading:
            return
        if not isinstance(result, int) or isinstance(result, bool) or not 0 <= result <= machine.loading[request_id]:
            machine._fail(
                FailureKind.INVARIANT,
                f"{what} into request {request_id}'s page ended, and complete answered {result!r}: it must say"
                f" how many of the request's tokens are computed now (at most {machine.loading[request_id]})",
            )
        machine.loading[request_id] = result
        if not self.loads_into(request_id):
            machine.loaded(request_id)
