"""Iteration-level continuous batching: the configuration, sequence ids and FIFO scheduler.

Modelled (seed B, Phase 1): each iteration the scheduler decides which sequences run a prefill
chunk and which decode one token. Its promises, kept exactly from the original:
- decode first: every running sequence decodes, whatever the free state slots;
- FIFO admission from the queue up to `max_batch_size` active sequences;
- the memory guard: no admission while free KV pages are below `prefill_reserve_pages`, unless
  the batch is empty (an empty batch is never starved);
- every waiting (prefilling) sequence gets one continuation chunk per iteration, never twice.

Decisions: a continuation chunk's start is `None` ("where it left off"), not the original's
in-band `usize::MAX`; Phase 1 never evicts, so `evict` is always empty.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from kvsched.spec.domain import as_int, require_u64
from kvsched.spec.errors import InvalidConfig

CHUNK_SIZE_LIMIT = 512  # ADR-048 R3 of the original: a longer chunk risked the device timeout


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """Batching limits; validated at construction (`InvalidConfig` names the first bad field)."""

    max_batch_size: int = 32
    max_seq_len: int = 4096
    chunk_size: int = 512
    prefill_reserve_pages: int = 8

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_seq_len", "chunk_size", "prefill_reserve_pages"):
            value = as_int(getattr(self, name))
            if value is None:
                raise InvalidConfig(f"{name} must be an integer")
            object.__setattr__(self, name, value)
        if self.max_batch_size <= 0:
            raise InvalidConfig("max_batch_size must be > 0")
        if self.max_seq_len <= 0:
            raise InvalidConfig("max_seq_len must be > 0")
        if self.chunk_size <= 0:
            raise InvalidConfig("chunk_size must be > 0")
        if self.chunk_size > CHUNK_SIZE_LIMIT:
            raise InvalidConfig(
                f"chunk_size {self.chunk_size} exceeds {CHUNK_SIZE_LIMIT}-token safety limit "
                "(ADR-048 R3: Metal device timeout)"
            )
        if self.prefill_reserve_pages < 0:
            raise InvalidConfig("prefill_reserve_pages must be >= 0")


@dataclass(frozen=True, slots=True, order=True)
class SeqId:
    """A sequence id: monotonic, never reused."""

    value: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", require_u64("SeqId", self.value))

    def __str__(self) -> str:
        return f"seq:{self.value}"


@dataclass(slots=True)
class SeqIdCounter:
    """Hands out SeqIds 0, 1, 2, ... (the original's `SeqId::next(&mut u64)`)."""

    value: int = 0

    def next(self) -> SeqId:
        """The current id; the counter moves past it."""
        seq_id = SeqId(self.value)
        self.value += 1
        return seq_id


class PrefillChunk(NamedTuple):
    """One prefill chunk to run: `chunk_start is None` continues where the sequence left off."""

    seq_id: SeqId
    chunk_start: int | None
    chunk_len: int


@dataclass(slots=True)
class SchedulerDecision:
    """What the worker runs this iteration."""

    prefill: list[PrefillChunk] = field(default_factory=list)
    decode: list[SeqId] = field(default_factory=list)
    evict: list[SeqId] = field(default_factory=list)


class Scheduler(Protocol):
    """Called once per iteration to choose the batch."""

    def select_batch(
        self, waiting: Sequence[SeqId], running: Sequence[SeqId], kv_free_pages: int, free_state_slots: int
    ) -> SchedulerDecision: ...

    def on_preempt(self, seq_id: SeqId) -> None: ...


def can_admit_new(config: BatchConfig, active: int, kv_free_pages: int) -> bool:
    """The memory guard: enough free pages, or nothing running that could be starved."""
    return kv_free_pages >= config.prefill_reserve_pages or active == 0


class FifoScheduler:
    """First-in-first-out admission with chunked prefill (Phase 1: no eviction)."""

    def __init__(self, config: BatchConfig) -> None:
        self.config = config
        self._queue: deque[SeqId] = deque()

    def enqueue(self, seq_id: SeqId) -> None:
        """Queue a sequence for admission."""
        self._queue.append(seq_id)

    def waiting_count(self) -> int:
        """How many sequences wait for admission."""
        return len(self._queue)

    def queued(self) -> tuple[SeqId, ...]:
        """The admission queue, front first."""
        return tuple(self._queue)

    def select_batch(
        self, waiting: Sequence[SeqId], running: Sequence[SeqId], kv_free_pages: int, free_state_slots: int
    ) -> SchedulerDecision:
        """Decode every running sequence, admit FIFO within capacity and the memory guard, and
        continue every waiting sequence's prefill once. `free_state_slots` does not gate decode."""
        decision = SchedulerDecision()
        active = len(waiting) + len(running)
        capacity = max(self.config.max_batch_size - active, 0)
        limit = capacity if can_admit_new(self.config, active, kv_free_pages) else 0
        while limit > 0 and self._queue:
            decision.prefill.append(PrefillChunk(self._queue.popleft(), 0, self.config.chunk_size))
            limit -= 1
        decision.decode.extend(running)
        admitted = {chunk.seq_id for chunk in decision.prefill}
        for seq_id in waiting:
            if seq_id not in admitted:
                decision.prefill.append(PrefillChunk(seq_id, None, self.config.chunk_size))
        return decision

    def on_preempt(self, seq_id: SeqId) -> None:
        """Phase 1 never preempts; nothing to do."""
