"""The engine's values: its configuration, a request, one step's output, and the intake rules.

`EngineConfig` sizes everything at construction and is validated there (`InvalidConfig` names
the first bad field). `EngineRequest` is one generation request, validated when built
(`InvalidArgument`). `fits` is the intake's rule: a request that can never run is refused at
`submit` (`RequestTooLarge`) and so never blocks the queue. `finish_reason` is when a request
stops: EOS is checked before the length limit, as seed B's sequence does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvsched.spec import refusals
from kvsched.spec.batch import U32_MAX
from kvsched.spec.domain import as_int, require_u32, require_u64
from kvsched.spec.errors import InvalidArgument, InvalidConfig
from kvsched.spec.host_tier import HostStats
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.page_keys import CacheSalt
from kvsched.spec.prefix_cache import CacheStats
from kvsched.spec.sequence import FinishReason
from kvsched.spec.tokens import read_tokens

PRIORITY_LIMIT = 2**31  # priorities are i32: -2**31 .. 2**31 - 1


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """An engine's sizes and limits.

    requests              scheduler slots (concurrent requests it can hold at all)
    pages, page_size      the KV pool: physical pages and token positions per page
    logical_pages         one request table's capacity in pages
    max_batch_size        running requests at most (<= requests)
    max_batched_tokens    tokens one step runs: decode tokens + prefill chunks (>= max_batch_size,
                          so every decoding request always fits)
    chunk_size            the longest prefill chunk of one request in one step
    prefill_reserve_pages no admission while fewer pages are free, unless nothing runs
    admission             what must be free to admit a request while others run: "whole_prompt"
                          (the pages for the rest of its whole sequence, beyond those every running
                          prefill still needs past this step's chunks: an admitted prompt is not
                          preempted by another prompt's prefill) or "first_chunk" (its first chunk's pages)
    max_queue             requests the intake queue holds (preempted requests always re-enter)
    max_seq_len           prompt + max_new_tokens at most
    state_slots           recurrent-state slots, one per running request (0 = none)
    prefix_entries        prefix store entries for published prefixes (0 = none)
    prefix_caching        the automatic prefix cache (`kvsched.spec.prefix_cache`): every full
                          page a step computes is cached under its key, and admission reuses the
                          longest cached run of a sequence's pages
    page_hash             the hash page keys chain ("sha256"; "xxh3_128" with kvsched.impl)
    model_id              the model's name, part of every page key
    host_pages            the host tier's pages (`kvsched.spec.host_tier`; 0 = none): with the
                          automatic prefix cache, a cached page the cache would evict is copied to
                          the host first, and an admission's lookup continues into the host tier
    """

    requests: int = 32
    pages: int = 1024
    page_size: int = 16
    logical_pages: int = 256
    max_batch_size: int = 32
    max_batched_tokens: int = 2048
    chunk_size: int = 512
    prefill_reserve_pages: int = 8
    max_queue: int = 1024
    max_seq_len: int = 4096
    state_slots: int = 0
    prefix_entries: int = 0
    prefix_caching: bool = False
    admission: str = "whole_prompt"
    page_hash: str = "sha256"
    model_id: str = ""
    host_pages: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.prefix_caching, bool):
            raise InvalidConfig(f"prefix_caching must be a bool, not {self.prefix_caching!r}")
        for name in ("admission", "page_hash", "model_id"):
            if not isinstance(getattr(self, name), str):
                raise InvalidConfig(f"{name} must be a str, not {getattr(self, name)!r}")
        if self.admission not in ADMISSIONS:
            raise InvalidConfig(f"admission must be one of {', '.join(ADMISSIONS)}, not {self.admission!r}")
        for name, low in _LOWER_BOUNDS.items():
            value = as_int(getattr(self, name))
            if value is None or not low <= value <= U32_MAX:
                raise InvalidConfig(f"{name} must be an integer in {low}..2**32-1, not {getattr(self, name)!r}")
            object.__setattr__(self, name, value)
        if self.host_pages and not self.prefix_caching:
            raise InvalidConfig("host_pages needs prefix_caching: the host tier keeps pages the prefix cache evicts")
        if self.requests > 2**16:
            raise InvalidConfig(f"requests must be at most 2**16, not {self.requests}")
        if self.max_batch_size > self.requests:
            raise InvalidConfig(f"max_batch_size {self.max_batch_size} exceeds requests {self.requests}")
        if self.max_batched_tokens < self.max_batch_size:
            raise InvalidConfig(
                f"max_batched_tokens {self.max_batched_tokens} is below max_batch_size {self.max_batch_size}: "
                "a full batch of decoding requests would not fit one step"
            )

    @property
    def table_tokens(self) -> int:
        """The most token positions one request table maps."""
        return self.logical_pages * self.page_size


ADMISSIONS = ("whole_prompt", "first_chunk")

_LOWER_BOUNDS = {
    "requests": 1,
    "pages": 1,
    "page_size": 1,
    "logical_pages": 1,
    "max_batch_size": 1,
    "max_batched_tokens": 1,
    "chunk_size": 1,
    "prefill_reserve_pages": 0,
    "max_queue": 1,
    "max_seq_len": 1,
    "state_slots": 0,
    "prefix_entries": 0,
    "host_pages": 0,
}


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One generation request: generate at most `max_new_tokens` after `prompt`, stopping early at
    `eos_token_id`. Higher `priority` runs first; FIFO inside a priority. `prefix` names a
    published prefix whose KV the prompt starts with (attached at admission when published).
    `tenant` and `adapter` (its LoRA adapter id) salt its page keys: the automatic cache never
    shares a page across tenants or adapters."""

    request_id: int
    prompt: tuple[int, ...]  # given as any form `kvsched.spec.tokens.read_tokens` reads; kept as a tuple
    max_new_tokens: int
    eos_token_id: int | None = None
    priority: int = 0
    tenant: int = 0
    prefix: PrefixIdentity | None = None
    adapter: int = 0
    prompt_bytes: bytes = field(init=False, repr=False, compare=False)  # the prompt as little-endian u32s

    def __post_init__(self) -> None:
        object.__setattr__(self, "request_id", require_u64("request_id", self.request_id))
        prompt, prompt_bytes = read_tokens(self.prompt)
        object.__setattr__(self, "prompt", prompt)
        object.__setattr__(self, "prompt_bytes", prompt_bytes)
        tokens = as_int(self.max_new_tokens)
        if tokens is None or not 1 <= tokens <= U32_MAX:
            raise InvalidArgument(f"max_new_tokens must be an integer in 1..2**32-1, not {self.max_new_tokens!r}")
        object.__setattr__(self, "max_new_tokens", tokens)
        if self.eos_token_id is not None:
            object.__setattr__(self, "eos_token_id", require_u32("eos_token_id", self.eos_token_id))
        priority = as_int(self.priority)
        if priority is None or not -PRIORITY_LIMIT <= priority < PRIORITY_LIMIT:
            raise InvalidArgument(f"priority must be an i32, not {self.priority!r}")
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "tenant", require_u32("tenant", self.tenant))
        object.__setattr__(self, "adapter", require_u32("adapter", self.adapter))
        if self.prefix is not None and not isinstance(self.prefix, PrefixIdentity):
            raise refusals.wrong_kind("prefix", "PrefixIdentity or None", self.prefix)


@dataclass(frozen=True, slots=True)
class StepOutput:
    """What one step did: each request's new tokens (in order), the requests that finished and
    why (cancellations since the last step included), those preempted (in preemption order), the
    tokens the model ran (decode tokens + prefill chunk tokens), the pages held afterwards and
    the prefix cache's counts for this step."""

    tokens: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    finished: Mapping[int, FinishReason] = field(default_factory=dict)
    preempted: tuple[int, ...] = ()
    tokens_run: int = 0
    pages_in_use: int = 0
    cache: CacheStats = field(default_factory=CacheStats)
    host: HostStats = field(default_factory=HostStats)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepOutput):
            return NotImplemented
        return (
            dict(self.tokens) == dict(other.tokens)
            and dict(self.finished) == dict(other.finished)
            and tuple(self.preempted) == tuple(other.preempted)
            and (self.tokens_run, self.pages_in_use) == (other.tokens_run, other.pages_in_use)
            and self.cache == other.cache
            and self.host == other.host
        )

    __hash__ = None  # type: ignore[assignment]  # the mappings are not hashable


def pages_for(tokens: int, page_size: int) -> int:
    """How many pages hold `tokens` token positions."""
    return -(-tokens // page_size)


def fits(config: EngineConfig, request: EngineRequest) -> str | None:
    """Why `request` can never run in an engine of `config` (None when it can).

    It must hold its whole sequence, prompt + max_new_tokens, in one table and in the pool at
    once; with a prefix, one page more (the copy of a shared page its first write lands in)."""
    total = len(request.prompt) + request.max_new_tokens
    if total > config.max_seq_len:
        return f"{total} tokens (prompt + max_new_tokens) exceed max_seq_len {config.max_seq_len}"
    if total > config.table_tokens:
        return f"{total} tokens exceed one table's {config.logical_pages} pages of {config.page_size}"
    pages = pages_for(total, config.page_size) + (request.prefix is not None)
    if pages > config.pages:
        return f"{pages} pages exceed the pool's {config.pages}"
    return None


def admission_pages(config: EngineConfig, length: int, cached: int, committed: int) -> int:
    """The free pages admitting a sequence of `length` tokens, the first `cached` already in
    pages it attaches, needs under `config.admission` while others run, besides its first chunk's:
    "whole_prompt", pages for the whole rest of its sequence (a shared page it writes into counts:
    it is copied) and the `committed` pages the running prefills still need; "first_chunk", none."""
    if config.admission != "whole_prompt":
        return 0
    return pages_for(length, config.page_size) - cached // config.page_size + committed


def salt_of(config: EngineConfig, request: EngineRequest) -> CacheSalt:
    """What salts the request's page keys: its tenant and adapter, and the model."""
    return CacheSalt(request.tenant, request.adapter, config.model_id)


def finish_reason(request: EngineRequest, generated: tuple[int, ...] | list[int]) -> FinishReason | None:
    """Why the request stops after generating `generated` (its last token just appended): EOS
    first, then the length limit; None while it goes on."""
    if request.eos_token_id is not None and generated[-1] == request.eos_token_id:
        return FinishReason.EOS
    if len(generated) >= request.max_new_tokens:
        return FinishReason.MAX_LENGTH
    return None
