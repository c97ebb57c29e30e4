"""Page keys for the automatic prefix cache: each full page named by its whole chain of content.

A request's page `i` (token positions `i * page_size .. (i + 1) * page_size - 1`) is named by

    key(0) = H(root(salt) || tokens of page 0)
    key(i) = H(key(i - 1) || tokens of page i)
    root(salt) = H("kvsched page key" || tenant || adapter || model)

with each token a little-endian u32. A key therefore names every token before the page's end
and the `CacheSalt`: two pages with the same key hold the same tokens at the same positions,
computed for the same tenant, LoRA adapter and model, as long as `H` is injective, which the
proofs assume and a collision-resistant hash makes true in practice. `H` is a named
`PageHash`: SHA-256 (the default, standard library) or any registered one (kvsched.impl
registers 128-bit xxh3). Python's `hash()` is never used: it is salted per process and 64 bits.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvsched.spec.domain import require_u32
from kvsched.spec.errors import InvalidConfig

Key = bytes
Digest = Callable[[bytes], bytes]

ROOT_TAG = b"kvsched page key\x00"


def sha256(data: bytes) -> bytes:
    """SHA-256 of `data` (32 bytes)."""
    return hashlib.sha256(data).digest()


PAGE_HASHES: dict[str, Digest] = {"sha256": sha256}


def register_page_hash(name: str, digest: Digest) -> None:
    """Make `digest` available as `EngineConfig(page_hash=name)`."""
    PAGE_HASHES[name] = digest


def page_hash(name: str) -> Digest:
    """The registered hash `name`, else `InvalidConfig`."""
    digest = PAGE_HASHES.get(name)
    if digest is None:
        known = ", ".join(sorted(PAGE_HASHES))
        raise InvalidConfig(f"unknown page hash {name!r} (registered: {known}; 'xxh3_128' comes with kvsched.impl)")
    return digest


@dataclass(frozen=True, slots=True)
class CacheSalt:
    """What besides the tokens a page's KV depends on, or must never be shared across."""

    tenant: int = 0
    adapter: int = 0  # the LoRA adapter id (0: none)
    model: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tenant", require_u32("tenant", self.tenant))
        object.__setattr__(self, "adapter", require_u32("adapter", self.adapter))


def root_key(salt: CacheSalt, digest: Digest) -> Key:
    """The key the first page chains from."""
    return digest(ROOT_TAG + struct.pack("<II", salt.tenant, salt.adapter) + salt.model.encode())


def pack_tokens(tokens: Sequence[int]) -> bytes:
    """Token ids as little-endian u32s (what a key hashes)."""
    return struct.pack(f"<{len(tokens)}I", *tokens)


def chain_key(parent: Key, tokens: Sequence[int], digest: Digest) -> Key:
    """The key of a page holding `tokens` after the page keyed `parent`."""
    return digest(parent + pack_tokens(tokens))


def page_keys(
    tokens: Sequence[int], page_size: int, salt: CacheSalt, digest: Digest, pages: int | None = None
) -> tuple[Key, ...]:
    """The keys of the first `pages` full pages of `tokens` (all of them when None)."""
    full = len(tokens) // page_size if pages is None else pages
    keys, parent = [], root_key(salt, digest)
    for page in range(full):
        parent = chain_key(parent, tokens[page * page_size : (page + 1) * page_size], digest)
        keys.append(parent)
    return tuple(keys)
