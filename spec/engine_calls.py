"""The model calls one engine step makes, as values, and the one function that makes them.

A step is planned before the model runs (`kvsched.spec.engine_step.plan_step`): its calls are then a
value, `ModelCalls`, and `run_model` makes them in the model boundary's order
(`kvsched.spec.model`) and returns the checked answers, `ModelAnswers`:

    copy_pages(decode_copies)            only when a request decodes
    execute_ragged(items, tables, ...)   the decode round (one call), its outputs checked
    copy_pages(prefill_copies)
    execute_prefill(prefills)            one token per chunk, each a u32

With a host tier, `poll_copies` asks the model which copies in flight are done before the step
is planned, and `issue_copies` starts the step's new ones after it is committed, in one call
(`start_copies`): it raises only when none was started, so a step that fails is still undone
exactly, and a copy the backend runs is always one the engine's state holds.

Nothing here changes an engine: a failed call raises (`BackendFailed`, or the round's and the
prefill's identity errors) and the state the step was planned on is still the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

from kvsched.spec import refusals
from kvsched.spec.batch import U32_MAX, UNANSWERED, RaggedBatchItem, RaggedBatchOutput
from kvsched.spec.domain import as_int
from kvsched.spec.host_tier import DEMOTE, Copy
from kvsched.spec.model import CopyBackend, EngineModel, HostCopy, PrefillItem
from kvsched.spec.plan import WritePlan
from kvsched.spec.round import call_round

T = TypeVar("T")

Pairs = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Chunk:
    """A prefill chunk planned this step: `length` tokens of the request's sequence from `start`."""

    request_id: int
    start: int
    length: int
    copies: Pairs


@dataclass(frozen=True, slots=True)
class ModelCalls:
    """What a planned step asks of the model, in order: the decode round's copies, the round
    (its lowered items and their concatenated tables), the chunks' copies, their prefill."""

    decode_copies: Pairs = ()
    items: tuple[RaggedBatchItem, ...] = ()
    tables: tuple[int, ...] = ()
    prefill_copies: Pairs = ()
    prefills: tuple[PrefillItem, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelAnswers:
    """The model's checked answers: one output per round item, one token per prefill item."""

    outputs: tuple[RaggedBatchOutput, ...] = ()
    sampled: tuple[int, ...] = ()


NO_ANSWERS = ModelAnswers()


def chunk_pages(start: int, length: int, page_size: int) -> range:
    """The logical pages positions `start .. start + length - 1` land on."""
    return range(start // page_size, (start + length - 1) // page_size + 1)


def plan_copies(plan: WritePlan) -> Pairs:
    """The (source, destination) pages a plan's copies need."""
    return tuple((copy.source, copy.destination) for copy in plan.copies())


def call_model(call: Callable[[], T]) -> T:
    """A model call; whatever it raises becomes `BackendFailed`."""
    try:
        return call()
    except Exception as error:
        raise refusals.backend_raised(error) from error


def require_prefill_tokens(answer: object, count: int) -> list[int]:
    """The prefill backend's answer as `count` u32 tokens, else `OutputIdentityMismatch`. Any
    iterable of integers will do (a list, a tuple, a 1-D integer numpy array), by the integer
    rule of `kvsched.spec.domain`; a string, bytes or a mapping will not."""
    if isinstance(answer, str | bytes | Mapping) or not isinstance(answer, Iterable):
        raise refusals.prefill_not_tokens(answer)
    answered = list(answer)
    if len(answered) != count:
        raise refusals.prefill_answer(len(answered), count)
    tokens = [as_int(token) for token in answered]
    for chunk, (token, given) in enumerate(zip(tokens, answered, strict=True)):
        if token is None or not 0 <= token <= U32_MAX:
            raise refusals.prefill_bad_token(chunk, given)
    return [token for token in tokens if token is not None]


def run_model(calls: ModelCalls, model: EngineModel) -> ModelAnswers:
    """Make `calls` on `model`, in order, and check its answers."""
    outputs: list[RaggedBatchOutput] = []
    if calls.items:
        if calls.decode_copies:
            call_model(lambda: model.copy_pages(calls.decode_copies))
        outputs = [UNANSWERED] * len(calls.items)
        call_round(model, calls.items, calls.tables, outputs)
    if calls.prefill_copies:
        call_model(lambda: model.copy_pages(calls.prefill_copies))
    sampled: list[int] = []
    if calls.prefills:
        prefills = list(calls.prefills)
        answer = call_model(lambda: model.execute_prefill(prefills))
        sampled = require_prefill_tokens(answer, len(prefills))
    return ModelAnswers(tuple(outputs), tuple(sampled))


def copier(model: object, required: bool = False) -> CopyBackend:
    """`model` as a host tier's model; `required`: check that it has the two copy calls
    (else `InvalidConfig`). A model without them serves an engine with no host tier, which
    never calls them."""
    if required:
        for name in ("start_copies", "copies_done"):
            if not callable(getattr(model, name, None)):
                raise refusals.model_cannot_copy(name)
    return cast(CopyBackend, model)


def poll_copies(model: CopyBackend, copies: Sequence[Copy]) -> dict[int, bool]:
    """The copies in flight the model reports done: id -> completed (True) or failed (False).
    An answer that is not one True, False or None per copy is `OutputIdentityMismatch`."""
    if not copies:
        return {}
    ids = [copy.transfer_id for copy in copies]
    answer = call_model(lambda: model.copies_done(ids))
    if isinstance(answer, str | bytes | Mapping) or not isinstance(answer, Iterable):
        raise refusals.copies_not_answered(answer, len(ids))
    answered = list(answer)
    if len(answered) != len(ids) or any(done is not None and not isinstance(done, bool) for done in answered):
        raise refusals.copies_not_answered(answered, len(ids))
    return {tid: done for tid, done in zip(ids, answered, strict=True) if done is not None}


def copy_batches(copies: Sequence[Copy]) -> tuple[list[HostCopy], list[HostCopy]]:
    """`copies` as the backend names them: the promotions (host page to device page) and the
    demotions (device page to host page)."""
    to_device = [HostCopy(copy.transfer_id, copy.host_page, copy.page) for copy in copies if copy.kind != DEMOTE]
    to_host = [HostCopy(copy.transfer_id, copy.page, copy.host_page) for copy in copies if copy.kind == DEMOTE]
    return to_device, to_host


def issue_copies(model: CopyBackend, copies: Sequence[Copy]) -> None:
    """Start `copies` (a step's new ones) in one call: the promotions and the demotions."""
    if not copies:
        return
    to_device, to_host = copy_batches(copies)
    call_model(lambda: model.start_copies(to_device, to_host))
