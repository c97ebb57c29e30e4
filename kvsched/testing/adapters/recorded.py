"""A page manager's calls, recorded once and replayed without it.

`Recorder` wraps any adapter and logs each call the harness makes (verb, arguments, answer or
what it raised), views included. `Replay` is an adapter that answers from such a log: the harness replaying the
same program over it makes the same calls, so its checks run on the manager's recorded states
without the manager installed (how CI keeps SGLang's recorded behaviour checked). A call the log
does not hold next is a `TraceDiverged`, never a guess.

A trace is JSON: the factory's name, the pool's size, the capabilities (a hybrid manager's
groups too: `groups_to_json`), the program (the harness's calls, as `SafetyMachine.program`
writes them), the verdict it had (`"pass"` or the failed check's name) and the calls. A key that
is bytes (vLLM's block hashes) is written as its hex string: the harness only compares keys.
`record_programs`, `record` and `write` are how `make vllm` and `make sglang` record them.
"""

from __future__ import annotations

import functools
import gzip
import json
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvsched.spec.kv_layout import Chunked, Full, Group, Recurrent, Window
from kvsched.testing.adapter import PageManager, PoolView
from kvsched.testing.checks import CheckFailed, CheckFailure
from kvsched.testing.safety import VOCABULARY, SafetyMachine
from kvsched.testing.safety_search import MAX_TOKENS, prompt_starts


class TraceDiverged(AssertionError):
    """The harness asked a replay for a call its trace does not hold next."""


def view_to_json(view: PoolView) -> dict[str, Any]:
    data = {
        "holders": list(view.holders),
        "free": sorted(view.free),
        "tables": [[request_id, list(table)] for request_id, table in sorted(view.tables.items())],
        "cached": [[page, key.hex() if isinstance(key, bytes) else key] for page, key in sorted(view.cached.items())],
        "reserved": sorted(view.reserved),
        "evictable": sorted(view.evictable),
    }
    if view.group_tables:
        data["group_tables"] = [
            [request_id, [list(table) for table in tables]] for request_id, tables in sorted(view.group_tables.items())
        ]
    if view.state_slots:  # a recurrent group's
        data["state_slots"] = view.state_slots
        data["states"] = [[request_id, list(slots)] for request_id, slots in sorted(view.states.items())]
        data["snapshots"] = [[slot, key] for slot, key in sorted(view.snapshots.items())]
        data["state_free"] = sorted(view.state_free)
    return data


def _frozen(value: Any) -> Any:
    """JSON's lists as tuples, all the way down (a key compares as it was recorded)."""
    return tuple(_frozen(item) for item in value) if isinstance(value, list) else value


def view_from_json(data: dict[str, Any]) -> PoolView:
    return PoolView(
        holders=tuple(data["holders"]),
        free=frozenset(data["free"]),
        tables={request_id: tuple(table) for request_id, table in data["tables"]},
        cached={page: _frozen(key) for page, key in data["cached"]},
        reserved=frozenset(data["reserved"]),
        evictable=frozenset(data["evictable"]),
        group_tables={
            request_id: tuple(tuple(table) for table in tables) for request_id, tables in data.get("group_tables", ())
        },
        state_slots=data.get("state_slots", 0),
        states={request_id: tuple(slots) for request_id, slots in data.get("states", ())},
        snapshots={slot: _frozen(key) for slot, key in data.get("snapshots", ())},
        state_free=frozenset(data.get("state_free", ())),
    )


GROUP_KINDS: dict[str, Callable[..., Group]] = {
    "Full": Full,
    "Window": Window,
    "Chunked": Chunked,
    "Recurrent": Recurrent,
}


def groups_to_json(groups: Sequence[Group]) -> list[list[Any]]:
    """A hybrid manager's groups as the trace names them: [kind] or [kind, tokens]."""
    return [
        [type(group).__name__, *([group.tokens] if isinstance(group, Window | Chunked) else [])] for group in groups
    ]


def groups_from_json(data: Sequence[Sequence[Any]]) -> tuple[Group, ...]:
    return tuple(GROUP_KINDS[kind](*sizes) for kind, *sizes in data)


class RecordedError(RuntimeError):
    """What a recorded manager raised at this call, raised again by its replay."""


class Recorder:
    """`manager`, every call logged in `calls` as [verb, arguments, answer], or as [verb,
    arguments, None, what it raised]."""

    def __init__(self, manager: PageManager) -> None:
        self.manager = manager
        self.capabilities = manager.capabilities - {"events"}  # its KV events are not recorded: a replay checks states
        self.groups: tuple[Group, ...] = tuple(getattr(manager, "groups", ()))
        self.calls: list[list[Any]] = []

    def _call(self, verb: str, args: Sequence[Any], *call: Any) -> Any:
        logged = [verb, [list(arg) if isinstance(arg, tuple) else arg for arg in args]]
        try:
            answer = getattr(self.manager, verb)(*call)
        except Exception as error:
            self.calls.append([*logged, None, f"{type(error).__name__}: {error}"])
            raise
        self.calls.append([*logged, view_to_json(answer) if isinstance(answer, PoolView) else answer])
        return answer

    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        answer: int | None = self._call("admit", (request_id, tuple(tokens)), request_id, tokens)
        return answer

    def append(self, request_id: int, token: int) -> bool:
        return bool(self._call("append", (request_id, token), request_id, token))

    def written(self, request_id: int, tokens: int) -> None:
        self._call("written", (request_id, tokens), request_id, tokens)

    def free(self, request_id: int) -> None:
        self._call("free", (request_id,), request_id)

    def reset_cache(self) -> bool:
        return bool(self._call("reset_cache", ()))

    def speculate(self, request_id: int, token: int, drafts: Sequence[int]) -> bool:
        return bool(self._call("speculate", (request_id, token, tuple(drafts)), request_id, token, drafts))

    def accept(self, request_id: int, accepted: int) -> None:
        self._call("accept", (request_id, accepted), request_id, accepted)

    def state_copies(self) -> Any:
        return self._call("state_copies", ())

    def view(self) -> PoolView:
        answer: PoolView = self._call("view", ())
        return answer


class Replay:
    """An adapter answering from a recorded trace's calls, in order."""

    def __init__(
        self, calls: Sequence[Sequence[Any]], capabilities: frozenset[str], groups: tuple[Group, ...] = ()
    ) -> None:
        self.calls = list(calls)
        self.capabilities = capabilities
        self.groups = groups
        self.next = 0

    def _answer(self, verb: str, args: list[Any]) -> Any:
        if self.next >= len(self.calls):
            raise TraceDiverged(f"call {self.next}: {verb}{tuple(args)}, past the trace's {len(self.calls)} calls")
        recorded_verb, recorded_args, answer, *raised = self.calls[self.next]
        if (recorded_verb, recorded_args) != (verb, args):
            raise TraceDiverged(
                f"call {self.next}: {verb}{tuple(args)}, where the trace holds {recorded_verb}{tuple(recorded_args)}"
            )
        self.next += 1
        if raised:
            raise RecordedError(raised[0])
        return answer

    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        answer: int | None = self._answer("admit", [request_id, list(tokens)])
        return answer

    def append(self, request_id: int, token: int) -> bool:
        return bool(self._answer("append", [request_id, token]))

    def written(self, request_id: int, tokens: int) -> None:
        self._answer("written", [request_id, tokens])

    def free(self, request_id: int) -> None:
        self._answer("free", [request_id])

    def reset_cache(self) -> bool:
        return bool(self._answer("reset_cache", []))

    def speculate(self, request_id: int, token: int, drafts: Sequence[int]) -> bool:
        return bool(self._answer("speculate", [request_id, token, list(drafts)]))

    def accept(self, request_id: int, accepted: int) -> None:
        self._answer("accept", [request_id, accepted])

    def state_copies(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        before, after = self._answer("state_copies", [])
        return [tuple(pair) for pair in before], [tuple(pair) for pair in after]

    def view(self) -> PoolView:
        return view_from_json(self._answer("view", []))


def load_trace(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


# -- recording a manager's answers (make vllm, make sglang) -------------------------------------------


def random_program(machine: SafetyMachine, rng: random.Random, steps: int) -> None:
    """The campaign's verbs, drawn from `rng`, on requests 1..5 (with "drafts", speculative decodes
    of one to three drafts too)."""
    starts = prompt_starts(machine.page_size)
    verbs: tuple[str, ...] = ("submit", "submit", "decode", "decode_all", "finish", "preempt", "resume", "reset")
    if "drafts" in machine.capabilities:
        verbs += ("speculate", "speculate")
    for _ in range(steps):
        verb, request_id = rng.choice(verbs), rng.randint(1, 5)
        known = request_id in machine.sequences or request_id in machine.preempted
        if verb == "submit" and not known:
            start = rng.choice(starts)[: rng.randint(0, 3 * machine.page_size)]
            extra = tuple(rng.randint(0, VOCABULARY - 1) for _ in range(rng.randint(0, machine.page_size)))
            machine.submit(request_id, (start + extra) or (0,))
        elif verb == "decode" and 0 < len(machine.sequences.get(request_id, ())) < MAX_TOKENS:
            machine.decode(request_id)
        elif verb == "decode_all":
            for live in sorted(machine.sequences):
                if len(machine.sequences[live]) < MAX_TOKENS:
                    machine.decode(live)
        elif verb in ("finish", "preempt") and request_id in machine.sequences:
            getattr(machine, verb)(request_id)
        elif verb == "resume" and request_id in machine.preempted:
            machine.resume(request_id)
        elif verb == "reset":
            machine.reset_cache()
        elif verb == "speculate" and 0 < len(machine.sequences.get(request_id, ())) < MAX_TOKENS - 3:
            drafts = rng.randint(1, 3)
            machine.speculate(request_id, drafts, rng.randint(0, drafts))
    machine.teardown()


def record(
    name: str,
    factory: Callable[[int, int], PageManager],
    pages: int,
    page_size: int,
    body: Callable[[SafetyMachine], None],
) -> dict[str, Any]:
    """A trace of `body` run by the harness over `factory`'s manager behind a `Recorder`, with the
    verdict it had."""
    recorders: list[Recorder] = []

    def recorded(pages: int, page_size: int) -> Recorder:
        recorders.append(Recorder(factory(pages, page_size)))
        return recorders[-1]

    machine = SafetyMachine(recorded, pages, page_size, check=False)
    verdict = "pass"
    try:
        machine.check_start()
        body(machine)
    except CheckFailed as failure:
        verdict = failure.failure.kind.name
    groups = {"groups": groups_to_json(machine.groups)} if machine.groups else {}
    return {
        "factory": name,
        "pages": pages,
        "page_size": page_size,
        "capabilities": sorted(machine.capabilities),
        **groups,
        "program": machine.program,
        "verdict": verdict,
        "calls": recorders[0].calls,
    }


def write(path: Path, traces: list[dict[str, Any]]) -> None:
    """The traces as gzipped JSON (no timestamp: the same traces, the same file)."""
    path.write_bytes(gzip.compress((json.dumps(traces) + "\n").encode(), mtime=0))


def record_programs(
    name: str, factory: Callable[[int, int], PageManager], page_size: int, programs: int, steps: int
) -> list[dict[str, Any]]:
    """`programs` seeded random programs (`random_program`, seed n for the n-th, on a pool of 4 to
    16 pages) over `factory`'s manager, recorded; each failed one is reported on stderr."""
    traces = []
    for number in range(programs):
        rng = random.Random(number)
        pages = rng.choice((4, 6, 8, 16))
        traces.append(record(name, factory, pages, page_size, functools.partial(random_program, rng=rng, steps=steps)))
    failed = [trace for trace in traces if trace["verdict"] != "pass"]
    calls = sum(len(trace["calls"]) for trace in traces)
    print(f"{name}: {len(traces)} programs, {calls} calls recorded, {len(failed)} failed", file=sys.stderr)
    for trace in failed:
        print(f"  {trace['verdict']}: " + "; ".join(trace["program"]), file=sys.stderr)
    return traces


def run_pinned(machine: SafetyMachine, lines: Sequence[str]) -> None:
    """A pinned program's lines, run on `machine`."""
    for line in lines:
        exec(line, {"machine": machine})  # a recorded program of the harness's calls


def replay(trace: dict[str, Any]) -> CheckFailure | None:
    """The trace's program over its recorded answers: the failed check, or None (every call used)."""
    groups = groups_from_json(trace.get("groups", ()))
    answers = Replay(trace["calls"], frozenset(trace["capabilities"]), groups)
    machine = SafetyMachine(lambda pages, page_size: answers, trace["pages"], trace["page_size"], check=False)
    try:
        machine.check_start()
        run_pinned(machine, trace["program"])
    except CheckFailed as failed:
        return failed.failure
    if answers.next != len(answers.calls):
        raise TraceDiverged(f"the program ended at call {answers.next} of the trace's {len(answers.calls)}")
    return None
