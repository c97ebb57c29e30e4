"""Every explorer's breadth-first search on many workers, numbered as one process numbers it.

Level by level. The coordinator holds what the single-process search holds: the states found, in
the order found, each under its key, with its parent, event and depth. It hands a level's states,
in order, to the workers in contiguous batches (`kvsched.testing.workers`: local processes, or a
Ray cluster), each state as the explorer ships it (`Search.shipped`): the system explorer's
loadable subjects as the kept state itself; the engine explorer, the component explorer and any
other explorer whose states carry the systems that reached them as the state's path of events,
which the worker replays from the start (`Search.arrive`, each prefix's systems kept for the
batch's next states: a batch's states are a level's neighbours, mostly siblings). A worker builds
the explorer once (a recipe: `Recipe`, `EngineRecipe`, `ComponentRecipe`), positions each state,
checks its invariants, runs every event of its alphabet with the step's checks and the explorer's
own, keeps each successor's key (each distinct one sent once a batch), checks liveness, and
counts what the explorer's own checks count (`Search.tally`).

The coordinator then walks the level in the order the single-process search expands it: a
successor is new or not by its key, new states are numbered in the order found, and the first
failure in that order is the search's. A new state's invariants are checked when its own level
runs (once per state, as the single process checks them, not once per successor); a state that
fails them sends the coordinator back to the level that found it, walked again up to the point it
was found. So the states, their numbers, the counts of states, transitions and checks, and the
counterexample's program are the single process's for any number of workers (a failure's words
may name pages differently: a worker checks a state in canonical names); the tests run both. An
explorer's own tallies are added per state walked, so they are the single process's too, except
on a search stopped by a new state's invariants: there the state that found it counts all its
events, where the single process stopped at that one.

The seen-set is the coordinator's (`partitions=0`) or cut into parts, each kept by an owner process
or Ray actor (`kvsched.proofs.seen`): the coordinator asks the owners once per level which of the
level's distinct keys an earlier level numbered, walks the level against those answers and the
keys its own walk numbers, and hands the new keys to their owners; a level walked again makes them
forget from its first number. With owners the coordinator holds, between levels, the states'
parents, events and depths and the last two levels' states, and no key. `Level` is what the
coordinator reports after each level (for progress and the scaling figures).

With a `journal` (a file), the coordinator saves where it is before each level runs: the level,
its depth and the level that found it, the counts, the levels so far, the parents, events and
depths, and the states it keeps (its seen-set's, as a worker sent them, to be received again: a
system explorer's keys are its interned parts, which mean nothing in another process; with owners,
the last two levels' states, the owners' logs beside the journal). The same search run again goes
on from that level; its owners first forget what a walk after it numbered. A search that stopped
after it saved a level whose states fail their invariants runs the level that found them again
to walk back to them.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import re
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

from kvsched.proofs.explorer import Exploration, Explorer
from kvsched.proofs.operations import ISSUE, Bounds
from kvsched.proofs.search import Search, Searched, Violation
from kvsched.proofs.seen import Partitions
from kvsched.proofs.subject import IMPL, SPEC, Subject, variant
from kvsched.report import CommandParser, measurement, print_table, require_writable, write_json
from kvsched.testing.outcome import CheckFailure, FailureKind
from kvsched.testing.workers import Workers

SUBJECTS: dict[str, Subject] = {SPEC.name: SPEC, IMPL.name: IMPL}
VARIANT = "spec variant: "  # a broken spec's subject name: VARIANT + its name in `VARIANTS`


def subject_named(name: str) -> Subject:
    """The subject of a name: `spec`, `impl`, a broken spec's (`variant(name).name`), or
    `MODULE:NAME`, a `Subject` a worker imports."""
    if name.startswith(VARIANT):
        return variant(name.removeprefix(VARIANT))
    if ":" in name:
        module, attribute = name.split(":", 1)
        found = getattr(importlib.import_module(module), attribute)
        if not isinstance(found, Subject):
            raise NotDistributable(f"{name} is not a Subject")
        return found
    return SUBJECTS[name]


class NotDistributable(ValueError):
    """A subject named for a worker that is not one (`MODULE:NAME` naming something else)."""


S = TypeVar("S", bound=Search, covariant=True)


class SearchRecipe(Protocol[S]):
    """How a worker builds the explorer: hashable and picklable, naming what it cannot carry."""

    def build(self) -> S: ...


@dataclass(frozen=True, slots=True)
class Recipe:
    """How a worker builds the system explorer: the bounds, and the subject and reference by name."""

    bounds: Bounds
    subject: str = SPEC.name
    reference: str | None = None

    def build(self) -> Explorer:
        reference = None if self.reference is None else subject_named(self.reference)
        return Explorer(self.bounds, subject_named(self.subject), reference)


NO_SUCCESSOR = -1  # an event refused (a typed error) or whose step failed


@dataclass(frozen=True, slots=True)
class Expanded:
    """A state's invariants' failure; its events as run, in the alphabet's order, up to the first
    step that failed, each as its successor's index in the batch's `Batch.states` (an array: a
    level's answers are mostly these); that step's failure and event; and the state's liveness
    (None when a step failed: the single-process search stops there); what the explorer's own
    checks counted on its events (`Search.tally`)."""

    invariants: CheckFailure | None
    successors: array[int] = field(default_factory=lambda: array("i"))
    failure: CheckFailure | None = None
    failed: Any = None  # the event whose step failed
    live: CheckFailure | None = None
    tally: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Batch:
    """A worker's answer: each state of its batch expanded; the distinct successors, each with
    the event that first reached it in the batch (a state new to the search is reached first
    there, so the event the search keeps for it); and the worker's CPU seconds on it."""

    expanded: tuple[Expanded, ...]
    states: tuple[Any, ...]  # as the explorer sends them (`Search.sent`)
    events: tuple[Any, ...]
    cpu: float = 0.0


@dataclass(frozen=True, slots=True)
class Level:
    """One level done: its depth, the states expanded and found, the states so far, the seconds
    waiting for the workers and walking, the workers' CPU seconds, and the coordinator's (the
    part no worker can take: receiving the answers and walking them)."""

    depth: int
    expanded: int
    found: int
    states: int
    working: float
    walking: float
    worker_cpu: float
    coordinator_cpu: float


_BUILT: dict[Any, Search] = {}


def explorer_for(recipe: SearchRecipe[Search]) -> Search:
    """The worker's explorer for `recipe`, built once per process."""
    explorer = _BUILT.get(recipe)
    if explorer is None:
        explorer = _BUILT[recipe] = recipe.build()
    return explorer


Memo = dict[Any, tuple[Any, Any]]  # a path -> where a replay of it got to (`Search.arrive`)
MEMO_LIMIT = 10_000  # the expanded states' systems a worker keeps for the next level's replays
_MEMOS: dict[Any, tuple[int, Memo, Memo]] = {}


def _memo(recipe: SearchRecipe[Search], depth: int) -> tuple[Memo, Memo]:
    """Where this process's replays got to, for a batch of states at `depth`: the nodes of the
    states it expanded at the depth before (their parents, when it expanded them) and the
    ancestors it replayed at this depth; and where to keep the nodes of the states it expands now.
    Kept across the level's batches, dropped two levels on."""
    kept = _MEMOS.get(recipe)
    if kept is None or kept[0] != depth:
        parents = kept[2] if kept is not None and kept[0] == depth - 1 else {}
        kept = _MEMOS[recipe] = depth, parents, {}
    return kept[1], kept[2]


def _since(before: tuple[int, ...], now: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(after - earlier for earlier, after in zip(before, now, strict=True))


def expand(shard: tuple[SearchRecipe[Search], Sequence[tuple[Any, int]], bool]) -> Batch:
    """A worker's job: position and check each (shipped state, depth) of a batch and, if
    `events`, expand it as `Search._expand` does."""
    recipe, states, events = shard
    started = time.process_time()
    explorer = explorer_for(recipe)
    limit = explorer.max_depth
    memo, expanding = _memo(recipe, states[0][1] if states else -1)
    expanded: list[Expanded] = []
    successors: list[Any] = []
    reached_by: list[Any] = []  # the event that first reached each successor
    numbered: dict[Any, int] = {}  # a successor's key in this worker -> its index in `successors`
    for shipped, depth in states:
        at, state, kept = explorer.arrive(shipped, memo)
        if len(memo) > 4 * MEMO_LIMIT:
            memo.clear()  # a level of many misses: its ancestors replayed again, not kept without bound
        if events and len(expanding) < MEMO_LIMIT:
            explorer.remember(shipped, at, kept, expanding)
        failure = explorer.check_state(kept)
        if failure is not None or not events:
            expanded.append(Expanded(failure))
            continue
        alphabet = [] if limit is not None and depth >= limit else explorer.events(at, state)
        before = explorer.tally()
        tried = array("i")
        for event in alphabet:
            attempt, failure = explorer.tried(at, state, event)
            if failure is not None:
                tried.append(NO_SUCCESSOR)
                expanded.append(Expanded(None, tried, failure, event, tally=_since(before, explorer.tally())))
                break
            if attempt.outcome.error is not None:
                tried.append(NO_SUCCESSOR)
                continue
            child, key = explorer.kept(at, attempt.child, attempt.after)
            index = numbered.setdefault(key, len(successors))
            if index == len(successors):
                successors.append(explorer.sent(child, key))
                reached_by.append(event)
            tried.append(index)
        else:
            live = explorer.live(at, state)
            expanded.append(Expanded(None, tried, live=live, tally=_since(before, explorer.tally())))
    return Batch(tuple(expanded), tuple(successors), tuple(reached_by), time.process_time() - started)


Counts = tuple[int, int, int, tuple[int, ...]]  # states, transitions, checks, the explorer's tally


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where the search is between levels: the level it expands next and its depth; whether its
    states' invariants were checked (the initial state's are, before its level runs; the others'
    are checked as their level runs); the level that found it and the counts before that walk."""

    level: list[int]
    depth: int = 0
    checked: bool = True
    previous: list[int] = field(default_factory=list)
    before: Counts | None = None


@dataclass(frozen=True, slots=True)
class Journal:
    """A search saved before a level runs: which search (its recipe and parts), its cursor, levels and
    counts (transitions, checks, tally, complete), its parents, events and depths, and the
    states it keeps as (number, what a worker sent)."""

    search: tuple[str, int]
    cursor: Cursor
    levels: list[Level]
    counts: tuple[int, int, tuple[int, ...], bool]
    lists: tuple[list[int], list[Any], list[int]]
    kept: list[tuple[int, Any]]


@dataclass(frozen=True, slots=True)
class Answers:
    """A level's batches as the walk reads them: each successor received (the state to keep and
    its key), and with owners the keys that are new to the search (None: the coordinator's own
    seen-set tells)."""

    batches: list[Batch]
    received: list[list[tuple[Any, Any]]]
    fresh: set[Any] | None


@dataclass
class Walked:
    """The coordinator's walk of a level: the new states in the order found, the first step or
    liveness failure (and its event and state), and whether `max_states` stopped it."""

    found: list[int] = field(default_factory=list)
    failure: tuple[CheckFailure, Any, int] | None = None
    stopped: bool = False


@dataclass
class DistributedSearch(Generic[S]):
    """The coordinator (see the module docstring): `run` searches like `Search.search`."""

    recipe: SearchRecipe[S]
    workers: int = 2
    ray: str | None = None
    batch: int = 256  # states per task: coarse, so a task's overhead is small beside its work
    report: Callable[[Level], None] | None = None
    levels: list[Level] = field(default_factory=list)
    partitions: int = 0  # owners of the seen-set's parts (`kvsched.proofs.seen`); 0: the coordinator keeps it
    _local: Any = field(init=False, repr=False)  # the coordinator's explorer (an S): its states and keys
    _pool: Workers = field(init=False, repr=False)
    _owners: Partitions | None = field(init=False, repr=False, default=None)
    _numbered: dict[Any, int] = field(init=False, repr=False, default_factory=dict)  # the walk's new keys
    owners_cpu: float = field(init=False, default=0.0)  # the seen-set's owners' CPU seconds, once run
    journal: str | None = None  # a file: where the search is after each level, to go on from
    _previous: Answers | None = field(init=False, repr=False, default=None)  # the last level's answers

    @property
    def explorer(self) -> S:
        """The coordinator's explorer: the states found, their paths and its tallies
        (`trace.reproduce` prints a system explorer's violation from it)."""
        explorer: S = self._local
        return explorer

    def run(self, max_states: int | None = None) -> Searched:
        """Search until every reachable state is checked, a check fails, or `max_states` are found;
        with a `journal` that holds this search's last level, go on from there."""
        started = time.perf_counter()
        local = self._local = self.recipe.build()
        saved = self._read_journal()
        with contextlib.ExitStack() as stack:
            if self.partitions:
                directory = None if self.journal is None else f"{self.journal}.seen"
                owners = Partitions(self.partitions, ray=self.ray, directory=directory, resume=saved is not None)
                self._owners = stack.enter_context(owners)
            violation: Violation | None = None
            if saved is not None:
                cursor = self._resume(saved)
            else:
                first = local.start()
                initial = local.initial(first)
                kept, key = local.kept(None, first, initial)
                receive = local.received if self._owners is None else local.owned
                self._number(receive(local.sent(kept, key)), -1, None, None)
                self._settle()
                cursor = Cursor([0])
                if failure := local._check_state(initial):
                    violation = Violation(failure.kind, failure.detail, [], None)
            if violation is None:
                self._pool = stack.enter_context(Workers(self.workers, ray=self.ray))
                violation = self._levels(cursor, max_states)
            if self._owners is not None:
                self.owners_cpu = self._owners.cpu()
        return self._finish(violation, started)

    def _levels(self, cursor: Cursor, max_states: int | None) -> Violation | None:
        """Level after level from `cursor`; the search's violation (None: complete, or stopped by
        `max_states`)."""
        local, searched = self._local, self._local.searched
        while cursor.level:
            self._save_journal(cursor)
            level = cursor.level
            working, cpu = time.perf_counter(), time.process_time()
            batches = self._run(level, events=True)
            expanded = [item for batch in batches for item in batch.expanded]
            if not cursor.checked:
                for ordinal, state in enumerate(expanded):
                    if state.invariants is not None:
                        return self._rewalk(cursor.previous, self._previous, cursor.before, max_states, ordinal, state)
            if self._owners is not None:
                for index in cursor.previous:  # a partitioned coordinator keeps the last two levels' states
                    local.states[index] = None
            walking = time.perf_counter()
            before = (len(local.states), searched.transitions, searched.checks, local.tally())
            answers = self._answers(batches)
            walked = self._walk(level, answers, max_states)
            self._settle()
            seconds = time.perf_counter() - walking
            workers = sum(batch.cpu for batch in batches)
            coordinator = time.process_time() - cpu
            done = Level(
                cursor.depth,
                len(level),
                len(walked.found),
                len(local.states),
                walking - working,
                seconds,
                workers,
                coordinator,
            )
            self.levels.append(done)
            if self.report is not None:
                self.report(done)
            if walked.failure is not None or walked.stopped:
                checks = [item for batch in self._run(walked.found, events=False) for item in batch.expanded]
                for ordinal, state in enumerate(checks):
                    if state.invariants is not None:
                        return self._rewalk(level, answers, before, max_states, ordinal, state)
                if walked.failure is None:
                    return None
                failure, event, index = walked.failure
                return self._violation(failure, event, index)
            self._previous = answers
            cursor = Cursor(walked.found, cursor.depth + 1, False, level, before)
        local.searched.complete = True
        self._save_journal(cursor)
        return None

    def _read_journal(self) -> Journal | None:
        """The journal's last level of this search (None: no journal, or none written yet). A
        journal is a pickle this search wrote, trusted as the code is: give only your own."""
        if self.journal is None or not os.path.exists(self.journal):
            return None
        with open(self.journal, "rb") as file:
            saved = pickle.load(file)
        if not isinstance(saved, Journal) or saved.search != (repr(self.recipe), self.partitions):
            raise ValueError(f"{self.journal} is the journal of another search, not {self.recipe!r}")
        return saved

    def _save_journal(self, cursor: Cursor) -> None:
        """Write where the search is (atomically: a stopped write leaves the last one whole)."""
        if self.journal is None:
            return
        local, searched = self._local, self._local.searched
        if self._owners is None:  # every state, as a worker would send it: received again on resume
            kept = [(number, local.sent(local.states[number], key)) for key, number in local.index.items()]
        else:  # the states the next levels ship or walk back to
            kept = [(number, local.states[number]) for number in [*cursor.previous, *cursor.level]]
        journal = Journal(
            (repr(self.recipe), self.partitions),
            cursor,
            list(self.levels),
            (searched.transitions, searched.checks, local.tally(), searched.complete),
            (list(local.parent), list(local.via), list(local.depth)),
            kept,
        )
        with open(f"{self.journal}.part", "wb") as file:
            pickle.dump(journal, file)
        os.replace(f"{self.journal}.part", self.journal)

    def _resume(self, saved: Journal) -> Cursor:
        """The search as the journal left it: its states numbered, their keys where they were kept
        (the owners forget what a walk after it numbered), its counts and levels."""
        local, searched = self._local, self._local.searched
        searched.transitions, searched.checks, tally, searched.complete = saved.counts
        local.add_tally(tally)
        local.parent, local.via, local.depth = (list(kept) for kept in saved.lists)
        local.states = [None] * len(local.parent)
        for number, sent in saved.kept:
            if self._owners is None:
                state, key = local.received(sent)
                local.index[key] = number
                local.states[number] = state
            else:
                local.states[number] = sent
        if self._owners is not None:
            self._owners.forget(len(local.states))
        self.levels = list(saved.levels)
        self._previous = None  # run again, if a walk back needs them
        return saved.cursor

    def _run(self, level: list[int], *, events: bool) -> list[Batch]:
        """The level's states checked (and expanded if `events`) by the workers, in batches in order."""
        local, depths = self._local, self._local.depth
        size = max(1, min(self.batch, -(-len(level) // (4 * self.workers))))  # a small level: every worker busy
        shards = [
            (self.recipe, [(local.shipped(index), depths[index]) for index in level[start : start + size]], events)
            for start in range(0, len(level), size)
        ]
        results: list[Batch | None] = [None] * len(shards)

        def done(index: int, batch: Batch) -> None:
            results[index] = batch

        self._pool.run(expand, shards, done)
        return [batch for batch in results if batch is not None]

    def _answers(self, batches: list[Batch]) -> Answers:
        """The level's batches, each successor as the state to keep and its key, and (with owners)
        the keys no earlier level numbered: each distinct key asked of its owner once."""
        local = self._local
        receive = local.received if self._owners is None else local.owned
        received = [[receive(sent) for sent in batch.states] for batch in batches]
        if self._owners is None:
            return Answers(batches, received, None)
        keys = list(dict.fromkeys(key for found in received for _, key in found))
        seen = self._owners.seen(keys)
        return Answers(batches, received, {key for key, known in zip(keys, seen, strict=True) if not known})

    def _number(self, received: tuple[Any, Any], parent: int, event: Any, fresh: set[Any] | None) -> bool:
        """Number a successor if it is new: to the coordinator's seen-set, or (with owners) to the
        walk and among the keys no earlier level numbered (`fresh`; None: the initial state)."""
        state, key = received
        local = self._local
        if self._owners is None:
            added: bool = local._add(state, key, parent, event)
            return added
        if key in self._numbered or (fresh is not None and key not in fresh):
            return False
        self._numbered[key] = len(local.states)
        local._append(state, parent, event)
        return True

    def _settle(self) -> None:
        """Hand the walk's new keys to their owners."""
        if self._owners is not None and self._numbered:
            self._owners.insert(list(self._numbered), list(self._numbered.values()))
        self._numbered = {}

    def _walk(self, level: list[int], answers: Answers, max_states: int | None, stop: int = -1) -> Walked:
        """The single-process search's expansion of `level` from the workers' batches, up to the
        first step or liveness failure, `max_states`, or the `stop`-th new state (counted from 0)."""
        local, searched = self._local, self._local.searched
        invariants = len(local.component.invariants)
        walked = Walked()
        at = iter(level)
        for batch, received in zip(answers.batches, answers.received, strict=True):
            events = batch.events
            for state in batch.expanded:
                index = next(at)
                local.add_tally(state.tally)
                successors = state.successors
                searched.transitions += len(successors)  # each event counts once run (a failed one too)
                searched.checks += len(successors)
                for position, successor in enumerate(successors):
                    if successor < 0 or not self._number(received[successor], index, events[successor], answers.fresh):
                        continue
                    walked.found.append(len(local.states) - 1)
                    searched.checks += invariants
                    if len(walked.found) - 1 == stop:  # the events after it were never run
                        searched.transitions -= len(successors) - position - 1
                        searched.checks -= len(successors) - position - 1
                        walked.failure = CheckFailure(FailureKind.INVARIANT, ""), events[successor], index
                        return walked
                if state.failure is not None:
                    walked.failure = state.failure, state.failed, index
                    return walked
                searched.checks += 1
                if state.live is not None:
                    walked.failure = state.live, None, index
                    return walked
                if max_states is not None and len(local.states) >= max_states:
                    walked.stopped = True
                    return walked
        return walked

    def _rewalk(
        self,
        level: list[int],
        answers: Answers | None,
        before: Counts | None,
        max_states: int | None,
        ordinal: int,
        state: Expanded,
    ) -> Violation:
        """The `ordinal`-th state found by walking `level` fails its invariants (`state`'s): walk
        the level again from the counts `before` it, up to that state; the violation there.
        `answers` None: the level's batches are run again (a search resumed from its journal)."""
        assert before is not None and state.invariants is not None
        local, searched = self._local, self._local.searched
        states, searched.transitions, searched.checks, tally = before
        local.add_tally(_since(local.tally(), tally))  # (negative: the walk adds its states' tallies again)
        for key in [key for key, found in local.index.items() if found >= states]:
            del local.index[key]
        if self._owners is not None:
            self._owners.forget(states)
            self._numbered = {}
        for kept_list in (local.states, local.parent, local.via, local.depth):
            del kept_list[states:]
        if answers is None:
            answers = self._answers(self._run(level, events=True))
        walked = self._walk(level, answers, max_states, stop=ordinal)
        assert walked.failure is not None, "the walk finds the state it found before"
        _, event, index = walked.failure
        return self._violation(state.invariants, event, index)

    def _violation(self, failure: CheckFailure, event: Any, index: int) -> Violation:
        return Violation(failure.kind, failure.detail, self._local.path(index), event)

    def _finish(self, violation: Violation | None, started: float) -> Searched:
        local = self._local
        result: Searched = local.searched
        result.violation = violation
        result.states = len(local.states)
        result.depth = max(local.depth, default=0)
        result.seconds = time.perf_counter() - started
        return result


def journal_file(directory: str | None, name: str) -> str | None:
    """Where a search named `name` keeps its journal in `directory` (None: no journal)."""
    if directory is None:
        return None
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-") + ".journal")


def explore_on_workers(
    bounds: Bounds,
    *,
    workers: int = 2,
    ray: str | None = None,
    max_states: int | None = None,
    report: Callable[[Level], None] | None = None,
) -> tuple[Exploration, list[Level]]:
    """`kvsched.proofs.explorer.explore` of the spec within `bounds`, on `workers` processes (or
    Ray); the exploration and its levels."""
    search = DistributedSearch(Recipe(bounds), workers=workers, ray=ray, report=report)
    search.run(max_states)
    return search.explorer.result, search.levels


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m kvsched.proofs.distributed`: the issue's sizes to a depth on 1, 2, ... workers
    (and the single process first), the levels as they finish, a table, `--json` for the page."""
    parser = CommandParser(
        prog="python -m kvsched.proofs.distributed",
        description="The system explorer's search at the issue's sizes on many workers, with its scaling.",
    )
    parser.add_argument("--depth", type=int, default=6, help="the search's depth bound (default 6)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts (default 1 2)")
    parser.add_argument("--ray", default=None, help="run on a Ray cluster (ADDRESS, auto or local)")
    parser.add_argument("--no-single", action="store_true", help="skip the single-process search")
    parser.add_argument("--partitions", type=int, default=None, help="owners of the seen-set (default: one a worker)")
    parser.add_argument("--engine", action="store_true", help="also the engine explorer's small and hosted shapes")
    parser.add_argument("--json", default=None, help="write the figures to PATH")
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(arguments)
    if args.depth < 0 or any(count < 1 for count in args.workers) or (args.partitions or 0) < 0:
        parser.error("--depth and --partitions take 0 or more, --workers counts of 1 or more")
    if args.json is not None:
        require_writable(args.json, "kvsched.proofs.distributed")
    bounds = replace(ISSUE, max_depth=args.depth)
    runs: list[dict[str, Any]] = []
    if not args.no_single:
        _log(f"single process, R3 P5 L3 E2x2 depth<={args.depth} ...")
        cpu = time.process_time()
        alone = Explorer(bounds).run()
        runs.append(_figures("1 process", alone, [], time.process_time() - cpu))
    for workers in args.workers:
        _log(f"{workers} worker(s){' on Ray' if args.ray else ''} ...")
        parts = workers if args.partitions is None else args.partitions
        search = DistributedSearch(Recipe(bounds), workers=workers, ray=args.ray, report=report_level, partitions=parts)
        result = search.run()
        coordinator = sum(level.coordinator_cpu for level in search.levels)
        runs.append(_figures(f"{workers} worker(s)", result, search.levels, coordinator, workers, search.owners_cpu))
    rows = [
        [run["run"], f"{run['states']:,}", f"{run['transitions']:,}", f"{run['seconds']:.1f}s"]
        + [f"{run['states_per_second']:,.0f}", f"{run['coordinator_cpu']:.1f}", f"{run['worker_cpu']:.1f}"]
        for run in runs
    ]
    print_table(rows, ["search", "states", "transitions", "time", "states/s", "coordinator CPU-s", "workers CPU-s"])
    engines = _engine_runs(args.workers, args.partitions, args.ray) if args.engine else []
    if args.json is not None:
        command = " ".join(["python -m kvsched.proofs.distributed", *arguments])
        write_json(args.json, {"measured": measurement(command), "runs": runs, "engine_runs": engines})
    return 0 if all(run["violation"] is None for run in runs + engines) else 1


def _engine_runs(counts: Sequence[int], partitions: int | None, ray: str | None) -> list[dict[str, Any]]:
    """The engine explorer's small and hosted shapes to completion, in one process and on each
    count of workers (a state shipped as its path); printed as a table, returned for the JSON."""
    from kvsched.proofs.engine_explorer import HOSTED, SMALL, EngineRecipe

    runs: list[dict[str, Any]] = []
    for shape, bounds in (("small", SMALL), ("hosted", HOSTED)):
        for workers in (0, *counts):
            _log(f"engine explorer {shape}, {f'{workers} worker(s)' if workers else 'one process'} ...")
            cpu = time.process_time()
            if workers:
                parts = workers if partitions is None else partitions
                search = DistributedSearch(EngineRecipe(bounds), workers=workers, ray=ray, partitions=parts)
                result = search.run(bounds.max_states)
                levels, owners = search.levels, search.owners_cpu
                coordinator = sum(level.coordinator_cpu for level in levels)
            else:
                result, levels, owners = EngineRecipe(bounds).build().search(bounds.max_states), [], 0.0
                coordinator = time.process_time() - cpu
            name = f"{shape}, {f'{workers} worker(s)' if workers else '1 process'}"
            runs.append(_figures(name, result, levels, coordinator, workers, owners))
    rows = [
        [run["run"], f"{run['states']:,}", f"{run['transitions']:,}", str(run["complete"]), f"{run['seconds']:.1f}s"]
        + [f"{run['coordinator_cpu']:.1f}", f"{run['worker_cpu']:.1f}"]
        for run in runs
    ]
    print_table(
        rows, ["engine explorer", "states", "transitions", "complete", "time", "coordinator CPU-s", "workers CPU-s"]
    )
    return runs


def _figures(
    name: str, result: Searched, levels: list[Level], coordinator_cpu: float, workers: int = 0, owners_cpu: float = 0.0
) -> dict[str, Any]:
    """One search's figures for the table and the JSON."""
    return {
        "run": name,
        "workers": workers,
        "owners_cpu": round(owners_cpu, 2),
        "states": result.states,
        "transitions": result.transitions,
        "checks": result.checks,
        "complete": result.complete,
        "violation": None if result.violation is None else result.violation.kind.value,
        "seconds": round(result.seconds, 2),
        "states_per_second": round(result.states / result.seconds, 1) if result.seconds else 0.0,
        "coordinator_cpu": round(coordinator_cpu, 2),
        "worker_cpu": round(sum(level.worker_cpu for level in levels), 2),
        "levels": [
            {
                "depth": level.depth,
                "expanded": level.expanded,
                "found": level.found,
                "seconds": round(level.working + level.walking, 2),
                "worker_cpu": round(level.worker_cpu, 2),
                "coordinator_cpu": round(level.coordinator_cpu, 2),
            }
            for level in levels
        ],
    }


def report_level(level: Level) -> None:
    """A level's progress line on stderr: states, speed, the workers' and the coordinator's CPU."""
    seconds = level.working + level.walking
    rate = level.expanded / seconds if seconds else 0.0
    _log(
        f"  depth {level.depth}: {level.expanded:,} expanded, {level.found:,} found, {level.states:,} states,"
        f" {rate:,.0f} expanded/s; workers {level.worker_cpu:.1f} CPU-s, coordinator {level.coordinator_cpu:.1f} CPU-s"
    )


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
