"""Shared factories for the tests: small systems and whole-state snapshots."""

from __future__ import annotations

import sys
import types
from collections.abc import MutableSequence, Sequence
from pathlib import Path

import pytest

from kvsched.spec import (
    BlockPool,
    PrefixKvStore,
    RaggedBatchItem,
    RaggedBatchOutput,
    RaggedBatchReceipt,
    RequestScheduler,
)
from kvsched.spec.system import SystemState


def whole_state(pool: BlockPool, store: PrefixKvStore, scheduler: RequestScheduler) -> SystemState:
    """The whole system as one comparable value."""
    return SystemState(pool.state, store.state, scheduler.state)


def scratch(items: int, tables: int, outputs: int) -> tuple[list[RaggedBatchItem], list[int], list[RaggedBatchOutput]]:
    """Caller scratch buffers of the given lengths, in the spec's list form."""
    return [RaggedBatchItem()] * items, [0] * tables, [RaggedBatchOutput()] * outputs


class OneLaunchBackend:
    """The originals' test backend: next token = input token + 1, optionally corrupting output 0."""

    def __init__(self, corrupt_identity: bool = False) -> None:
        self.calls = 0
        self.corrupt_identity = corrupt_identity

    def execute_ragged(
        self,
        items: Sequence[RaggedBatchItem],
        block_tables: Sequence[int],
        out: MutableSequence[RaggedBatchOutput],
    ) -> RaggedBatchReceipt:
        self.calls += 1
        for index, item in enumerate(items):
            out[index] = RaggedBatchOutput(item.request_id, item.slot, item.token_id + 1)
        if self.corrupt_identity:
            first = out[0]
            out[0] = RaggedBatchOutput(first.request_id ^ 1, first.slot, first.next_token_id)
        return RaggedBatchReceipt(len(items), 1, len(items) * 4)


def weakened(module: types.ModuleType, old: str, new: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """`module` built again from its own text with `old` (found exactly once) replaced by `new`:
    a check weakened where a test says it must not be."""
    source = Path(str(module.__file__)).read_text(encoding="utf-8")
    assert source.count(old) == 1, old
    copy = types.ModuleType(f"{module.__name__.replace('.', '_')}_weakened")
    monkeypatch.setitem(sys.modules, copy.__name__, copy)
    exec(compile(source.replace(old, new), str(module.__file__), "exec"), copy.__dict__)  # our own module's text
    return copy
