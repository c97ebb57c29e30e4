"""A page manager's calls, recorded once and replayed without it.

`Recorder` wraps any adapter and logs each call the harness makes (verb, arguments, answer or
what it raised), views included. `Replay` is an adapter that answers from such a log: the harness replaying the
same program over it makes the same calls, so its checks run on the manager's recorded states
without the manager installed (how CI keeps SGLang's recorded behaviour checked). A call the log
does not hold next is a `TraceDiverged`, never a guess.

A trace is JSON: the factory's name, the pool's size, the capabilities, the program (the
harness's calls, as `SafetyMachine.program` writes them), the verdict it had (`"pass"` or the
failed check's name) and the calls.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvsched.testing.adapter import PageManager, PoolView


class TraceDiverged(AssertionError):
    """The harness asked a replay for a call its trace does not hold next."""


def view_to_json(view: PoolView) -> dict[str, Any]:
    return {
        "holders": list(view.holders),
        "free": sorted(view.free),
        "tables": [[request_id, list(table)] for request_id, table in sorted(view.tables.items())],
        "cached": [[page, key] for page, key in sorted(view.cached.items())],
        "reserved": sorted(view.reserved),
        "evictable": sorted(view.evictable),
    }


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
    )


class RecordedError(RuntimeError):
    """What a recorded manager raised at this call, raised again by its replay."""


class Recorder:
    """`manager`, every call logged in `calls` as [verb, arguments, answer], or as [verb,
    arguments, None, what it raised]."""

    def __init__(self, manager: PageManager) -> None:
        self.manager = manager
        self.capabilities = manager.capabilities - {"events"}  # its KV events are not recorded: a replay checks states
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

    def view(self) -> PoolView:
        answer: PoolView = self._call("view", ())
        return answer


class Replay:
    """An adapter answering from a recorded trace's calls, in order."""

    def __init__(self, calls: Sequence[Sequence[Any]], capabilities: frozenset[str]) -> None:
        self.calls = list(calls)
        self.capabilities = capabilities
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

    def view(self) -> PoolView:
        return view_from_json(self._answer("view", []))


def load_trace(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data
