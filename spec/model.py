"""The engine's model boundary: the ragged decode backend, a prefill backend, and a null model.

Each step the engine makes at most these calls, in this order:

    copy_pages(pairs)          the decode round's copy-on-write copies (source, destination)
    execute_ragged(...)        the decode round: one call for every decoding request (seed A's)
    copy_pages(pairs)          the prefill chunks' copy-on-write copies
    execute_prefill(items)     every prefill chunk of the step in one call; one token per chunk

With a host tier (`EngineConfig.host_pages`) the model also copies pages between the device and
the host, asynchronously (`CopyBackend`): at the start of each step the engine asks which copies
in flight are done (`copies_done`), and at its end starts all of the step's new ones in one call
(`start_copies`), after every other call of the step. A copy is issued in one step and reported
done in a later one. One call makes a step's copies all or nothing: when it raises, none was
started and each fails at once (the step, committed, stands); once it returns, the copies are
the engine's state.

A copy is made before anything writes its destination. `execute_prefill` computes each item's
tokens at positions `start, start + 1, ...` into the pages its table maps and answers, per item
in order, the greedy next token after its last one (the engine uses it when the chunk completes
the sequence). A model reports failure by raising; the engine then keeps the state it had.

`NullModel` has no KV: the next token is a fixed function of the token and its position
(`null_next_token`), so every request's tokens are known in advance, whatever the batching.
"""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvsched.spec.batch import RaggedBatchItem, RaggedBatchOutput, RaggedBatchReceipt, RaggedDecodeBackend


@dataclass(frozen=True, slots=True)
class PrefillItem:
    """One request's prefill chunk: `tokens` at positions `start ...`, written through `table`."""

    request_id: int
    slot: int  # the request's scheduler slot
    tokens: tuple[int, ...]
    start: int
    table: tuple[int | None, ...]  # its logical page table (None where unmapped)


class PrefillBackend(Protocol):
    """Prefill chunks and copy-on-write copies."""

    def copy_pages(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy the KV of page `source` into page `destination`, for every `(source, destination)`
        pair, before anything writes a destination.

        The engine calls it before the decode round and before the prefill chunks, with the
        copy-on-write copies that step's writes need (possibly none). A destination was just
        allocated for the request that writes it; a source may be shared. Raise to report a
        failure: the engine is left exactly as before the step.
        """
        ...

    def execute_prefill(self, items: Sequence[PrefillItem]) -> Sequence[int]:
        """Compute every prefill chunk of the step, in one call.

        For each `PrefillItem`, compute the KV of `tokens` at positions `start, start + 1, ...`
        into the pages its `table` maps (logical page `position // page_size`; the engine made
        them writable), reading the KV of every earlier position of the request. Answer one
        token per item, in item order: the greedy next token after the item's last token (the
        engine uses it when the chunk completes the prompt, and ignores it otherwise). Any
        iterable of integers will do: a list, a tuple, a 1-D integer numpy array. A wrong count
        or a value that is not a u32 token fails the step with `OutputIdentityMismatch`; raise to
        report a failure. Either way the engine is left exactly as before the step.
        """
        ...


@dataclass(frozen=True, slots=True)
class HostCopy:
    """One page copy between the tiers: `source` to `destination` (host page to device page for
    `start_copies`'s `to_device`, device page to host page for its `to_host`), named
    `transfer_id`."""

    transfer_id: int
    source: int
    destination: int


class CopyBackend(Protocol):
    """Asynchronous copies between device pages and host pages (a host tier's model)."""

    def start_copies(self, to_device: Sequence[HostCopy], to_host: Sequence[HostCopy]) -> None:
        """Start copying each host page `source` of `to_device` into device page `destination`,
        and each device page `source` of `to_host` into host page `destination`: every copy
        of one step, in one call, the step's last. The engine holds every page named until its
        copy is reported done; nothing reads a destination or writes a source meanwhile.

        All or nothing: raise only when no copy was started; the engine then fails each of them
        at once (as if `copies_done` had said False). A backend that started some copies and
        cannot start the rest must not raise: it returns, and reports the rest failed
        (`copies_done`), so the engine keeps holding the pages of every copy that may still
        write."""
        ...

    def copies_done(self, transfer_ids: Sequence[int]) -> Sequence[bool | None]:
        """For each copy named (all in flight, ascending): True when it completed, False when it
        failed (it wrote nothing anyone will read), None while it runs. Answers must not change
        once given: a step that fails later asks again."""
        ...


class EngineModel(RaggedDecodeBackend, PrefillBackend, Protocol):
    """What an engine runs: a decode backend and a prefill backend in one object."""


NULL_VOCAB = 32000


def null_next_token(token: int, position: int, vocab: int = NULL_VOCAB) -> int:
    """The null model's next token after `token` at `position`."""
    return (token * 31 + position * 7 + 1) % vocab


def null_answer(prompt: tuple[int, ...], count: int, vocab: int = NULL_VOCAB) -> tuple[int, ...]:
    """The null model's first `count` tokens after `prompt`, run alone."""
    tokens, last = [], prompt[-1]
    for position in range(len(prompt) - 1, len(prompt) - 1 + count):
        last = null_next_token(last, position, vocab)
        tokens.append(last)
    return tuple(tokens)


class NullModel:
    """A model with no KV whose next token is `null_next_token(token, position)`: for tests and
    benchmarks (the spec's record form; `kvsched.impl.NullModel` serves both forms)."""

    def __init__(self, vocab: int = NULL_VOCAB) -> None:
        self.vocab = vocab
        self.copies = 0  # pages copied so far (copy-on-write)
        self.to_host = 0  # pages copied to the host tier so far
        self.to_device = 0  # pages copied from the host tier so far
        self.tokens = 0  # tokens computed so far (prefill and decode)

    def copy_pages(self, pairs: Sequence[tuple[int, int]]) -> None:
        self.copies += len(pairs)

    def start_copies(self, to_device: Sequence[HostCopy], to_host: Sequence[HostCopy]) -> None:
        self.to_device += len(to_device)
        self.to_host += len(to_host)

    def copies_done(self, transfer_ids: Sequence[int]) -> Sequence[bool | None]:
        """Every copy completes by the next step."""
        return [True] * len(transfer_ids)

    def execute_prefill(self, items: Sequence[PrefillItem]) -> Sequence[int]:
        self.tokens += sum(len(item.tokens) for item in items)
        return [null_next_token(item.tokens[-1], item.start + len(item.tokens) - 1, self.vocab) for item in items]

    def execute_ragged(
        self, items: Sequence[RaggedBatchItem], block_tables: Sequence[int], out: MutableSequence[RaggedBatchOutput]
    ) -> RaggedBatchReceipt:
        self.tokens += len(items)
        for index, item in enumerate(items):
            out[index] = RaggedBatchOutput(
                item.request_id, item.slot, null_next_token(item.token_id, item.position, self.vocab)
            )
        return RaggedBatchReceipt(len(items), 1, len(items) * RaggedBatchOutput.SIZE)
