"""A generation sequence's progress: prefill chunks, generated tokens, and how it ended.

Modelled (seed B): a sequence is `Prefilling(chunk_start)` until its prompt is consumed (an
overshooting chunk is allowed), then `Decoding`, then `Finished(reason)`. EOS is checked before
the length limit. `GenerationSequence` is one request (the seed's `Sequence`, renamed so it never shadows
`typing.Sequence`); `SequenceManager` keeps the live sequences by id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from kvsched.spec.batching import SeqId, SeqIdCounter


class FinishReason(Enum):
    """Why a sequence stopped."""

    EOS = "eos"
    MAX_LENGTH = "max_length"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"  # the engine's: cancelled by its caller


@dataclass(frozen=True, slots=True)
class Prefilling:
    """The prompt is consumed up to `chunk_start`."""

    chunk_start: int


@dataclass(frozen=True, slots=True)
class Decoding:
    """The prompt is consumed; tokens are being generated."""


@dataclass(frozen=True, slots=True)
class Finished:
    """The sequence is done."""

    reason: FinishReason


SequenceState = Prefilling | Decoding | Finished


@dataclass(slots=True)
class GenerationSequence:
    """One generation request and its progress."""

    id: SeqId
    prompt_ids: list[int]
    max_new_tokens: int
    adapter_id: str | None = None
    generated_ids: list[int] = field(default_factory=list)
    state: SequenceState = field(default_factory=lambda: Prefilling(0))

    def position(self) -> int:
        """The next token index: the chunk start while prefilling, else prompt + generated."""
        if isinstance(self.state, Prefilling):
            return self.state.chunk_start
        return len(self.prompt_ids) + len(self.generated_ids)

    def is_active(self) -> bool:
        """Not finished."""
        return not isinstance(self.state, Finished)

    def advance_prefill(self, tokens: int) -> None:
        """Consume `tokens` prompt tokens; reaching the prompt's end starts decoding."""
        if not isinstance(self.state, Prefilling):
            return
        start = self.state.chunk_start + tokens
        self.state = Decoding() if start >= len(self.prompt_ids) else Prefilling(start)

    def push_token(self, token: int, eos: int | None) -> bool:
        """Append a generated token; True when it finishes the sequence (EOS before length)."""
        self.generated_ids.append(token)
        if eos is not None and token == eos:
            self.state = Finished(FinishReason.EOS)
            return True
        if len(self.generated_ids) >= self.max_new_tokens:
            self.state = Finished(FinishReason.MAX_LENGTH)
            return True
        return False

    def preempt(self) -> None:
        """Stop the sequence as preempted."""
        self.state = Finished(FinishReason.PREEMPTED)


class SequenceManager:
    """The live sequences by id, and the id counter."""

    def __init__(self) -> None:
        self._sequences: dict[SeqId, GenerationSequence] = {}
        self._counter = SeqIdCounter()

    def next_id(self) -> SeqId:
        """A fresh, never reused id."""
        return self._counter.next()

    def add(self, sequence: GenerationSequence) -> None:
        """Track a sequence."""
        self._sequences[sequence.id] = sequence

    def remove(self, seq_id: SeqId) -> GenerationSequence | None:
        """Stop tracking a sequence; the sequence, or None when unknown."""
        return self._sequences.pop(seq_id, None)

    def get(self, seq_id: SeqId) -> GenerationSequence | None:
        """The sequence, or None when unknown."""
        return self._sequences.get(seq_id)

    def ids_prefilling(self) -> list[SeqId]:
        """Prefilling ids, sorted."""
        return sorted(i for i, s in self._sequences.items() if isinstance(s.state, Prefilling))

    def ids_decoding(self) -> list[SeqId]:
        """Decoding ids, sorted."""
        return sorted(i for i, s in self._sequences.items() if isinstance(s.state, Decoding))

    def ids_finished(self) -> list[SeqId]:
        """Finished ids, sorted."""
        return sorted(i for i, s in self._sequences.items() if isinstance(s.state, Finished))

    def __len__(self) -> int:
        return len(self._sequences)
