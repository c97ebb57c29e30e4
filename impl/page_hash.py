"""Page keys in one pass over a prompt's bytes, and the xxh3-128 page hash.

`keys_of` computes exactly `kvsched.spec.page_keys.page_keys` (the same chain, the same bytes),
slicing the sequence's little-endian u32 bytes once per page instead of packing each page. It
remembers the last sequence it keyed for each salt: a sequence whose first pages are
byte-for-byte that one's (a shared system prompt) reuses their keys, found by comparing bytes,
never by trusting a hash, and hashes only the pages after them. Importing this module
registers `"xxh3_128"` (128-bit xxh3, python-xxhash) as a page hash.
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
        self._last: dict[CacheSalt, tuple[bytes, list[Key]]] = {}  # the last sequence keyed, per salt
        self._shared: dict[CacheSalt, int] = {}  # the pages that sequence shared with the one before

    def root(self, salt: CacheSalt) -> Key:
        """The key a salt's first page chains from."""
        key = self._roots.get(salt)
        if key is None:
            key = self._roots[salt] = root_key(salt, self.digest)
        return key

    def keys_of(self, data: bytes, pages: int, salt: CacheSalt) -> list[Key]:
        """The keys of the first `pages` full pages of the tokens packed in `data`."""
        step = self.page_size * 4
        keys = self._shared_keys(data, pages, salt)
        self._shared[salt] = len(keys)
        self.extend(keys, data, pages, salt)
        self._last[salt] = (data[: pages * step], keys)
        return list(keys)

    def _shared_keys(self, data: bytes, pages: int, salt: CacheSalt) -> list[Key]:
        """The keys of the longest run of first pages `data` shares, byte for byte, with the
        last sequence keyed under `salt`: the run the sequence before shared, when it still
        holds exactly, else a binary search over whole-prefix comparisons."""
        last = self._last.get(salt)
        if last is None:
            return []
        previous, keys = last
        step = self.page_size * 4
        low, high = 0, min(pages, len(keys))
        hint = min(self._shared.get(salt, 0), high)
        if data[: hint * step] == previous[: hint * step]:
            if hint == high or data[hint * step : (hint + 1) * step] != previous[hint * step : (hint + 1) * step]:
                return keys[:hint]  # the common case: a shared system prompt as long as before
            low = hint + 1
        else:
            high = hint - 1
        while low < high:  # invariant: the first `low` pages are shared, and `high` bounds the run
            middle = (low + high + 1) // 2
            if data[: middle * step] == previous[: middle * step]:
                low = middle
            else:
                high = middle - 1
        return keys[:low]

    def extend(
        self, keys: list[Key], data: bytes | memoryview, pages: int, salt: CacheSalt | None, offset: int = 0
    ) -> None:
        """Append to `keys` (the first pages' keys) until it holds `pages` keys. `data[offset:]`
        is the sequence's little-endian u32 bytes (a byte view of token rows does: nothing is
        copied); `salt` roots the first key, so it may be None when `keys` is not empty."""
        digest, step = self.digest, self.page_size * 4
        if keys:
            parent = keys[-1]
        else:
            assert salt is not None, "the first key needs the salt"
            parent = self.root(salt)
        for start in range(offset + len(keys) * step, offset + pages * step, step):
            parent = digest(parent + data[start : start + step])
            keys.append(parent)

    def next_keys(self, parents: list[Key], data: bytes | memoryview, starts: list[int]) -> list[Key]:
        """The key of each page whose bytes begin at `data[starts[i]]` and whose parent page's
        key is `parents[i]` (many sequences' next pages, one hash call each)."""
        digest, step = self.digest, self.page_size * 4
        return [digest(parent + data[start : start + step]) for parent, start in zip(parents, starts, strict=True)]
