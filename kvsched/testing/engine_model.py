"""The engine harness's model: its KV is ghost memory, its tokens come from what the KV holds.

Writing the KV of `token` at `position` stores the history that KV encodes: the history read,
through the request's own table, at `position - 1`, then `token` (a real model's KV at a
position is computed from the KV it attends to). The next token is `history_token(history)`, a
function of that whole history, so a request that reads a wrong page (a stale prefix, a page
another request overwrote, a skipped copy) samples a wrong token as well as failing the ghost
read check; `greedy_tokens` is what a request run alone and densely samples.

A `Step` event arms the model: the decode round breaks its contract as `HarnessBackend` does for
the event's `fault`, the prefill call raises when `prefill_fails`, and the copies between the
tiers in flight end as its `copies` say, and the call that starts the step's new copies raises
when `copy_fails` (starting none of them: the protocol's `start_copies`; with the two calls an
engine made before it, `copy_to_device` starts its copies and `copy_to_host` raises). A copy
happens when the model reports it done, not when it is issued: it reads its source then (so a
source page handed to another owner meanwhile is read as that owner wrote it) and writes its
destination then. A copy that fails writes poison into its destination (a partial write), which
no one may read.

The model is an asynchronous backend: a copy it started runs until it is reported, whether or
not the engine still knows of it. `forgotten(state)` names the copies it runs that the engine's
state no longer holds (a failed step that forgot a copy it had started, an id issued twice):
such a copy writes a page the engine may hand to another owner. The host tier may also be
`FAILING` (every copy fails) or have one `BAD_PAGE` (every copy to or from host page 0 fails),
for the liveness checks. `tokens` counts the tokens the model computed (prefill and decode),
so a harness can check each step's against the budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvsched.spec.batch import INVALID_BLOCK
from kvsched.spec.errors import BackendRejected
from kvsched.spec.events import Fault, Step
from kvsched.spec.model import HostCopy, PrefillItem
from kvsched.testing.backends import HarnessBackend
from kvsched.testing.ghost import GhostMemory, History

VOCAB = 50
UNKNOWN = 1000  # stands for a position whose KV was never written
POISON = -1  # what a failed copy leaves in its destination's slots
IN_FLIGHT, DONE, FAILED = 0, 1, 2  # how a step's `copies` ends each copy in flight
WORKING, FAILING, BAD_PAGE = "working", "failing", "bad page"  # how the host tier behaves
BAD_HOST_PAGE = 0  # the host page that fails every copy under BAD_PAGE (the first handed out)


def history_token(history: History) -> int:
    """The harness model's greedy next token after the KV `history`."""
    value = len(history)
    for token in history:
        value = (value * 31 + (UNKNOWN if token is None else token) + 1) % 1_000_003
    return value % VOCAB


def greedy_tokens(prompt: Sequence[int], max_new_tokens: int, eos: int | None) -> list[int]:
    """The tokens the request samples run alone and densely."""
    sequence, tokens = list(prompt), []
    for _ in range(max_new_tokens):
        token = history_token(tuple(sequence))
        tokens.append(token)
        sequence.append(token)
        if token == eos:
            break
    return tokens


class HarnessModel(HarnessBackend):
    """A decode and prefill backend over ghost memory (either batch form), faults on demand."""

    def __init__(self, page_size: int) -> None:
        super().__init__(Fault.NONE, page_size, GhostMemory(page_size))
        self.prefill_fails = False
        self.copies = 0
        self.host = GhostMemory(page_size)  # the host tier's KV
        self.completions: tuple[int, ...] = (DONE,)
        self.in_flight: dict[int, tuple[bool, int, int]] = {}  # id -> (to the host, source, destination)
        self.answers: dict[int, bool] = {}
        self.copy_fails = False
        self.tier = WORKING
        self.lost: list[tuple[int, tuple[bool, int, int]]] = []  # copies whose id was issued again
        self.tokens = 0  # tokens computed so far

    @property
    def memory(self) -> GhostMemory:
        """The ghost KV."""
        assert self.ghost is not None
        return self.ghost

    def arm(self, event: Step) -> None:
        """Break the next step's model calls as `event` says."""
        self.fault = Fault(event.fault)
        self.prefill_fails = bool(event.prefill_fails)
        self.completions = tuple(event.copies) or (DONE,)
        self.copy_fails = bool(event.copy_fails)

    def start_copies(self, to_device: Sequence[HostCopy], to_host: Sequence[HostCopy]) -> None:
        if self.copy_fails:
            raise RuntimeError("injected copy fault: no copy started")
        self._start(to_device, False)
        self._start(to_host, True)

    def copy_to_device(self, copies: Sequence[HostCopy]) -> None:
        self._start(copies, False)

    def copy_to_host(self, copies: Sequence[HostCopy]) -> None:
        if self.copy_fails:
            raise RuntimeError("injected copy fault")
        self._start(copies, True)

    def _start(self, copies: Sequence[HostCopy], to_host: bool) -> None:
        for copy in copies:
            running = self.in_flight.get(copy.transfer_id)
            if running is not None:
                self.lost.append((copy.transfer_id, running))
            self.in_flight[copy.transfer_id] = (to_host, copy.source, copy.destination)

    def forgotten(self, tracked: set[int]) -> list[str]:
        """The copies this backend runs that the engine does not track (`tracked`: the ids of
        its copies in flight), described."""
        running = [(tid, copy) for tid, copy in self.in_flight.items() if tid not in tracked]
        return [
            f"copy {tid} ({'to the host' if to_host else 'to the device'}, page {source} -> {destination})"
            for tid, (to_host, source, destination) in [*self.lost, *running]
        ]

    def copies_done(self, transfer_ids: Sequence[int]) -> list[bool | None]:
        """The i-th copy asked about ends as the armed `completions[i]` says (cycling), unless
        it already ended; an ended copy's answer never changes."""
        for index, transfer_id in enumerate(transfer_ids):
            how = self.completions[index % len(self.completions)]
            if transfer_id in self.answers or how == IN_FLIGHT:
                continue
            to_host, source, destination = self.in_flight.pop(transfer_id)
            host_page = destination if to_host else source
            if self.tier == FAILING or (self.tier == BAD_PAGE and host_page == BAD_HOST_PAGE):
                how = FAILED
            reads, writes = (self.memory, self.host) if to_host else (self.host, self.memory)
            if how == DONE:
                writes.pages[destination] = dict(reads.pages.get(source, {}))
            else:
                writes.pages[destination] = dict.fromkeys(range(writes.page_size), (POISON,))
            self.answers[transfer_id] = how == DONE
        return [self.answers.get(transfer_id) for transfer_id in transfer_ids]

    def copy_pages(self, pairs: Sequence[tuple[int, int]]) -> None:
        for source, destination in pairs:
            self.memory.copy_page(int(source), int(destination))
            self.copies += 1

    def execute_prefill(self, items: Sequence[PrefillItem]) -> list[int]:
        if self.prefill_fails:
            raise RuntimeError("injected prefill fault")
        self.tokens += sum(len(item.tokens) for item in items)
        tables = [[INVALID_BLOCK if page is None else page for page in item.table] for item in items]
        # One batched call: every chunk attends to the KV as it was when the call began, so a
        # chunk cannot read KV another chunk of the same call is still writing.
        reads = [self._before(table, item.start) for item, table in zip(items, tables, strict=True)]
        tokens = []
        for item, table, read in zip(items, tables, reads, strict=True):
            history: History = ()  # a chunk of no tokens computes no logits: it samples garbage
            before = read
            for offset, token in enumerate(item.tokens):
                history = before = self._compute(item.request_id, table, token, item.start + offset, before)
            tokens.append(history_token(history))
        return tokens

    def answer(self, rows: tuple[tuple[int, ...], ...], tables: Any) -> list[int]:
        self.tokens += len(rows)
        tokens = []
        for request_id, _, token, position, offset, width, _ in rows:
            table = [int(page) for page in tables[offset : offset + width]]
            before = self._before(table, position)
            tokens.append(history_token(self._compute(request_id, table, token, position, before)))
        return tokens

    def _before(self, table: list[int], position: int) -> History | None:
        """What the KV at `position - 1` encodes (None: never written or unmapped)."""
        return () if position == 0 else self._read(table, position - 1)

    def _compute(self, request_id: int, table: list[int], token: int, position: int, before: History | None) -> History:
        """Write the KV of `token` at `position` through `table`, after the KV history `before`
        (what position - 1 held when read); the history it encodes."""
        page_size = self.memory.page_size
        history = (before if before is not None else (None,) * position) + (token,)
        logical = position // page_size
        page = table[logical] if logical < len(table) else INVALID_BLOCK
        if page == INVALID_BLOCK:
            raise BackendRejected(f"request {request_id}: position {position} has no page")
        self.memory.write(page, position, history)
        return history

    def _read(self, table: list[int], position: int) -> History | None:
        page_size = self.memory.page_size
        logical = position // page_size
        page = table[logical] if logical < len(table) else INVALID_BLOCK
        if page == INVALID_BLOCK:
            return None
        return self.memory.pages.get(page, {}).get(position % page_size)
