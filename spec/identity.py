"""Prefix identities: a prefix's 256-bit name, derived from what determines its KV.

A prefix's KV is a function of the model instance, the tokenizer revision, the graph context and
revision, the facts it encodes and the tenant: `derive_prefix_identity` mixes them into four
64-bit words, so two prefixes share KV only when every input agrees. The tenant salt enters
every starting word and every later step is a bijection of one word, so two tenants never derive
the same identity from the same other inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvsched.spec.domain import require_u64
from kvsched.spec.errors import InvalidArgument

MASK64 = 2**64 - 1
Fact = tuple[int, int, int, int, int, int]  # subject, predicate, object, context, metadata, parity

_SEEDS = (0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89)


@dataclass(frozen=True, slots=True)
class PrefixIdentity:
    """A prefix's 256-bit identity: four 64-bit words."""

    words: tuple[int, int, int, int]

    def __post_init__(self) -> None:
        if not isinstance(self.words, tuple) or len(self.words) != 4:
            raise InvalidArgument("a prefix identity is a tuple of four 64-bit words")
        words = tuple(require_u64("identity word", word) for word in self.words)
        object.__setattr__(self, "words", words)  # plain ints, whatever integers were given


def compute_mix(value: int) -> int:
    """The splitmix64 finalizer: a bijection on 64-bit words."""
    value &= MASK64
    value ^= value >> 30
    value = (value * 0xBF58476D1CE4E5B9) & MASK64
    value ^= value >> 27
    value = (value * 0x94D049BB133111EB) & MASK64
    return value ^ (value >> 31)


def _sequence(name: str, values: object) -> tuple[object, ...]:
    """`values` as a tuple, if it is a finite iterable other than a string; else `InvalidArgument`."""
    if isinstance(values, (str, bytes)):
        raise InvalidArgument(f"{name} must be a sequence, not {type(values).__name__}")
    try:
        return tuple(values)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgument(f"{name} must be a sequence, not {type(values).__name__}") from None


def derive_prefix_identity(
    model_instance: int,
    tokenizer_revision: int,
    graph_context: int,
    graph_revision: int,
    facts: Sequence[Fact],
    *,
    tenant_salt: int = 0,
) -> PrefixIdentity:
    """Mix the model, tokenizer, context, revision, facts and tenant into an identity.

    With `tenant_salt == 0` this is the original derivation. The salt enters every starting
    word, and every later step is a bijection of one word, so for the same other inputs two
    different tenants always derive identities that differ in all four words.
    """
    salt = require_u64("tenant_salt", tenant_salt)
    inputs = (model_instance, tokenizer_revision, graph_context, graph_revision)
    words = [
        compute_mix(require_u64("identity input", value) ^ seed ^ salt)
        for value, seed in zip(inputs, _SEEDS, strict=True)
    ]
    for index, fact in enumerate(_sequence("facts", facts)):
        lanes = _sequence(f"fact {index}", fact)
        if len(lanes) != 6:
            raise InvalidArgument(f"fact {index} has {len(lanes)} lanes, not 6")
        for lane, value in enumerate(lanes):
            target = (index + lane) & 3
            words[target] = compute_mix(words[target] ^ require_u64("fact lane", value) ^ (index << 32) ^ lane)
    return PrefixIdentity((words[0], words[1], words[2], words[3]))
