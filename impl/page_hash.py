"""Page keys in one pass over a prompt's bytes, and the xxh3-128 page hash.

`keys_of` computes exactly `kvsched.spec.page_keys.page_keys` (the same chain, the same bytes),
slicing the sequence's little-endian u32 bytes once per page instead of packing each page.
Importing this module registers `"xxh3_128"` (128-bit xxh3, python-xxhash) as a page hash.
"""

from __future__ import annotations

import xxhash

from kvsched.spec.page_keys import CacheSalt, Digest, Key, register_page_hash, root_key

xxh3_128: Digest = xxhash.xxh3_128_digest  # 128-bit xxh3 of the bytes (16 bytes); called directly

register_page_hash("xxh3_128", xxh3_128)


class PageHasher:
    """Page keys for one engine: its page size and hash, each salt's root key remembered."""

    def __init__(self, page_size: int, digest: Digest) -> None:
        self.page_size = page_size
        self.digest = digest
        self._roots: dict[CacheSalt, Key] = {}

    def root(self, salt: CacheSalt) -> Key:
        """The key a salt's first page chains from."""
        key = self._roots.get(salt)
        if key is None:
            key = self._roots[salt] = root_key(salt, self.digest)
        return key

    def keys_of(self, data: bytes, pages: int, salt: CacheSalt) -> list[Key]:
        """The keys of the first `pages` full pages of the tokens packed in `data`."""
        digest, step = self.digest, self.page_size * 4
        keys, parent = [], self.root(salt)
        for start in range(0, pages * step, step):
            parent = digest(parent + data[start : start + step])
            keys.append(parent)
        return keys

    def extend(self, keys: list[Key], data: bytes, pages: int, salt: CacheSalt) -> None:
        """Append to `keys` (the first pages' keys) until it holds `pages` keys."""
        digest, step = self.digest, self.page_size * 4
        parent = keys[-1] if keys else self.root(salt)
        for start in range(len(keys) * step, pages * step, step):
            parent = digest(parent + data[start : start + step])
            keys.append(parent)
