"""A foreign page manager in safety mode: its state as its adapter's view, the engine's calls as
events, what every view must satisfy, and its registration.

The state is what the adapter shows (`PoolView`) with the live requests' token counts; its
invariants (`view_problems`) hold for any correct manager whatever its policy; its own step check
is the atomicity of a refusal (with the "atomic" capability, a refused call leaves the view as it
was: a refusal is a return value here, not an exception). The harness's observations (ghost
reads, exclusive writes, a full prefix hit, a leak once everything is freed) are checked by
`kvsched.testing.safety.SafetyMachine` while it plays the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvsched.spec.kv_layout import Full, Group, Recurrent
from kvsched.testing.adapter import PoolView
from kvsched.testing.component import Component, Corpus, EventSpec, Harness, StepContext
from kvsched.testing.outcome import CheckFailure, FailureKind
from kvsched.testing.safety_states import state_problems

M, E, Z, C = Harness.MACHINE, Harness.EXPLORER, Harness.Z3, Harness.CONTRACTS


@dataclass(frozen=True, slots=True)
class ManagerState:
    """The manager as its view shows it, the live requests' token counts, and the pool's sizes."""

    view: PoolView
    live: tuple[tuple[int, int], ...]  # (request id, tokens), by request id
    pages: int
    page_size: int
    single_owner: bool = False  # the manager declared "single_owner": one owner a page
    groups: tuple[Group, ...] = ()  # with "groups": the manager's attention groups


@dataclass(frozen=True, slots=True)
class ManagerConfig:
    """What the harness told the manager, and what it declared it can do."""

    capabilities: frozenset[str]


# -- the engine's calls, as events (each `perform` is the harness's verb) ------------------------


@dataclass(frozen=True, slots=True)
class ManagerSubmit:
    """Admit a request with its prompt and prefill it."""

    request_id: int
    tokens: tuple[int, ...]

    def perform(self, machine: Any) -> Any:
        return machine.submit(self.request_id, self.tokens)


@dataclass(frozen=True, slots=True)
class ManagerDecode:
    """Sample a request's next token, make room for it, compute its KV."""

    request_id: int

    def perform(self, machine: Any) -> Any:
        return machine.decode(self.request_id)


@dataclass(frozen=True, slots=True)
class ManagerSpeculate:
    """Sample a request's next token and propose `drafts` tokens after it; one pass computes them
    all; the model keeps the first `accepted` drafts (capability "drafts")."""

    request_id: int
    drafts: int
    accepted: int

    def perform(self, machine: Any) -> Any:
        return machine.speculate(self.request_id, self.drafts, self.accepted)


@dataclass(frozen=True, slots=True)
class ManagerFinish:
    """A request finished: its pages are freed."""

    request_id: int

    def perform(self, machine: Any) -> Any:
        return machine.finish(self.request_id)


@dataclass(frozen=True, slots=True)
class ManagerPreempt:
    """Free a request's pages, keeping its tokens to resume it."""

    request_id: int

    def perform(self, machine: Any) -> Any:
        return machine.preempt(self.request_id)


@dataclass(frozen=True, slots=True)
class ManagerResume:
    """Readmit a preempted request with every token it had."""

    request_id: int

    def perform(self, machine: Any) -> Any:
        return machine.resume(self.request_id)


@dataclass(frozen=True, slots=True)
class ManagerFork:
    """A child shares its parent's pages and tokens."""

    parent: int
    child: int

    def perform(self, machine: Any) -> Any:
        return machine.fork(self.parent, self.child)


@dataclass(frozen=True, slots=True)
class ManagerLookup:
    """Look a prompt up for a request, to commit later (changes nothing)."""

    request_id: int
    tokens: tuple[int, ...]

    def perform(self, machine: Any) -> Any:
        return machine.lookup(self.request_id, self.tokens)


@dataclass(frozen=True, slots=True)
class ManagerCommit:
    """Admit a request with the answer of its earlier lookup, other calls having run since."""

    request_id: int

    def perform(self, machine: Any) -> Any:
        return machine.commit(self.request_id)


@dataclass(frozen=True, slots=True)
class ManagerLease:
    """An asynchronous reader takes hold of a request's pages as they are now."""

    request_id: int

    def perform(self, machine: Any) -> Any:
        return machine.lease(self.request_id)


@dataclass(frozen=True, slots=True)
class ManagerEndLease:
    """A reader reads the pages it holds, then lets go of them."""

    lease: int

    def perform(self, machine: Any) -> Any:
        return machine.end_lease(self.lease)


@dataclass(frozen=True, slots=True)
class ManagerDemote:
    """The manager copies cached pages it would evict next into its host tier."""

    def perform(self, machine: Any) -> Any:
        return machine.demote()


@dataclass(frozen=True, slots=True)
class ManagerComplete:
    """A copy in flight between the tiers ends, done or failed (capability "async_copies")."""

    copy_id: int
    ok: bool

    def perform(self, machine: Any) -> Any:
        return machine.complete_copy(self.copy_id, self.ok)


@dataclass(frozen=True, slots=True)
class ManagerReset:
    """Drop every cached page."""

    def perform(self, machine: Any) -> Any:
        return machine.reset_cache()


# The calls a manager may refuse, by the adapter verb that refuses them.
REFUSABLE: dict[type[Any], str] = {
    ManagerSubmit: "admit",
    ManagerDecode: "append",
    ManagerSpeculate: "speculate",
    ManagerResume: "admit",
    ManagerFork: "fork",
    ManagerCommit: "commit",
    ManagerLease: "lease",
}


# -- what every view satisfies -----------------------------------------------------------------


def view_problems(state: ManagerState) -> list[str]:
    """What is wrong with a view, whatever the manager's policy (empty when nothing is)."""
    view, pages, live = state.view, state.pages, dict(state.live)
    if len(view.holders) != pages:
        return [f"the view has {len(view.holders)} holder counts for {pages} pages"]
    tables = view.group_tables if state.groups else view.tables
    if set(tables) != set(live):
        return [f"tables for requests {sorted(tables)}, but the live requests are {sorted(live)}"]
    problems: list[str] = []
    counts = [0] * pages
    if state.groups:
        problems += group_problems(state, counts)
        problems += state_problems(view, state.groups, list(live))
    for request_id, table in () if state.groups else view.tables.items():
        needed = -(-live[request_id] // state.page_size)
        if len(table) < needed:
            problems.append(f"request {request_id} holds {len(table)} pages for {needed} pages of tokens")
        if len(set(table)) != len(table):
            problems.append(f"request {request_id} holds a page twice: {table}")
        for page in table:
            if not 0 <= page < pages or page in view.reserved:
                problems.append(f"request {request_id} holds page {page}, outside the pool")
                continue
            counts[page] += 1
    for page, (held, expected) in enumerate(zip(view.holders, counts, strict=True)):
        if page in view.reserved:  # never handed out: the manager may count it as it likes
            continue
        if held != expected:
            problems.append(f"page {page} counts {held} holders, but {expected} live tables hold it")
        if page in view.free and expected:
            problems.append(f"page {page} is free while {expected} requests hold it")
    if view.free & view.reserved:
        problems.append(f"reserved pages {sorted(view.free & view.reserved)} are free")
    problems += [
        f"page {page} is free while {n} leases hold it"
        for page, n in sorted(view.leased.items())
        if n and page in view.free
    ]
    problems += evictable_problems(view, counts)
    problems += host_problems(view)
    if state.single_owner:
        problems += owner_problems(view, counts, pages)
    return problems


def group_problems(state: ManagerState, counts: list[int]) -> list[str]:
    """With "groups": each live request has a table in every group, long enough for its tokens, and
    its attention groups' tables as long as each other (an entry for each page of positions, the
    null page where a group let one go); a full group's table holds real pages only; no page is in
    two of a request's tables. Counts each real entry into `counts`."""
    view, live, problems = state.view, dict(state.live), []
    for request_id, tables in view.group_tables.items():
        if len(tables) != len(state.groups):
            problems.append(f"request {request_id} has {len(tables)} tables for {len(state.groups)} groups")
            continue
        needed = -(-live[request_id] // state.page_size)
        spans = {
            len(table) for group, table in zip(state.groups, tables, strict=True) if not isinstance(group, Recurrent)
        }
        if len(spans) > 1:  # every group's table has an entry (a page, or the null one) for each page of positions
            problems.append(
                f"request {request_id}'s tables span different numbers of pages across its groups: {tables}"
            )
        real: list[int] = []
        for g, (group, table) in enumerate(zip(state.groups, tables, strict=True)):
            if isinstance(group, Recurrent):  # its states are in `view.states` (`state_problems`)
                if table:
                    problems.append(f"request {request_id} holds {table} in recurrent group {g}, which has no table")
                continue
            if len(table) < needed:
                problems.append(f"request {request_id} holds {len(table)} pages in group {g} for {needed} of tokens")
            for page in table:
                if page in view.reserved and not isinstance(group, Full):
                    continue  # a released page: no query reads it any more (the ghost reads check it)
                if not 0 <= page < state.pages or page in view.reserved:
                    problems.append(f"request {request_id} holds page {page} in group {g}, outside the pool")
                    continue
                real.append(page)
        if len(set(real)) != len(real):
            problems.append(f"request {request_id} holds a page twice across its groups: {tables}")
        for page in real:
            counts[page] += 1
    return problems


def host_problems(view: PoolView) -> list[str]:
    """The host tier, between calls: each of its pages holds one key, is free, or is being
    written by a save in flight: exactly one (the tier's free count is exact), and no key is on
    two host pages."""
    keys = list(view.host.values())
    problems = [
        f"host pages {sorted(page for page, key in view.host.items() if key == twice)} hold one key"
        for twice in {key for key in keys if keys.count(key) > 1}
    ]
    problems += [
        f"host page {page} is free while it holds key {view.host[page]!r}"
        for page in sorted(view.host_free & set(view.host))
    ]
    problems += [
        f"host page {page} is {'free' if page in view.host_free else 'keyed'} while a save in flight writes it"
        for page in sorted(view.host_pending & (view.host_free | set(view.host)))
    ]
    pages, named = set(range(view.host_pages)), view.host_free | set(view.host) | view.host_pending
    if pages - named:
        problems.append(f"host pages {sorted(pages - named)} are neither free nor hold a key: the tier lost them")
    if named - pages:
        problems.append(f"host pages {sorted(named - pages)} are outside the tier's {view.host_pages} pages")
    return problems


def evictable_problems(view: PoolView, counts: list[int]) -> list[str]:
    """An evictable page is a cached page no live table holds, and not free."""
    problems = [f"page {page} is evictable but not cached" for page in sorted(view.evictable - set(view.cached))]
    problems += [f"page {page} is evictable and free" for page in sorted(view.evictable & view.free)]
    problems += [f"page {page} is evictable while it is reserved" for page in sorted(view.evictable & view.reserved)]
    problems += [
        f"page {page} is evictable while {counts[page]} requests hold it"
        for page in sorted(view.evictable)
        if 0 <= page < len(counts) and counts[page]
    ]
    return problems


def owner_problems(view: PoolView, counts: list[int], pages: int) -> list[str]:
    """A single-owner pool: every page not reserved is free, cached (the tree's) or held by
    one request alone; a free page is not cached (freeing it took it from the tree)."""
    problems: list[str] = []
    for page in range(pages):
        if page in view.reserved:
            continue
        cached, free = page in view.cached, page in view.free
        if free and cached:
            problems.append(f"page {page} is free and still cached (two owners: the free list and the cache)")
        elif not free and not cached and not counts[page]:
            problems.append(f"page {page} is neither free, nor cached, nor held: no owner has it")
        elif not cached and counts[page] > 1:
            problems.append(f"page {page} is no cache's, yet {counts[page]} requests hold it as their own")
    return problems


def view_changes(before: PoolView, after: PoolView) -> str:
    """What differs between two views, field by field (only what changed)."""
    changes = [
        f"page {page} holders {old} -> {new}"
        for page, (old, new) in enumerate(zip(before.holders, after.holders, strict=False))
        if old != new
    ]
    if len(before.holders) != len(after.holders):
        changes.append(f"{len(before.holders)} -> {len(after.holders)} pages")
    if before.free - after.free:
        changes.append(f"pages {sorted(before.free - after.free)} no longer free")
    if after.free - before.free:
        changes.append(f"pages {sorted(after.free - before.free)} freed")
    for request_id in sorted(set(before.tables) | set(after.tables)):
        old, new = before.tables.get(request_id), after.tables.get(request_id)
        if old != new:
            changes.append(f"request {request_id} table {old} -> {new}")
    for request_id in sorted(set(before.group_tables) | set(after.group_tables)):
        old_groups, new_groups = before.group_tables.get(request_id), after.group_tables.get(request_id)
        if old_groups != new_groups:
            changes.append(f"request {request_id} group tables {old_groups} -> {new_groups}")
    for name in ("states", "snapshots", "state_free"):
        if getattr(before, name) != getattr(after, name):
            changes.append(f"{name.replace('_', ' ')} {getattr(before, name)} -> {getattr(after, name)}")
    dropped = {page for page, key in before.cached.items() if after.cached.get(page) != key}
    added = {page for page, key in after.cached.items() if before.cached.get(page) != key}
    if dropped:
        changes.append(f"pages {sorted(dropped)} uncached")
    if added:
        changes.append(f"pages {sorted(added)} cached")
    if before.reserved != after.reserved:
        changes.append(f"reserved {sorted(before.reserved)} -> {sorted(after.reserved)}")
    if before.evictable != after.evictable:
        changes.append(f"evictable {sorted(before.evictable)} -> {sorted(after.evictable)}")
    if before.leased != after.leased:
        changes.append(f"leased {dict(before.leased)} -> {dict(after.leased)}")
    if before.host != after.host:
        changes.append(f"host {dict(before.host)} -> {dict(after.host)}")
    if before.host_free != after.host_free:
        changes.append(f"host free {sorted(before.host_free)} -> {sorted(after.host_free)}")
    if before.host_pending != after.host_pending:
        changes.append(f"host pending {sorted(before.host_pending)} -> {sorted(after.host_pending)}")
    if before.in_flight != after.in_flight:
        changes.append(f"in flight {dict(before.in_flight)} -> {dict(after.in_flight)}")
    return "; ".join(changes)


def refusal_changes_nothing(step: StepContext) -> CheckFailure | None:
    """With the "atomic" capability, a refused call leaves the view as it was."""
    verb = REFUSABLE.get(type(step.event))
    refused = verb is not None and step.outcome.value is False
    if refused and "atomic" in step.config.capabilities and step.after.view != step.before.view:
        changes = view_changes(step.before.view, step.after.view)
        return CheckFailure(FailureKind.ATOMICITY, f"a refused {verb} changed the pool: {changes}")
    return None


SEARCHED = "safety mode searches programs of the engine's calls with hypothesis; it is this component's machine"
NO_MODEL = "a foreign manager has no model of its own to prove or search: only its view is checked"

MANAGER = Component(
    name="manager",
    summary="a foreign page manager in safety mode, through its adapter",
    state=ManagerState,
    events=(
        *(
            EventSpec(event)
            for event in (
                ManagerSubmit,
                ManagerDecode,
                ManagerSpeculate,
                ManagerFinish,
                ManagerPreempt,
                ManagerResume,
                ManagerFork,
                ManagerReset,
            )
        ),
        EventSpec(ManagerLookup, read_only=True),
        EventSpec(ManagerCommit),
        EventSpec(ManagerLease),
        EventSpec(ManagerEndLease),
        EventSpec(ManagerDemote),
        EventSpec(ManagerComplete),
    ),
    invariants=(),
    violations=view_problems,
    abstraction=lambda machine: machine.state(),
    checks=(refusal_changes_nothing,),
    corpora=(Corpus("manager", "devtools.broken_managers:MANAGERS"),),
    gaps={M: SEARCHED, E: NO_MODEL, Z: NO_MODEL, C: NO_MODEL},
)
