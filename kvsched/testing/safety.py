"""Safety mode: what every correct page manager must do, checked through the adapter protocol.

`SafetyMachine(factory)` plays the engine over a `PageManager` (`kvsched.testing.adapter`): it
submits prompts, decodes, finishes, preempts and resumes, forks and resets the cache, and keeps a
ghost KV cache of its own. After each call the manager accepted, the harness writes the KV of
the positions the engine would compute, into the pages the manager's view says the request holds.
A slot's ghost value is the context its KV was computed from (the request's tokens up to and
including that position): causal attention makes a position's KV depend on everything before it.

Checked after every call (each failure a `CheckFailed` naming its `FailureKind`):
- INVARIANT: every page a live request holds is in range, not reserved, and held once per
  table; `holders[page]` equals the number of live tables holding it; a free page is held by
  nobody; exactly the live requests have tables.
- GHOST: every position a request reads (all before the one it computes) holds, in the page
  its table maps, the KV of exactly its own context (a prefix hit serves only such pages); and a
  key names the KV it was first seen cached over: every page cached under it holds that KV in
  the slots it then held, and no write changes such a slot of a page still cached under it (a
  key that outlives its content serves the next prompt KV the page no longer holds; not with
  "location_keys", whose keys name where a page sits).
- FULL_HIT: a prefix hit leaves at least one prompt token to compute (its logits are the
  next token's).
- EXCLUSIVE: a write lands only in a page no other live request holds.
- ATOMICITY (capability "atomic"): a refused `admit` or `append` leaves the view unchanged.
- LEAK (`teardown`): once every request is freed, every page not reserved is free or
  evictable (a cached page the manager reclaims by evicting it).
- With "single_owner" (INVARIANT, every step): each page has one owner, free, cached or one
  request's own; an evictable page is cached and held by no one.
- UNTYPED: a call into the manager raised (a crash, or the manager's own assertion).
- With "async_copies", the copies in flight between the tiers (`kvsched.testing.safety_copies`):
  neither page of one is free, a store's host page holds no key and a load's page is not cached
  until it completes, and a failed one leaves no claim (INVARIANT); the ghost KV moves when a
  copy completes.

Not checked: policy. Free order, placement, eviction order, which page is reused: a manager may
choose any, so a correct FIFO free list, tail-first release or a different eviction order pass.
Every call is recorded as source (`program`), so a counterexample is a runnable program over the
user's own factory.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from kvsched.spec.kv_events import DEVICE, HOST, Cleared, Entry, Removed, Stored, fold_counted
from kvsched.spec.kv_layout import Chunked, Full, Group, Recurrent, Window, first_read
from kvsched.testing.adapter import CAPABILITIES, ManagerFactory, PageManager, PoolView, tenant_of
from kvsched.testing.checks import CheckFailed, CheckFailure, FailureKind, Outcome, check_step
from kvsched.testing.components.manager import (
    MANAGER,
    ManagerCommit,
    ManagerComplete,
    ManagerConfig,
    ManagerDecode,
    ManagerDemote,
    ManagerEndLease,
    ManagerFinish,
    ManagerFork,
    ManagerLease,
    ManagerLookup,
    ManagerPreempt,
    ManagerReset,
    ManagerResume,
    ManagerSpeculate,
    ManagerState,
    ManagerSubmit,
    view_problems,
)
from kvsched.testing.safety_copies import CopiesInFlight
from kvsched.testing.safety_states import Copies, GhostStates

T = TypeVar("T")
Context = tuple[int, ...]  # the tokens up to a position (with "tenants": the tenant first)
VOCABULARY = 3  # decoded tokens: a small vocabulary makes prompts and pages repeat

# What a campaign exercised, counted over its calls the manager accepted (refusals apart): a
# check only covers what was exercised, so a result reports these and warns on a declared verb
# that never ran.
COVERAGE = (
    "admitted",  # admissions (submits and resumes)
    "hit_pages",  # pages an admission found cached
    "hit_tokens",  # prompt tokens an admission found computed
    "appended",  # decoded tokens
    "forked",  # forks
    "copied",  # copy-on-write copies the manager asked for
    "evicted",  # cached pages whose key an accepted call dropped or replaced (a reset's apart)
    "refused",  # admits, appends and forks the manager refused
    "freed",  # finishes and preemptions
    "reset",  # cache resets the manager accepted
    "committed",  # two-phase admissions the manager accepted (a lookup, other calls, then the commit)
    "leases_read",  # leases a reader read and ended (its pages' KV as they were when it began)
    "demoted",  # pages the manager copied to its host tier
    "promoted",  # pages an admission found in the host tier and copied back
    "saved",  # pages an ended lease's save copied into the host tier
    "drafted",  # draft tokens proposed in passes the manager accepted
    "rejected",  # draft tokens the model rejected
    "state_copies",  # recurrent-state copies the manager asked for (a hit's snapshot, a snapshot taken)
)


# One `CheckFailed` subclass per check: hypothesis shrinks a failure only towards failures of the
# same exception type, so a counterexample keeps the check it was found by.
FAILED: dict[FailureKind, type[CheckFailed]] = {
    kind: type(f"{kind.name.title().replace('_', '')}Failed", (CheckFailed,), {"__module__": __name__})
    for kind in FailureKind
}


NOT_LOOKED_UP = object()  # an admission in one phase: `admit`, not `commit`


class NotAnAdapter(TypeError):
    """The factory built something that is not a `PageManager` adapter."""


class BadCapabilities(NotAnAdapter, ValueError):
    """The adapter declares a capability the harness does not know, or half of a pair."""


VERBS = ("admit", "append", "written", "free", "view")
OPTIONAL_VERBS = {
    "fork": "fork",
    "copy_on_write": "copies",
    "reset_cache": "reset_cache",
    "lookup": "lookup",
    "commit": "commit",
    "lease": "lease",
    "end_lease": "end_lease",
    "demote": "demote",
    "promote": "promote",
    "async_copies": "complete",
    "events": "events",
    "drafts": "speculate",
}
PAIRS = ({"lookup", "commit"}, {"lease", "end_lease"}, {"demote", "promote"})  # declared together or not at all
ONE_TABLE = frozenset({"fork", "copy_on_write", "lease", "demote"})  # verbs that name one table a request


def declared_capabilities(manager: object) -> frozenset[str]:
    """The capabilities `manager` declares: any set, list or tuple of the names in
    `CAPABILITIES`, pairs whole; a one-line `NotAnAdapter` (`BadCapabilities`) otherwise."""
    name = type(manager).__name__
    declared = getattr(manager, "capabilities", None)
    if not isinstance(declared, frozenset | set | list | tuple) or not all(isinstance(c, str) for c in declared):
        raise NotAnAdapter(
            f"{name}.capabilities must be a frozenset of capability names, not {type(declared).__name__}"
            f" {declared!r:.60}"
        )
    capabilities = frozenset(declared)
    unknown = capabilities - CAPABILITIES
    if unknown:
        raise BadCapabilities(
            f"{name} declares unknown capabilities {sorted(unknown)}; the harness knows {sorted(CAPABILITIES)}"
        )
    for pair in PAIRS:
        if len(capabilities & pair) == 1:
            raise BadCapabilities(
                f"{name} declares {sorted(capabilities & pair)} alone: capabilities {sorted(pair)} go together"
            )
    if "async_copies" in capabilities and not {"demote", "promote"} <= capabilities:
        raise BadCapabilities(f"{name} declares 'async_copies' without 'demote' and 'promote': copies need a host tier")
    one_table = capabilities & ONE_TABLE
    if "groups" in capabilities and one_table:
        raise BadCapabilities(
            f"{name} declares 'groups' with {sorted(one_table)}: their verbs name one table a request"
        )
    return capabilities


def declared_groups(manager: object) -> tuple[Group, ...]:
    """The groups a manager declaring "groups" names: a tuple of `Full`, `Window`, `Chunked` and
    `Recurrent` (`kvsched.spec.kv_layout`) with at least one attention group, and with a recurrent
    one, the verb `state_copies`; a one-line `NotAnAdapter` otherwise."""
    groups = getattr(manager, "groups", None)
    name = type(manager).__name__
    kinds = Full | Window | Chunked | Recurrent
    if (
        not isinstance(groups, tuple)
        or not all(isinstance(g, kinds) for g in groups)
        or all(isinstance(g, Recurrent) for g in groups)  # no attention group (an empty tuple included)
    ):
        raise NotAnAdapter(
            f"{name} declares 'groups', so its groups must be a tuple of kvsched.spec.kv_layout's Full,"
            f" Window, Chunked and Recurrent, one of them an attention group, not {groups!r:.80}"
        )
    if any(isinstance(g, Recurrent) for g in groups) and not callable(getattr(manager, "state_copies", None)):
        raise NotAnAdapter(f"{name} is not a page-manager adapter: it lacks state_copies (its Recurrent group's verb)")
    return groups


def require_adapter(manager: object) -> frozenset[str]:
    """The capabilities `manager` declares, once it is an adapter; a one-line `NotAnAdapter`
    naming what it lacks of the adapter protocol, or what is wrong with its capabilities."""
    missing = [verb for verb in VERBS if not callable(getattr(manager, verb, None))]
    if not hasattr(manager, "capabilities"):
        missing.append("capabilities")
    if missing:
        raise NotAnAdapter(
            f"{type(manager).__name__} is not a page-manager adapter: it lacks {', '.join(missing)}"
            " (wrap your manager in an adapter: kvsched.testing.adapter)"
        )
    declared = declared_capabilities(manager)
    missing = [
        f"{verb} (declared by capability {capability!r})"
        for capability, verb in OPTIONAL_VERBS.items()
        if capability in declared and not callable(getattr(manager, verb, None))
    ]
    if missing:
        raise NotAnAdapter(f"{type(manager).__name__} is not a page-manager adapter: it lacks {', '.join(missing)}")
    if "drafts" in declared and not callable(getattr(manager, "accept", None)):
        raise NotAnAdapter(
            f"{type(manager).__name__} is not a page-manager adapter: it lacks accept (declared by capability 'drafts')"
        )
    if "groups" in declared:
        declared_groups(manager)
    return declared


def require_view(manager: object) -> None:
    """A fresh adapter's `view()` is a `PoolView` of plain ints; a one-line `NotAnAdapter` naming
    the first field that is not."""
    adapter: Any = manager
    try:
        view = adapter.view()
    except Exception as error:
        raise NotAnAdapter(f"{type(manager).__name__}.view() raised {type(error).__name__}: {error}") from error
    problem = view_shape_problem(view)
    if problem is not None:
        raise NotAnAdapter(f"{type(manager).__name__}.view() {problem}")


def view_shape_problem(view: object) -> str | None:
    """What keeps `view` from being read as a `PoolView` of plain ints, or None."""
    if not isinstance(view, PoolView):
        return f"returned {type(view).__name__}, not a kvsched.testing.PoolView"
    sets = ("free", "reserved", "evictable", "host_free", "host_pending", "state_free")
    maps = ("tables", "cached", "leased", "host", "in_flight", "states", "snapshots")
    for name in ("holders", *sets):
        value = getattr(view, name)
        if not isinstance(value, tuple | list | set | frozenset) or not all(_is_int(v) for v in value):
            return f"returned a PoolView whose {name} is {type(value).__name__} {value!r:.60}, not ints"
    for name in maps:
        value = getattr(view, name)
        if not isinstance(value, Mapping) or not all(_is_int(k) for k in value):
            return f"returned a PoolView whose {name} is {type(value).__name__} {value!r:.60}, not a mapping by page"
    for request_id, table in view.tables.items():
        if not isinstance(table, tuple | list) or not all(_is_int(page) for page in table):
            return f"returned a PoolView whose table of request {request_id} is {table!r:.60}, not a tuple of pages"
    if not isinstance(view.group_tables, Mapping) or not all(_is_int(k) for k in view.group_tables):
        return f"returned a PoolView whose group_tables is {view.group_tables!r:.60}, not a mapping by request"
    for request_id, tables in view.group_tables.items():
        if not isinstance(tables, tuple | list) or not all(
            isinstance(table, tuple | list) and all(_is_int(page) for page in table) for table in tables
        ):
            return f"returned a PoolView whose group tables of request {request_id} are {tables!r:.60}, not page tuples"
    for request_id, slots in view.states.items():
        if not isinstance(slots, tuple | list) or not all(_is_int(slot) for slot in slots):
            return f"returned a PoolView whose states of request {request_id} are {slots!r:.60}, not slot tuples"
    counts = (view.host_pages, view.state_slots)
    if not all(_is_int(count) for count in (*view.leased.values(), *counts)):
        return "returned a PoolView whose leased counts, host_pages or state_slots are not ints"
    for copy_id, copy in view.in_flight.items():
        if not (isinstance(copy, tuple) and len(copy) == 3 and _is_int(copy[0]) and _is_int(copy[1])):
            return f"returned a PoolView whose in_flight copy {copy_id} is {copy!r:.60}, not (page, host page, to host)"
    for name in sets:
        if not isinstance(getattr(view, name), set | frozenset):
            return f"returned a PoolView whose {name} is a {type(getattr(view, name)).__name__}, not a frozenset"
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Guarded:
    """The manager, each call's exception (but the harness's own) turned into a failed check:
    a page manager that crashes, or trips its own assertion, has a bug the harness names. The
    owner is marked failed first, so nothing runs after the failure (no teardown check)."""

    def __init__(self, manager: PageManager, owner: SafetyMachine) -> None:
        self._manager, self._owner = manager, owner

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._manager, name)
        if not callable(value):
            return value

        def call(*args: Any) -> Any:
            try:
                result = value(*args)
            except CheckFailed:
                raise
            except Exception as error:
                detail = f"the manager's {name}{args!r} raised {type(error).__name__}: {error}"
                self._owner.failed = True
                raise FAILED[FailureKind.UNTYPED](CheckFailure(FailureKind.UNTYPED, detail)) from error
            problem = view_shape_problem(result) if name == "view" else None
            if problem is not None:  # read only through a well-formed view, never a crash of the harness's own
                self._owner._fail(FailureKind.INVARIANT, f"{type(self._manager).__name__}.view() {problem}")
            return result

        return call


def next_token(tokens: Sequence[int]) -> int:
    """The harness model's next token: a fixed function of the whole sequence."""
    return (sum(tokens) * 7 + len(tokens)) % VOCABULARY


class SafetyMachine:
    """The engine side of safety mode over one fresh manager; see the module docstring."""

    def __init__(self, factory: ManagerFactory, pages: int = 8, page_size: int = 2, *, check: bool = True) -> None:
        manager = factory(pages, page_size)
        self.capabilities = require_adapter(manager)
        self.groups = declared_groups(manager) if "groups" in self.capabilities else ()
        self.failed = False
        self.manager: Any = _Guarded(manager, self)
        self.pages, self.page_size = pages, page_size
        self.sequences: dict[int, list[int]] = {}  # live request -> its tokens, every one computed
        self.preempted: dict[int, list[int]] = {}  # preempted request -> the tokens it resumes with
        self.tenants: dict[int, int] = {}  # request -> its tenant (tenant_of its id; a child's, its parent's)
        self.answers: dict[int, tuple[list[int], object]] = {}  # looked-up request -> its prompt, the answer
        # number -> lease, the KV it saw, the keys its cached pages had when it began
        self.leases: dict[int, tuple[object, dict[int, dict[int, Context]], dict[int, object]]] = {}
        self.kv: dict[int, dict[int, Context]] = {}  # ghost KV: page -> slot -> the context written there
        self.host_kv: dict[int, dict[int, Context]] = {}  # the host tier's ghost KV, likewise
        self.program: list[str] = []
        self.coverage: Counter[str] = Counter({name: 0 for name in COVERAGE})
        self.config = ManagerConfig(self.capabilities)
        self.copies = CopiesInFlight(self) if "async_copies" in self.capabilities else None
        self.states = GhostStates(self, self.groups)
        self.loading: dict[int, int] = {}  # request whose pages are loading -> its tokens computed so far
        self.published: Counter[Entry] = Counter()  # the manager's KV events so far, folded (with "events")
        self.key_kv: dict[object, dict[int, Context]] = {}  # cache key -> its slots' KV when first seen cached
        if check:
            self.check_start()

    def check_start(self) -> None:
        """The fresh manager's view must already hold the invariants (a dummy page in the free
        list, say, fails here); the constructor checks it unless told not to."""
        view = self.manager.view()
        self._require_valid(view)
        self._events(view)
        self._keys(view)

    # -- the verbs ------------------------------------------------------------------------------

    def submit(self, request_id: int, tokens: Sequence[int]) -> bool:
        """Admit a new request with prompt `tokens` and prefill it; False when refused."""
        self._record(f"machine.submit({request_id}, {tuple(tokens)!r})")
        if request_id in self.sequences or request_id in self.preempted or not tokens:
            raise ValueError(f"request {request_id} is live or preempted, or its prompt is empty")
        return self._step(ManagerSubmit(request_id, tuple(tokens)), lambda: self._admit(request_id, list(tokens)))

    def decode(self, request_id: int) -> bool:
        """Sample the request's next token, make room for it, and compute its KV; False when
        the manager refuses (no page for it)."""
        self._record(f"machine.decode({request_id})")
        tokens = self._ready(request_id)
        return self._step(ManagerDecode(request_id), lambda: self._append(request_id, tokens))

    def _append(self, request_id: int, tokens: list[int]) -> bool:
        token = next_token(tokens)
        if not self.manager.append(request_id, token):
            self.coverage["refused"] += 1
            return False
        tokens.append(token)
        if "copy_on_write" in self.capabilities:
            for source, destination in getattr(self.manager, "copies")():  # noqa: B009
                self.kv[destination] = dict(self.kv.get(source, {}))
                self.coverage["copied"] += 1
        view = self.manager.view()
        self._require_valid(view)
        with self._state_copies(request_id, view):
            self._compute(request_id, view, len(tokens) - 1)
        self.coverage["appended"] += 1
        return True

    def speculate(self, request_id: int, drafts: int, accepted: int) -> bool:
        """Speculative decoding (capability "drafts"): sample the request's next token and propose
        `drafts` tokens after it, the first `accepted` the model's own next tokens and the next
        one not (a rejection); one pass computes them all, then the model keeps the first
        `accepted`. False when the manager refuses room for them."""
        self._record(f"machine.speculate({request_id}, {drafts}, {accepted})")
        tokens = self._ready(request_id)
        if "drafts" not in self.capabilities or not 0 <= accepted <= drafts or drafts < 1:
            raise ValueError(f"no drafts capability, or {accepted} of {drafts} drafts cannot be kept")
        event = ManagerSpeculate(request_id, drafts, accepted)
        return self._step(event, lambda: self._speculate(request_id, tokens, drafts, accepted))

    def _speculate(self, request_id: int, tokens: list[int], drafts: int, accepted: int) -> bool:
        proposed = [*tokens, next_token(tokens)]
        for index in range(drafts):
            right = next_token(proposed)
            proposed.append(right if index < accepted else (right + 1) % VOCABULARY)
        first = len(tokens)
        if not getattr(self.manager, "speculate")(request_id, proposed[first], tuple(proposed[first + 1 :])):  # noqa: B009
            self.coverage["refused"] += 1
            return False
        self.sequences[request_id] = proposed  # while the pass runs: its tables must hold every draft
        view = self.manager.view()
        self._require_valid(view)
        with self._state_copies(request_id, view):
            for position in range(first, len(proposed)):
                self._compute(request_id, view, position, publish=position == first)
        kept = proposed[: first + 1 + accepted]
        self.sequences[request_id] = kept
        getattr(self.manager, "accept")(request_id, accepted)  # noqa: B009
        view = self.manager.view()
        self._require_valid(view)
        self.states.pick(request_id, view, len(kept) - 1, self._state_context(request_id))
        if accepted:
            self._written(request_id, len(kept), view)
        self.coverage["appended"] += 1 + accepted
        self.coverage["drafted"] += drafts
        self.coverage["rejected"] += drafts - accepted
        return True

    def finish(self, request_id: int) -> None:
        """The request is done: the manager frees its pages."""
        self._record(f"machine.finish({request_id})")
        self._live(request_id)
        self._step(ManagerFinish(request_id), lambda: self._free(request_id))
        self.tenants.pop(request_id, None)  # the id may come back, as its own tenant's

    def _free(self, request_id: int) -> None:
        self.manager.free(request_id)
        del self.sequences[request_id]
        self.loading.pop(request_id, None)
        if self.copies is not None:  # its loads still in flight end as the harness says, no one's
            self.copies.orphan(request_id)
        self.coverage["freed"] += 1

    def preempt(self, request_id: int) -> None:
        """Free the request's pages, keeping its tokens to resume it later (recomputed)."""
        self._record(f"machine.preempt({request_id})")
        tokens = self._live(request_id)
        self._step(ManagerPreempt(request_id), lambda: self._free(request_id))
        self.preempted[request_id] = tokens

    def resume(self, request_id: int) -> bool:
        """Readmit a preempted request with every token it had; False when refused."""
        self._record(f"machine.resume({request_id})")
        tokens = self.preempted.get(request_id)
        if tokens is None:
            raise ValueError(f"request {request_id} is not preempted")
        if self._step(ManagerResume(request_id), lambda: self._admit(request_id, tokens)):
            del self.preempted[request_id]
            return True
        return False

    def fork(self, parent_id: int, child_id: int) -> bool:
        """The child shares the parent's pages and tokens (capability "fork")."""
        self._record(f"machine.fork({parent_id}, {child_id})")
        tokens = self._ready(parent_id)
        if "fork" not in self.capabilities or child_id in self.sequences or child_id in self.preempted:
            raise ValueError(f"no fork capability, or request {child_id} exists")
        return self._step(ManagerFork(parent_id, child_id), lambda: self._fork(parent_id, child_id, tokens))

    def _fork(self, parent_id: int, child_id: int, tokens: list[int]) -> bool:
        fork = getattr(self.manager, "fork")  # noqa: B009  (optional: not in the protocol)
        if not fork(parent_id, child_id):
            self.coverage["refused"] += 1
            return False
        self.sequences[child_id] = list(tokens)
        self.tenants[child_id] = self.tenants[parent_id]
        self.coverage["forked"] += 1
        return True

    def reset_cache(self) -> bool:
        """Drop every cached page (capability "reset_cache"); the manager may refuse."""
        self._record("machine.reset_cache()")
        if "reset_cache" not in self.capabilities:
            raise ValueError("no reset_cache capability")
        done: bool = self._step(ManagerReset(), lambda: bool(getattr(self.manager, "reset_cache")()))  # noqa: B009
        self.coverage["reset"] += done
        return done

    def lookup(self, request_id: int, tokens: Sequence[int]) -> None:
        """The first phase of a two-phase admission (capabilities "lookup" and "commit"): the
        manager's answer for the prompt, kept for `commit`; the call must change nothing."""
        self._record(f"machine.lookup({request_id}, {tuple(tokens)!r})")
        if "lookup" not in self.capabilities:
            raise ValueError("no lookup capability")
        if request_id in self.sequences or request_id in self.preempted or not tokens:
            raise ValueError(f"request {request_id} is live or preempted, or its prompt is empty")
        answer = self._step(
            ManagerLookup(request_id, tuple(tokens)), lambda: self.manager.lookup(request_id, tuple(tokens))
        )
        self.answers[request_id] = (list(tokens), answer)

    def commit(self, request_id: int) -> bool:
        """The second phase: admit the request with the answer of its lookup, whatever ran since;
        False when refused (the answer is spent either way)."""
        self._record(f"machine.commit({request_id})")
        looked_up = self.answers.pop(request_id, None)
        if looked_up is None or request_id in self.sequences or request_id in self.preempted:
            raise ValueError(f"request {request_id} has no lookup to commit, or is live")
        tokens, answer = looked_up
        committed = self._step(ManagerCommit(request_id), lambda: self._admit(request_id, tokens, answer))
        self.coverage["committed"] += committed
        return committed

    def lease(self, request_id: int) -> int | None:
        """An asynchronous reader takes hold of the request's pages as they are now (capabilities
        "lease" and "end_lease"); the lease's number, or None when the manager refuses."""
        self._record(f"machine.lease({request_id})")
        if "lease" not in self.capabilities:
            raise ValueError("no lease capability")
        tokens = self._ready(request_id)
        table = self.manager.view().tables[request_id]
        seen: dict[int, dict[int, Context]] = {}  # the KV of the request's written positions, by page and slot
        for position in range(len(tokens)):
            page, slot = table[position // self.page_size], position % self.page_size
            if slot in self.kv.get(page, {}):
                seen.setdefault(page, {})[slot] = self.kv[page][slot]
        number = len(self.program)  # the lease's call in the program: unique
        handle = self._step(ManagerLease(request_id), lambda: self._lease(request_id))
        if handle is False:
            return None
        cached = self.manager.view().cached
        keys = {page: cached[page] for page in table if page in cached}  # what a save may store each page as
        self.leases[number] = (handle, seen, keys)
        return number

    def _lease(self, request_id: int) -> object:
        handle = self.manager.lease(request_id)
        if handle is None:
            self.coverage["refused"] += 1
            return False  # a refusal, as the other verbs return it
        return handle

    def end_lease(self, number: int) -> None:
        """The reader reads what it holds (the KV each page had when the lease began, or GHOST),
        then lets go."""
        self._record(f"machine.end_lease({number})")
        handle, seen, keys = self.leases.pop(number)
        self._read_lease(number, seen)
        saved = self._step(ManagerEndLease(number), lambda: self.manager.end_lease(handle))
        self._saved(number, seen, keys, saved)
        self.coverage["leases_read"] += 1

    def _saved(self, number: int, seen: dict[int, dict[int, Context]], keys: dict[int, object], saved: Any) -> None:
        """The copies an ended lease's save made into the host tier: each from a page the lease
        held, cached when it began, its host page then holding that key; the KV is what the lease
        read."""
        pairs = list(saved or ())
        host = self.manager.view().host
        last = {host_page: page for page, host_page in pairs}  # a later copy to a host page replaces an earlier one
        for page, host_page in pairs:
            if page not in keys:
                self._fail(
                    FailureKind.INVARIANT,
                    f"lease {number} saves page {page} to host page {host_page}, but the page was not a cached"
                    " page of its request when the lease began",
                )
            if last[host_page] == page and host.get(host_page) != keys[page]:
                self._fail(
                    FailureKind.INVARIANT,
                    f"lease {number} saves page {page} to host page {host_page}, but its host tier then holds"
                    f" {'nothing' if host_page not in host else repr(host[host_page])} there, not page {page}'s key",
                )
            self.host_kv[host_page] = dict(seen.get(page, {}))
        self.coverage["saved"] += len(pairs)

    def _read_lease(self, number: int, seen: dict[int, dict[int, Context]]) -> None:
        for page, slots in sorted(seen.items()):
            for slot, context in sorted(slots.items()):
                found = self.kv.get(page, {}).get(slot)
                if found != context:
                    self._fail(
                        FailureKind.GHOST,
                        f"lease {number} reads page {page} slot {slot} (context {context}),"
                        f" which now holds {'nothing' if found is None else f'the KV of context {found}'}",
                    )

    def demote(self) -> int:
        """The manager copies cached pages it would evict next into its host tier (capabilities
        "demote" and "promote"); the harness copies their KV. How many it copied."""
        self._record("machine.demote()")
        if "demote" not in self.capabilities:
            raise ValueError("no demote capability")
        cached = self.manager.view().cached
        pairs = self._step(ManagerDemote(), lambda: list(self.manager.demote()))
        if self.copies is not None:  # stores in flight: checked as such, their KV moves when they complete
            return len(pairs)
        host = self.manager.view().host
        last = {host_page: page for page, host_page in pairs}  # a later copy to a host page replaces an earlier one
        for page, host_page in pairs:
            if page not in cached:
                self._fail(FailureKind.INVARIANT, f"the manager demotes page {page}, which its cache does not hold")
            if last[host_page] == page and host.get(host_page) != cached[page]:
                self._fail(
                    FailureKind.INVARIANT,
                    f"the manager demotes page {page} to host page {host_page}, but its host tier then holds"
                    f" {'nothing' if host_page not in host else repr(host[host_page])} there, not page {page}'s key",
                )
            self.host_kv[host_page] = dict(self.kv.get(page, {}))
        self.coverage["demoted"] += len(pairs)
        return len(pairs)

    def teardown(self) -> None:
        """End every lease and finish every live request; then no page may be left held or lost."""
        self._record("machine.teardown()")
        self._land_every_copy()
        for number in list(self.leases):
            handle, seen, keys = self.leases.pop(number)
            self._read_lease(number, seen)
            self._saved(number, seen, keys, self.manager.end_lease(handle))
        for request_id in list(self.sequences):
            self.manager.free(request_id)
            del self.sequences[request_id]
        self.preempted.clear()
        self._land_every_copy()  # and any a free started
        view = self.manager.view()
        self._require_valid(view)
        if view.host_pending:
            self._fail(
                FailureKind.LEAK,
                f"host pages {sorted(view.host_pending)} are still being written once every lease ended",
            )
        lost = sorted(set(range(self.pages)) - view.free - view.reserved - view.evictable)
        if lost:
            self._fail(
                FailureKind.LEAK,
                f"pages {lost} are neither free, evictable nor reserved once every request is freed",
            )
        slots = self.states.leaks(view)
        if slots:
            self._fail(FailureKind.LEAK, f"state slots {slots} are neither free nor a snapshot once every request ends")

    def _land_every_copy(self) -> None:
        """Complete every copy in flight, oldest first (teardown), at most a few per page: a
        manager whose completions keep starting copies fails instead of running forever."""
        if self.copies is None:
            return  # no view read: a replayed trace holds exactly the calls the harness makes
        for _ in range(4 * (self.pages + self.manager.view().host_pages) + 8):
            if not self.manager.view().in_flight:
                return
            if self.copies.flights:
                self._complete(min(self.copies.flights), True)
            else:  # started by a call outside `_step` (a free of teardown's): seen now
                self.copies.observe(self.manager.view())
        self._fail(FailureKind.LEAK, "copies stay in flight, or keep starting, while teardown completes them")

    # -- the engine's work ------------------------------------------------------------------------

    def _admit(self, request_id: int, tokens: list[int], answer: object = NOT_LOOKED_UP) -> bool:
        if answer is NOT_LOOKED_UP:
            cached = self.manager.admit(request_id, tuple(tokens))
        else:
            cached = self.manager.commit(request_id, tuple(tokens), answer)
        if cached is None:
            self.coverage["refused"] += 1
            return False
        view = self.manager.view()
        self.sequences[request_id] = tokens
        self.tenants.setdefault(request_id, tenant_of(request_id))
        self._require_valid(view)
        if self.copies is not None:
            self.copies.observe(view)
            if self.copies.loads_into(request_id):  # it waits: it reads and computes once they end
                self.loading[request_id] = cached
        elif "promote" in self.capabilities:
            self._promote(request_id, view, cached)
        if not 0 <= cached < len(tokens):
            self._fail(
                FailureKind.FULL_HIT,
                f"request {request_id}: the manager says {cached} of its {len(tokens)} tokens are computed;"
                " a prefix hit must leave at least the last prompt token to compute",
            )
        if request_id not in self.loading:
            with self._state_copies(request_id, view):
                self._read(request_id, view, cached)
                for position in range(cached, len(tokens)):
                    self._compute(request_id, view, position, read=False)
        self.coverage["admitted"] += 1
        self.coverage["hit_tokens"] += cached
        self.coverage["hit_pages"] += -(-cached // self.page_size)
        return True

    def _promote(self, request_id: int, view: PoolView, cached: int) -> None:
        """Make the copies from the host tier the admission asked for, into the request's own
        pages among those holding its computed positions."""
        pairs = list(self.manager.promote(request_id))
        mine = view.tables[request_id][: -(-cached // self.page_size)]
        for host_page, page in pairs:
            others = [other for other, held in view.tables.items() if other != request_id and page in held]
            if page not in mine or others:
                self._fail(
                    FailureKind.EXCLUSIVE,
                    f"request {request_id} promotes host page {host_page} into page {page}, which is not"
                    f" its own computed page (requests {others} hold it)",
                )
            if host_page not in view.host:
                self._fail(
                    FailureKind.GHOST, f"request {request_id} promotes host page {host_page}, which holds nothing"
                )
            self.kv[page] = dict(self.host_kv.get(host_page, {}))
        self.coverage["promoted"] += len(pairs)

    def _compute(self, request_id: int, view: PoolView, position: int, read: bool = True, publish: bool = True) -> None:
        """The engine computes `position`: it reads every earlier one its query reads, then writes
        its KV (in every group, with "groups"); `publish`: tells the manager it is written (a
        draft's is not, until it is accepted)."""
        if read:
            self._read(request_id, view, position)
        self.states.advance(request_id, view, position, self._state_context(request_id))
        for group, table in self._tables(request_id, view):
            self._write(request_id, view, position, group, table[position // self.page_size])
        if publish:
            self._written(request_id, position + 1, view)

    def _written(self, request_id: int, tokens: int, view: PoolView) -> None:
        """Tell the manager the request's first `tokens` positions are written; the state copies a
        publish asks for (a snapshot of the state the pass left) are made at once."""
        self.manager.written(request_id, tokens)
        before, after = self._asked_copies()
        self.states.copy((*before, *after), request_id, view)

    def _write(self, request_id: int, view: PoolView, position: int, group: int | None, page: int) -> None:
        """The KV of `position` (of `group`, with "groups") lands in `page`, which must be the
        request's alone and, under a key, keep the KV the key named."""
        where = "" if group is None else f" of group {group}"
        if page in view.reserved:
            self._fail(
                FailureKind.GHOST,
                f"request {request_id} writes position {position}{where} into reserved page {page}, which holds no KV",
            )
        others = [other for other, held in self._holding(view) if other != request_id and page in held]
        if others:
            self._fail(
                FailureKind.EXCLUSIVE,
                f"request {request_id} writes position {position}{where} into page {page},"
                f" which requests {others} hold",
            )
        slot, context = position % self.page_size, self._context(request_id, position, group)
        key = view.cached.get(page) if "location_keys" not in self.capabilities else None
        named = self.key_kv.get(key, {}).get(slot) if key is not None else None
        if named is not None and named != context:
            self._fail(
                FailureKind.GHOST,
                f"request {request_id} writes position {position}{where} into page {page}, which its cache still serves"
                f" under key {key!r:.60}, first seen over the KV of context {named}: a key that outlives its content",
            )
        self.kv.setdefault(page, {})[slot] = context

    def _tables(self, request_id: int, view: PoolView) -> list[tuple[int | None, tuple[int, ...]]]:
        """The request's tables: its one table (group None), or one for each attention group."""
        if not self.groups:
            return [(None, tuple(view.tables[request_id]))]
        tables = zip(self.groups, view.group_tables[request_id], strict=True)
        return [(g, tuple(table)) for g, (group, table) in enumerate(tables) if not isinstance(group, Recurrent)]

    @contextmanager
    def _state_copies(self, request_id: int, view: PoolView) -> Iterator[None]:
        """Around the request's pass: the state copies the last call asked for, those before the
        pass first and those after it last (none without a recurrent group)."""
        before, after = self._asked_copies()
        self.states.copy(before, request_id, view)
        yield
        self.states.copy(after, request_id, view)

    def _asked_copies(self) -> tuple[Copies, Copies]:
        """The state copies the manager's last call asked for, before its pass and after it (none
        without a recurrent group)."""
        if not self.states.recurrent:
            return (), ()
        before, after = getattr(self.manager, "state_copies")()  # noqa: B009
        return before, after

    def _state_context(self, request_id: int) -> Callable[[int, int], Context]:
        """The context a recurrent group's state holds after a position of the request's."""
        return lambda group, position: self._context(request_id, position, group)

    def _holding(self, view: PoolView) -> list[tuple[int, set[int]]]:
        """Each live request and every page it holds (in any group)."""
        if not self.groups:
            return [(request_id, set(table)) for request_id, table in view.tables.items()]
        return [
            (request_id, {page for table in tables for page in table} - view.reserved)
            for request_id, tables in view.group_tables.items()
        ]

    def _read(self, request_id: int, view: PoolView, stop: int) -> None:
        """The query at `stop` reads every position it reads before it (in every group, with
        "groups": only those its group's query reads), each holding in the request's page that
        position's own context's KV."""
        for group, table in self._tables(request_id, view):
            first = 0 if group is None else first_read(self.groups[group], stop)
            where = "" if group is None else f" of group {group}"
            for position in range(first, stop):
                page = table[position // self.page_size]
                found = self.kv.get(page, {}).get(position % self.page_size)
                context = self._context(request_id, position, group)
                if found != context or page in view.reserved:
                    what = "nothing" if found is None or page in view.reserved else f"the KV of context {found}"
                    self._fail(
                        FailureKind.GHOST,
                        f"request {request_id} reads position {position}{where} (context {context})"
                        f" from page {page}, which holds {what}",
                    )

    def _context(self, request_id: int, position: int, group: int | None = None) -> Context:
        """What the KV at `position` is computed from: the request's tokens up to it, after its
        tenant (a forked child's, its parent's) under "tenants", and first its group (with
        "groups": each group's layers compute KV of their own)."""
        tokens = tuple(self.sequences[request_id][: position + 1])
        if "tenants" in self.capabilities:
            tokens = (self.tenants[request_id], *tokens)
        return tokens if group is None else (group, *tokens)

    # -- checks -------------------------------------------------------------------------------------

    def state(self, view: PoolView | None = None) -> ManagerState:
        """The manager as its view shows it (`view`, or a fresh one), with the live requests'
        token counts."""
        live = tuple(sorted((request_id, len(tokens)) for request_id, tokens in self.sequences.items()))
        single_owner = "single_owner" in self.capabilities
        return ManagerState(
            self.manager.view() if view is None else view, live, self.pages, self.page_size, single_owner, self.groups
        )

    def _step(self, event: Any, body: Callable[[], T]) -> T:
        """Run one of the engine's calls and check it with the step checker (the refusal's
        atomicity, the view's invariants); count the cached pages it evicted (a reset's apart)."""
        before = self.state()
        value = body()
        after = self.state()
        if not isinstance(event, ManagerReset):
            dropped = before.view.cached.items()
            self.coverage["evicted"] += sum(after.view.cached.get(page) != key for page, key in dropped)
        failure = check_step(before, event, Outcome(value), after, component=MANAGER, config=self.config)
        if failure is not None:
            self._fail(failure.kind, failure.detail)
        stores: set[int] = set()
        if self.copies is not None:
            self.copies.observe(after.view)
            stores = {flight.host_page for flight in self.copies.flights.values() if flight.to_host}
        elif after.view.in_flight:
            self._fail(FailureKind.INVARIANT, "copies are in flight, but the adapter does not declare 'async_copies'")
        if not isinstance(event, ManagerComplete):  # a copy's end moves the ghost KV first (`_complete`)
            self._keys(after.view)
        self._events(after.view)
        saving = self.leases or (isinstance(event, ManagerLease) and value is not False)  # an ended one is popped
        pending = after.view.host_pending - stores
        if pending and not saving:
            self._fail(
                FailureKind.INVARIANT,
                f"host pages {sorted(pending)} are being written while no save is in flight",
            )
        return value

    def _events(self, view: PoolView) -> None:
        """With "events": the manager's KV events since the last call, folded into all before
        them, count exactly the pages the view caches under each key, on each tier."""
        if "events" not in self.capabilities:
            return
        events = list(self.manager.events())
        if not all(isinstance(event, Stored | Removed | Cleared) for event in events):
            self._fail(FailureKind.EVENTS, f"events() gave {events!r:.200}, not KV events (kvsched.spec.kv_events)")
        counted = fold_counted(self.published, events)
        cached = Counter((key, DEVICE) for key in view.cached.values())
        cached.update((key, HOST) for key in view.host.values())
        if counted != cached:
            wrong = "remove a page no event stored"
            if counted is not None:
                off = sorted(((counted - cached) + (cached - counted)).items(), key=repr)[:4]
                wrong = f"fold to other pages than the view caches: {off}"
            self._fail(FailureKind.EVENTS, f"the events {events!r:.300} {wrong}")
        self.published = cached

    def _keys(self, view: PoolView) -> None:
        """Every page cached under a key holds, in the slots it held when the key was first seen
        cached, the KV it held then (a key seen for the first time records its page's KV); not
        with "location_keys". A snapshot's key names the state it was first seen cached over."""
        self.states.keys(view)
        if "location_keys" in self.capabilities:
            return
        for page, key in view.cached.items():
            held = self.kv.get(page, {})
            named = self.key_kv.setdefault(key, dict(held))
            off = next((slot for slot, context in named.items() if held.get(slot, context) != context), None)
            if off is not None:
                self._fail(
                    FailureKind.GHOST,
                    f"page {page} is cached under key {key!r:.60}, first seen over the KV of context {named[off]}"
                    f" in slot {off}, but holds {held.get(off)} there",
                )

    def _require_valid(self, view: PoolView) -> None:
        """The view's invariants, before the harness reads or writes through it."""
        problems = view_problems(self.state(view))
        if problems:
            self._fail(FailureKind.INVARIANT, problems[0])

    def _live(self, request_id: int) -> list[int]:
        tokens = self.sequences.get(request_id)
        if tokens is None:
            raise ValueError(f"request {request_id} is not live")
        return tokens

    def ready(self, request_id: int) -> bool:
        """The request is live and none of its pages is still loading: it may decode, fork or be
        leased."""
        return request_id in self.sequences and request_id not in self.loading

    def _ready(self, request_id: int) -> list[int]:
        tokens = self._live(request_id)
        if request_id in self.loading:
            raise ValueError(f"request {request_id} waits for its loads (complete_copy them first)")
        return tokens

    # -- copies in flight ("async_copies") --------------------------------------------------------

    def complete_copy(self, copy_id: int, ok: bool = True) -> None:
        """A copy in flight ends, done (`ok`) or failed (capability "async_copies")."""
        self._record(f"machine.complete_copy({copy_id}, {ok})")
        self._complete(copy_id, ok)

    def _complete(self, copy_id: int, ok: bool) -> None:
        if self.copies is None:
            raise ValueError("no async_copies capability")
        flight = self.copies.flights.pop(copy_id, None)
        if flight is None:
            raise ValueError(f"copy {copy_id} is not in flight")
        result = self._step(ManagerComplete(copy_id, bool(ok)), lambda: self.manager.complete(copy_id, bool(ok)))
        view = self.manager.view()
        if copy_id in view.in_flight and view.in_flight[copy_id] == (flight.page, flight.host_page, flight.to_host):
            self._fail(FailureKind.INVARIANT, f"{flight.describe(copy_id)} is still in flight after it completed")
        self.copies.finish(copy_id, flight, bool(ok), result, view)
        self._keys(view)

    def loaded(self, request_id: int) -> None:
        """The request's last load ended: it reads what its pages hold up to the tokens the manager
        says are computed, and computes the rest of its prompt."""
        computed = self.loading.pop(request_id)
        view = self.manager.view()
        self._require_valid(view)
        self._read(request_id, view, computed)
        for position in range(computed, len(self.sequences[request_id])):
            self._compute(request_id, view, position, read=False)

    def _record(self, line: str) -> None:
        self.program.append(line)

    def _fail(self, kind: FailureKind, detail: str) -> None:
        self.failed = True
        raise FAILED[kind](CheckFailure(kind, detail))
