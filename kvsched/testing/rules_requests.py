"""The machine's request rules: each builds one scheduler event from its draws and runs it.

Ids come mostly from the live requests (`MachineBase.request`) and sometimes are unknown or
invalid; every integer argument is passed in one of the forms the integer rule admits (`FORMS`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from kvsched.spec import events as ev
from kvsched.testing.harness import IDENTITY_COUNT, UNKNOWN_IDENTITY, MachineBase, prefix_identity

NEW_IDS = st.sampled_from([-1, 0, 0, 1, 1, 2, 2, 3, 4, 2**64])
# How an integer argument is passed: the id rule (`kvsched.spec.domain`) admits any of them.
FORMS = st.sampled_from(["int", "int", "int", "subclass", "numpy", "numpy unsigned"])
PICKS = st.integers(0, 9)  # mostly a live request (see `MachineBase.request`), sometimes a bad id


class RequestNumber(int):
    """An int subclass, as an `IntEnum` member is: an id the integer rule admits."""

    def __repr__(self) -> str:
        return f"RequestNumber({int(self)})"


def integer_as(value: int, form: str) -> Any:
    """`value` passed in `form`: a plain int, an int subclass, or a numpy integer (as read back
    from an implementation's arrays) where that numpy type can hold it."""
    if form == "subclass":
        return RequestNumber(value)
    if form == "numpy" and -(2**63) <= value < 2**63:
        return np.int64(value)
    if form == "numpy unsigned" and 0 <= value < 2**64:
        return np.uint64(value)
    return value


def identity_of(prefix: int) -> Any:
    """The harness's prefix `prefix`: -1 none, `IDENTITY_COUNT` one never published."""
    if prefix < 0:
        return None
    return UNKNOWN_IDENTITY if prefix == IDENTITY_COUNT else prefix_identity(prefix)


class RequestRules(MachineBase):
    """Admission, forks, writes, accounting and finishing."""

    @rule(request_id=NEW_IDS, prefix=st.integers(-1, IDENTITY_COUNT), form=FORMS)
    def admit(self, request_id: int, prefix: int, form: str = "int") -> None:
        self.run(ev.Admit(integer_as(request_id, form), identity_of(prefix)))

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS, child=NEW_IDS, form=FORMS)
    def fork(self, pick: int, child: int, form: str) -> None:
        self.run(ev.Fork(integer_as(self.request(pick), form), integer_as(child, form)))

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS, logical_page=st.integers(-1, 3), form=FORMS)
    def ensure_writable(self, pick: int, logical_page: int, form: str) -> None:
        self.run(ev.EnsureWritable(integer_as(self.request(pick), form), integer_as(logical_page, form)))

    @precondition(lambda self: self.has_live_request())
    @rule(picks=st.lists(PICKS, max_size=3), logical_pages=st.lists(st.integers(-1, 3), max_size=3), form=FORMS)
    def ensure_writable_batch(self, picks: list[int], logical_pages: list[int], form: str) -> None:
        ids = tuple(integer_as(self.request(pick), form) for pick in picks)
        self.run(ev.EnsureWritableBatch(ids, tuple(integer_as(page, form) for page in logical_pages)))

    @precondition(lambda self: self.has_live_request())
    @rule(page_size=st.sampled_from([0, 2, 2, 2, 1]))
    def prepare_decode_round(self, page_size: int) -> None:
        """The engine's batched form of making room for every decoding request's next token."""
        self.run(ev.PrepareDecodeRound(page_size and self.config.page_size))

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS)
    def record_token(self, pick: int) -> None:
        """A token counted without a write the harness knows of (its slot is never checked)."""
        self.run(ev.RecordToken(self.request(pick)))

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS, tokens=st.sampled_from([0, 1, 2, 3, 2**32 - 1, 2**32, -1]), form=FORMS)
    def record_tokens(self, pick: int, tokens: int, form: str) -> None:
        """A prefill chunk counted in one call (its writes unknown to the harness, as above)."""
        self.run(ev.RecordTokens(self.request(pick), integer_as(tokens, form)))

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS, tokens=st.sampled_from([0, 1, 2, 3, 5, 2**32 - 1, 2**32, -1]), form=FORMS)
    def record_chunk(self, pick: int, tokens: int, form: str) -> None:
        """A prefill chunk made room for and counted in one call (its writes unknown, as above)."""
        self.run(ev.RecordChunk(self.request(pick), integer_as(tokens, form)))

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS)
    def mark_prefill_complete(self, pick: int) -> None:
        self.run(ev.MarkPrefillComplete(self.request(pick)))

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS, token=st.sampled_from([-1, 0, 3, 3, 7, 7, 2**32 - 1, 2**32]))
    def seed_decode_token(self, pick: int, token: int) -> None:
        self.run(ev.SeedDecodeToken(self.request(pick), token))

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS, form=FORMS)
    def finish(self, pick: int, form: str = "int") -> None:
        self.run(ev.Finish(integer_as(self.request(pick), form)))

    @precondition(lambda self: self.has_live_request())
    @rule(pick=PICKS, call=st.sampled_from(["finish", "ensure_writable"]))
    def use_another_pool(self, pick: int, call: str) -> None:
        """Hand the scheduler a pool it is not bound to: it must refuse and change nothing."""
        self.run(ev.ForeignPool(self.request(pick), call))

    @rule(prefix=st.integers(0, IDENTITY_COUNT), page=st.integers(-1, 7), pick=PICKS, views=st.integers(0, 4))
    def query(self, prefix: int, page: int, pick: int, views: int) -> None:
        """Every read-only operation at once; they must agree and change nothing."""
        request_id = self.request(pick) if self.has_live_request() and pick <= 6 else None
        self.run(ev.Read(identity_of(prefix), page, request_id, views))
