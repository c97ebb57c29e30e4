"""The machine's engine rules: what a serving loop does with the scheduler, as event sequences.

An engine prefills (make the position's page writable, write its KV, count the token), seeds the
first sampled token, and runs decode rounds, each after making every decoding request's next
page writable. Rounds also run with every backend fault, short buffers, without making room
and on buffers that share memory; several requests often decode at once, so a fault in a later
output meets earlier ones that must stay uncommitted.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from kvsched.spec import events as ev
from kvsched.spec.slots import RequestState
from kvsched.testing.checks import CheckFailure, FailureKind
from kvsched.testing.harness import IDENTITY_COUNT, MachineBase
from kvsched.testing.rules_requests import PICKS, identity_of

SHORTS = st.sampled_from(["", "", "items", "tables", "outputs"])
# The backend faults whose answer reaches the outputs' identity check (the others fail earlier).
ANSWER_FAULTS = st.sampled_from([ev.Fault.NONE, ev.Fault.NO_WRITE, ev.Fault.WRONG_SLOT, ev.Fault.CORRUPT_IDENTITY])


class EngineRules(MachineBase):
    """Prefill writes, the start of decoding, and decode rounds."""

    def decoding_count(self) -> int:
        """How many requests are in DECODE."""
        return sum(1 for slot in self.sut.snapshot()[2].slots if slot.state is RequestState.DECODE)

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS, token=st.integers(0, 49))
    def write_token(self, pick: int, token: int) -> None:
        """The engine's prefill write: make the next position's page writable, write, count."""
        request_id = self.request(pick)
        slot = self.slot_of(request_id)
        if slot is None:
            self.run(ev.RecordToken(request_id))
            return
        position = slot.token_count
        logical = position // self.config.page_size
        if self.run(ev.EnsureWritable(request_id, logical)).error is not None:
            return
        written = self.slot_of(request_id)
        assert written is not None
        page = written.table[logical]
        assert page is not None
        history = self.ghost.histories.get(request_id, ())[:position] + (token,)
        self.ghost.write(page, position, history)
        if self.run(ev.RecordToken(request_id)).error is not None:
            self.fail(CheckFailure(FailureKind.LOCKSTEP, f"record_token failed on live request {request_id}"))
        self.ghost.histories[request_id] = history

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS, token=st.integers(0, 49))
    def start_decoding(self, pick: int, token: int) -> None:
        """The engine after a prefill: seed the first sampled token, then move to decode."""
        request_id = self.request(pick)
        self.run(ev.SeedDecodeToken(request_id, token))
        slot = self.slot_of(request_id)
        if slot is not None and slot.state is RequestState.PREFILL:
            self.run(ev.MarkPrefillComplete(request_id))

    @rule(request_id=st.integers(10, 13), prefix=st.integers(-1, IDENTITY_COUNT - 1), token=st.integers(0, 49))
    def admit_decoding(self, request_id: int, prefix: int, token: int) -> None:
        """Admit a request and start decoding it at once (a prefix hit, or a finished prefill)."""
        if self.run(ev.Admit(request_id, identity_of(prefix))).error is None:
            self.start_decoding(pick=self.live_ids().index(request_id), token=token)

    @precondition(lambda self: self.has_live_request())
    @rule(token=st.integers(0, 49))
    def engine_round(self, token: int) -> None:
        """The engine's common step: every request whose prefill is done (it wrote a token)
        gets its first sampled token and moves to decode, then one well-behaved round runs."""
        for slot in self.sut.snapshot()[2].slots:
            prefilled = slot.state is RequestState.PREFILL and slot.token_count > 0
            unseeded = slot.state is RequestState.DECODE and not slot.token_ready
            if prefilled or unseeded:
                self.start_decoding(pick=self.live_ids().index(slot.request_id), token=token)
        self.decode_round(ev.Fault.NONE, "")

    @rule(fault=st.sampled_from(ev.Fault), short=SHORTS)
    def decode_round(self, fault: ev.Fault, short: str) -> None:
        """The engine's round: make every decoding request's next page writable, then decode.

        An engine that cannot make room for every request (the pool is exhausted) does not
        decode: it would write a page another request still reads (it preempts a request first).
        """
        for slot in self.sut.snapshot()[2].slots:
            logical = slot.token_count // self.config.page_size
            growing = slot.state is RequestState.DECODE and logical < self.config.logical_pages
            if growing and self.run(ev.EnsureWritable(slot.request_id, logical)).error is not None:
                return
        self.run(ev.DecodeRound(fault, short))

    @precondition(lambda self: self.has_live_request())
    @rule(fault=ANSWER_FAULTS)
    def back_to_back_rounds(self, fault: ev.Fault) -> None:
        """Two rounds in a row, the second with a drawn fault (an engine's steady state: the
        second round finds the first one's records in the reused scratch)."""
        self.decode_round(ev.Fault.NONE, "")
        self.decode_round(fault, "")

    @precondition(lambda self: self.decoding_count() >= 2)
    @rule(fault=ANSWER_FAULTS)
    def batch_round(self, fault: ev.Fault) -> None:
        """A round over several requests whose answer reaches the identity check: a bad later
        output must leave the earlier, matching ones uncommitted too."""
        self.decode_round(fault, "")

    @precondition(lambda self: self.has_live_request())
    @rule(fault=st.sampled_from([ev.Fault.NONE, ev.Fault.NONE, ev.Fault.CORRUPT_IDENTITY]))
    def decode_without_making_room(self, fault: ev.Fault) -> None:
        """A round the caller did not prepare: it must refuse, or write only pages its requests
        hold alone (the page holding each one's position `token_count`; `check_step` checks)."""
        self.run(ev.DecodeRound(fault))

    @precondition(lambda self: self.has_live_request() and hasattr(self.sut, "overlapping_scratch"))
    @rule()
    def decode_with_overlapping_scratch(self) -> None:
        """Round buffers that share memory (one allocation carved into two): the round must refuse
        them and change nothing, or the backend reads tables the outputs overwrote."""
        self.run(ev.DecodeOverlapping())
