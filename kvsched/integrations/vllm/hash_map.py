"""vLLM's prefix-cache hash map (`BlockHashToBlockMap`), read in place, as both releases' shapes.

0.32 and 0.33 map a key to its block, or to a dict of blocks by id when several blocks hold the
same content; 0.34 maps a key to one block id and keeps every id of such a key in `_dup_ids`.
`read_hash_map` gives either as the live checker's `HashMap` (`kvsched.integrations.vllm.live`);
the pool's own debug check counts its pairs the same way. Nothing here imports vLLM.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from operator import attrgetter
from typing import Any

from kvsched.integrations.vllm.live import HashMap


class IdMapView:
    """vLLM 0.34's hash map (key -> a block id, and every id of a key several blocks hold in
    `_dup_ids`), read in place."""

    def __init__(self, hash_map: Any) -> None:
        self.cache: dict[Any, int] = hash_map._cache
        self.dups: dict[Any, dict[int, None]] = hash_map._dup_ids

    def holds(self, key: bytes, block: int) -> bool:
        dups = self.dups.get(key)
        return block in dups if dups is not None else self.cache.get(key) == block

    def pairs(self) -> int:
        return len(self.cache) + sum(len(ids) - 1 for ids in self.dups.values())

    def distinct(self) -> int:
        return len(self.cache)

    def names(self) -> dict[bytes, int] | None:
        return None if self.dups else dict(self.cache)

    def entries(self) -> Iterator[tuple[bytes, Collection[int]]]:
        dups = self.dups
        for key, block in self.cache.items():
            yield key, dups.get(key, (block,))


class MapView:
    """vLLM 0.32 and 0.33's hash map (key -> a block, or a dict of blocks by id), read in place."""

    def __init__(self, hash_map: Any) -> None:
        self.cache: dict[Any, Any] = hash_map._cache

    def holds(self, key: bytes, block: int) -> bool:
        blocks = self.cache.get(key)
        if blocks is None:
            return False
        return block in blocks if type(blocks) is dict else bool(blocks.block_id == block)

    def pairs(self) -> int:
        return len(self.cache) + sum(len(blocks) - 1 for blocks in self.cache.values() if type(blocks) is dict)

    def distinct(self) -> int:
        return len(self.cache)

    def names(self) -> dict[bytes, int] | None:
        try:
            return dict(zip(self.cache, map(attrgetter("block_id"), self.cache.values()), strict=True))
        except AttributeError:  # a key names several blocks (a dict of them)
            return None

    def entries(self) -> Iterator[tuple[bytes, Collection[int]]]:
        for key, blocks in self.cache.items():
            yield key, (blocks.keys() if type(blocks) is dict else (blocks.block_id,))


def read_hash_map(hash_map: Any, map_of_ids: bool) -> HashMap:
    """vLLM's `BlockHashToBlockMap` read in place: 0.34's shape when `map_of_ids`, else 0.32's."""
    return IdMapView(hash_map) if map_of_ids else MapView(hash_map)
