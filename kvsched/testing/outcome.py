"""What a checked call did and what a check found: the vocabulary every harness speaks.

`capture` runs a call and keeps its `Outcome` (the value, or the exception's type, message and
typed details, compared by value); a check that fails returns a `CheckFailure` of one
`FailureKind`; `CheckFailed` is the `AssertionError` a harness raises, carrying the failure, so a
report reads the kind off the failure, never off a message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, is_dataclass
from enum import Enum
from typing import Any

from kvsched.spec.errors import KvschedError
from kvsched.spec.plan import WritePlan


class FailureKind(Enum):
    """Which check a failure comes from."""

    UNTYPED = "untyped error"
    LOCKSTEP = "lockstep"
    ATOMICITY = "atomicity"
    READ_ONLY = "read-only query"
    LIFO = "LIFO order"
    EXCLUSIVE = "exclusive write"
    INVARIANT = "invariant"
    GHOST = "ghost read"
    LIVENESS = "liveness"
    DETERMINISM = "determinism"  # a request's tokens differ from its run alone
    ORDER = "queue order"  # a preempted request queued behind a later arrival of its priority
    CACHE = "cached content"  # a cached page does not hold the tokens its key names
    ISOLATION = "tenant isolation"  # a request holds a page cached for another tenant or adapter
    FULL_HIT = "full prefix hit"  # a prefix hit left no prompt token to compute
    LEAK = "leaked page"  # a page neither free nor reserved once every request is freed
    EVENTS = "KV events"  # the published events do not fold to the cached set

    def __repr__(self) -> str:
        return f"FailureKind.{self.name}"


@dataclass(frozen=True, slots=True)
class CheckFailure:
    """A failed check: its kind and what it saw."""

    kind: FailureKind
    detail: str

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.detail}"


class CheckFailed(AssertionError):
    """A harness's failed check, with the `CheckFailure` it found."""

    def __init__(self, failure: CheckFailure) -> None:
        super().__init__(str(failure))
        self.failure = failure


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a call did: the value it returned, or its exception's type, message and typed
    details (compared by value, so two systems' outcomes compare with `==`)."""

    value: Any = None
    error: type[BaseException] | None = None
    message: str = ""
    details: tuple[tuple[str, int | None], ...] = ()

    def summary(self, results: bool = True) -> tuple[Any, ...]:
        """A comparable form: the normalized value (only that it returned, unless `results`),
        or the error's type, message and details."""
        if self.error is None:
            return ("returns", normalize(self.value) if results else None)
        return ("raises", self.error.__name__, self.message, self.details)

    @property
    def typed(self) -> bool:
        """It returned, or raised a kvsched error."""
        return self.error is None or issubclass(self.error, KvschedError)


def capture(call: Callable[[], Any], detailed: bool = True) -> Outcome:
    """Run `call`; its value or whatever it raised (every exception, typed or not). Unless
    `detailed`, a kvsched error is kept by its type alone (a search that compares no messages
    skips formatting them)."""
    try:
        return Outcome(call())
    except KvschedError as error:
        if not detailed:
            return Outcome(None, type(error))
        return Outcome(None, type(error), str(error), tuple(error.details().items()))
    except Exception as error:  # an untyped error is a finding, compared like any other
        return Outcome(None, type(error), str(error))


def normalize(value: Any) -> Any:
    """A comparable form of a result: plans by their steps, dataclasses by name and fields,
    sequences as tuples, numpy scalars as Python numbers."""
    if isinstance(value, Mapping):  # a step's tokens and finished requests, in any mapping form
        return tuple(sorted((key, normalize(item)) for key, item in value.items()))
    if isinstance(value, WritePlan):  # the spec's or impl's: by its steps
        return ("WritePlan", normalize(value.targets()), normalize(tuple(value)))
    if is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, *(normalize(getattr(value, f.name)) for f in fields(value)))
    if isinstance(value, list | tuple):
        return tuple(normalize(item) for item in value)
    if hasattr(value, "item") and callable(value.item):
        return normalize(value.item())
    return value
