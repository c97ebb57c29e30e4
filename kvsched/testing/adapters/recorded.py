"""A page manager's calls, recorded once and replayed without it.

`Recorder` wraps any adapter and logs each call the harness makes (verb, arguments, answer),
views included. `Replay` is an adapter that answers from such a log: the harness replaying the
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


class Recorder:
    """`manager`, every call logged in `calls` as [verb, arguments, answer]."""

    def __init__(self, manager: PageManager) -> None:
        self.manager = manager
        self.capabilities = manager.capabilities
        self.calls: list[list[Any]] = []

    def _log(self, verb: str, args: Sequence[Any], answer: object) -> None:
        self.calls.append([verb, list(args), view_to_json(answer) if isinstance(answer, PoolView) else answer])

    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        answer = self.manager.admit(request_id, tokens)
        self._log("admit", [request_id, list(tokens)], answer)
        return answer

    def append(self, request_id: int, token: int) -> bool:
        answer = self.manager.append(request_id, token)
        self._log("append", [request_id, token], answer)
        return answer

    def written(self, request_id: int, tokens: int) -> None:
        self.manager.written(request_id, tokens)
        self._log("written", [request_id, tokens], None)

    def free(self, request_id: int) -> None:
        self.manager.free(request_id)
        self._log("free", [request_id], None)

    def reset_cache(self) -> bool:
        answer = bool(getattr(self.manager, "reset_cache")())  # noqa: B009  (an optional verb)
        self._log("reset_cache", [], answer)
        return answer

    def view(self) -> PoolView:
        answer = self.manager.view()
        self._log("view", [], answer)
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
        recorded_verb, recorded_args, answer = self.calls[self.next]
        if (recorded_verb, recorded_args) != (verb, args):
            raise TraceDiverged(
                f"call {self.next}: {verb}{tuple(args)}, where the trace holds {recorded_verb}{tuple(recorded_args)}"
            )
        self.next += 1
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
