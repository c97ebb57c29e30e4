"""The machine the mutant corpus runs: `KvschedMachine` plus the engine habits it lacks.

Each delta is a proposed change to `kvsched.testing.machine` (see the mutation report):

- `decode_round` decodes only when every decoding request's next page was made writable. An
  engine whose `ensure_writable` is refused preempts instead; decoding anyway lets the backend
  write a page another request reads, which the ghost check rightly flags, on the correct impl
  and the spec alike (a false alarm of the harness, not a bug of the system).
- `admit_decoding`: a request that starts decoding at once (a prefix hit, or a request whose
  prefill the engine just finished), so rounds often batch several requests and a fault in a
  later output meets earlier ones that must stay uncommitted.
- `batch_round`: a faulty round whenever several requests decode, since a round commits all
  of its batch or none of it.
- `back_to_back_rounds`: a clean round and then a faulty one over the same requests, so the
  second finds the first one's records in the scratch an engine reuses.
- `publish_idle`: the producer writes one or two prefixes into fresh pages, publishes them and
  hands the pages over (drops its own references), so the store often holds several idle entries and
  reclaim has to choose among them by recency; `reclaim_one_page` asks for exactly one more
  free page, as an engine under pressure does, so reclaim stops after the first eviction.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from kvsched.spec import PrefixPageSet, RequestState
from kvsched.testing.backends import FAULTS
from kvsched.testing.machine import IDENTITY_COUNT, KvschedMachine, prefix_history, prefix_identity

# The backend faults whose answer reaches the outputs' identity check (the others fail earlier).
ANSWER_FAULTS = ("none", "no_write", "wrong_slot", "corrupt_identity")


class CorpusMachine(KvschedMachine):
    """`KvschedMachine` with the deltas above."""

    @rule(fault=st.sampled_from(FAULTS), short=st.sampled_from(["none", "none", "items", "tables", "outputs"]))
    def decode_round(self, fault: str, short: str) -> None:
        """The engine's round, run only when every decoding request's next page is writable."""
        for slot in self.sut.snapshot()[2].slots:
            logical = slot.token_count // self.config.page_size
            decoding = slot.state is RequestState.DECODE and logical < self.config.logical_pages
            if decoding and self._ensure_writable(slot.request_id, logical) is not None:
                return  # the engine preempts rather than decode into a page it may share
        super().decode_round(fault, short)

    @precondition(lambda self: self.has_live_request())
    @rule(fault=st.sampled_from(ANSWER_FAULTS))
    def back_to_back_rounds(self, fault: str) -> None:
        """Two rounds in a row, the second with a drawn fault (an engine's steady state: the
        second round finds the first one's records in the reused scratch)."""
        self.decode_round("none", "none")
        self.decode_round(fault, "none")

    def decoding_count(self) -> int:
        """How many requests are in DECODE."""
        return sum(1 for slot in self.sut.snapshot()[2].slots if slot.state is RequestState.DECODE)

    @precondition(lambda self: self.decoding_count() >= 2)
    @rule(fault=st.sampled_from(ANSWER_FAULTS))
    def batch_round(self, fault: str) -> None:
        """A round over several requests whose answer reaches the identity check: a bad later
        output must leave the earlier, matching ones uncommitted too."""
        self.decode_round(fault, "none")

    @rule(request_id=st.integers(10, 13), prefix=st.integers(-1, IDENTITY_COUNT - 1), token=st.integers(0, 49))
    def admit_decoding(self, request_id: int, prefix: int, token: int) -> None:
        """Admit a request and start decoding it at once."""
        self.admit(request_id=request_id, prefix=prefix)
        if self._slot(request_id) is not None:
            self.start_decoding(pick=self._live_pick(request_id), token=token)

    @rule()
    def reclaim_one_page(self) -> None:
        """Free exactly one more page: an engine under pressure asks the store for what it needs."""
        target = len(self.sut.snapshot()[0].free) + 1
        self._step(f"store.reclaim({target})", lambda s, _: s.store.reclaim(s.pool, target))

    @precondition(lambda self: len(self.external) < 3)
    @rule(prefix=st.integers(0, IDENTITY_COUNT - 1), sets=st.integers(1, 2), pages=st.integers(1, 2))
    def publish_idle(self, prefix: int, sets: int, pages: int) -> None:
        """Publish `sets` prefixes (numbers `prefix`, `prefix + 1`, ...), each written into fresh
        pages the producer then hands over to the store."""
        for number in range(prefix, prefix + sets):
            self._publish_fresh(number % IDENTITY_COUNT, pages)

    def _publish_fresh(self, prefix: int, pages: int) -> None:
        fresh = []
        for _ in range(pages):
            page, error = self._step("pool.allocate()", lambda s, _: s.pool.allocate())
            if error is not None:
                break
            fresh.append(page)
        token_count = len(fresh) * self.config.page_size - 1
        if fresh:
            history = prefix_history(prefix, token_count)
            for position in range(token_count):
                self.ghost.write(fresh[position // self.config.page_size], position, history[: position + 1])
            page_set = PrefixPageSet(prefix_identity(prefix), tuple(fresh), token_count)
            self._step(f"store.publish({page_set!r})", lambda s, _: s.store.publish(page_set, s.pool))
        for page in fresh:
            self._step(f"pool.release({page})", partial(_release, page))


def _release(page: int, system: Any, _: str) -> None:
    system.pool.release(page)
