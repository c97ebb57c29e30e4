"""The engine's running requests as a part: each in its scheduler slot's row, and what the engine
knows of it beyond the scheduler.

    tokens, fields   the rows (`kvsched.impl.engine_rows`): prompt + generated, and LENGTH,
                     LIMIT, EOS, COMPUTED, DECODING, ADMITTED, STATE_SLOT
    requests         each slot's request (None: an empty slot)
    slots            request id -> slot, in admission order
    prefilling       the slots still prefilling
    waiting          slot -> the promotions (copies from the host tier) it waits for
    admissions       the admission clock
    state_owners     each recurrent-state slot's owner; `state_free` the free ones, a min-heap

`to_spec()` is its part of the spec's `EngineState` (`running`, `state_slots`, `admissions`).
`Record` is what a step has done so far (the spec's `StepRecord`).
A step's plan changes the part only by its admissions, which a failed step lets go (`leave`,
`Admission.undo`): a newcomer writes only its own row, of a slot empty when the step began.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from kvsched.impl.engine_rows import ADMITTED, COMPUTED, DECODING, FIELDS, LENGTH, STATE_SLOT, TOKEN
from kvsched.spec.engine_config import EngineConfig, EngineRequest
from kvsched.spec.engine_state import Running
from kvsched.spec.sequence import FinishReason


class RunningSet:
    """The running requests; see the module docstring."""

    __slots__ = (
        "admissions",
        "fields",
        "prefilling",
        "requests",
        "slots",
        "state_free",
        "state_owners",
        "tokens",
        "waiting",
    )

    # How a failed step leaves each attribute as it was (a test requires every attribute here).
    ON_FAILURE: ClassVar[Mapping[str, str]] = {
        "tokens": "the plan writes only its newcomers' rows, of slots empty when it began",
        "fields": "the plan writes only its newcomers' rows, of slots empty when it began",
        "requests": "a newcomer's entry, let go (`leave`)",
        "slots": "a newcomer's entry, let go (`leave`)",
        "prefilling": "a newcomer's entry, let go (`leave`)",
        "waiting": "written at the commit only (the promotions)",
        "admissions": "counted back by `Admission.undo`",
        "state_owners": "a newcomer's state slot, freed (`leave`)",
        "state_free": "a newcomer's state slot, freed (`leave`)",
    }

    def __init__(self, config: EngineConfig) -> None:
        width = min(config.max_seq_len, config.table_tokens)
        self.tokens = np.zeros((config.requests, width), dtype=TOKEN)
        self.fields = np.zeros((config.requests, FIELDS), dtype=np.int64)
        self.requests: list[EngineRequest | None] = [None] * config.requests
        self.slots: dict[int, int] = {}  # request id -> slot, admission order
        self.prefilling: set[int] = set()  # slots of running requests still prefilling
        self.waiting: dict[int, tuple[int, ...]] = {}  # slot -> the promotions it waits for
        self.admissions = 0
        self.state_owners: list[int | None] = [None] * config.state_slots
        self.state_free: list[int] = list(range(config.state_slots))  # a min-heap

    def __len__(self) -> int:
        return len(self.slots)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.slots

    def to_spec(self) -> tuple[tuple[Running, ...], tuple[int | None, ...], int]:
        """The spec's `running`, `state_slots` and `admissions`."""
        running = []
        for slot in self.slots.values():
            request = self.request(slot)
            row = self.fields[slot].tolist()
            generated = tuple(self.tokens[slot, len(request.prompt) : row[LENGTH]].tolist())
            state_slot = None if row[STATE_SLOT] < 0 else row[STATE_SLOT]
            waiting = self.waiting.get(slot, ())
            running.append(
                Running(request, generated, row[COMPUTED], bool(row[DECODING]), row[ADMITTED], state_slot, waiting)
            )
        return tuple(running), tuple(self.state_owners), self.admissions

    def request(self, slot: int) -> EngineRequest:
        """The request running in `slot`."""
        request = self.requests[slot]
        assert request is not None, "a running request's slot"
        return request

    def generated(self, slot: int) -> tuple[int, ...]:
        """The tokens `slot`'s request generated so far."""
        return tuple(self.tokens[slot, len(self.request(slot).prompt) : int(self.fields[slot, LENGTH])].tolist())

    # -- recurrent-state slots ----------------------------------------------------------------

    def state_slot_free(self) -> bool:
        """A newcomer can have a state slot (or the engine has none)."""
        return not self.state_owners or bool(self.state_free)

    def take_state_slot(self, owner: int) -> int:
        """The lowest free state slot, now `owner`'s (-1 when the engine has none)."""
        if not self.state_owners:
            return -1
        state_slot = heapq.heappop(self.state_free)
        self.state_owners[state_slot] = owner
        return state_slot

    def free_state_slot(self, state_slot: int) -> None:
        """A released request's recurrent-state slot is free again."""
        self.state_owners[state_slot] = None
        heapq.heappush(self.state_free, state_slot)

    # -- leaving, and the orders ----------------------------------------------------------------

    def leave(self, slot: int) -> None:
        """`slot`'s request leaves (its pages are the scheduler's to release): its state slot is
        freed and the slot is empty."""
        state_slot = int(self.fields[slot, STATE_SLOT])
        if state_slot >= 0:
            self.free_state_slot(state_slot)
        del self.slots[self.request(slot).request_id]
        self.prefilling.discard(slot)
        self.waiting.pop(slot, None)
        self.requests[slot] = None

    def prefill_order(self, slot: int) -> tuple[int, int]:
        """The order running prefills get their chunks in: strict priority, then admission."""
        return (-self.request(slot).priority, int(self.fields[slot, ADMITTED]))

    def victim_order(self, slot: int) -> tuple[int, int]:
        """Preemption order: the smallest is preempted first (lowest priority, latest admitted)."""
        return (self.request(slot).priority, -int(self.fields[slot, ADMITTED]))


NOTHING = np.zeros(0, dtype=np.uint64)  # no round ran: no ids, no tokens
NOTHING.flags.writeable = False


@dataclass(slots=True)
class Record:
    """What a step has done so far."""

    ids: npt.NDArray[Any] = field(default_factory=lambda: NOTHING)  # the round's request ids (an array it owns)
    tokens: npt.NDArray[Any] = field(default_factory=lambda: NOTHING)  # and sampled tokens
    prefilled: dict[int, tuple[int, ...]] = field(default_factory=dict)
    finished: dict[int, FinishReason] = field(default_factory=dict)
    preempted: list[int] = field(default_factory=list)
    finishing: list[int] = field(default_factory=list)  # slots finished this step: released at its end
    tokens_run: int = 0
    chunks: list[tuple[int, int, int]] = field(default_factory=list)  # (slot, start, stop) each chunk wrote
    filled: list[list[int]] = field(default_factory=list)  # the round's filled pages: (admitted, slot, depth, page)
