"""The engine's page keys: each running request's full pages' keys, by scheduler slot, and the
salts they are rooted in.

The keys are the spec's (`kvsched.spec.page_keys.page_keys` over the request's sequence, salted
by `salt_of`), made faster: a prompt is keyed once, at submit (`of_prompt`), a preempted request
keeps its keys in the queue and extends them (`of_queued`), a running request's keys grow as its
pages fill, read straight from its token row (`through`), and a decode round's filled pages are
keyed in one batch (`of_filled`).

    salt(request)                 its tenant's and adapter's salt, built once per pair
    of_prompt(request)            the keys of its prompt's full pages
    of_queued(entry, pages, kept) a queued entry's first `pages` keys: `kept` (its keys kept at
                                  preemption: the same tokens), extended; else hashed now
    through(slot, request, pages) the slot's first `pages` keys (and any it already had)
    of_filled(filled, request_of) the key of the page each round item filled

No step needs its keys back: a slot's keys name its tokens, and a failed admission's are replaced
by the slot's next admission's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy.typing as npt

from kvsched.impl.page_hash import PageHasher
from kvsched.spec.engine_config import EngineConfig, EngineRequest, salt_of
from kvsched.spec.engine_state import Queued
from kvsched.spec.page_keys import CacheSalt, Key, pack_tokens, page_hash


class PageKeys:
    """Page keys for one engine (`config`) whose token rows are `tokens` (one row a slot)."""

    __slots__ = ("_salts", "_tokens", "config", "hasher", "slots")

    def __init__(self, config: EngineConfig, tokens: npt.NDArray[Any]) -> None:
        self.config = config
        self.hasher = PageHasher(config.page_size, page_hash(config.page_hash))
        self.slots: list[list[Key]] = [[] for _ in range(config.requests)]  # each slot's full pages' keys
        self._salts: dict[tuple[int, int], CacheSalt] = {}  # (tenant, adapter) -> its salt, once built
        self._tokens = tokens

    def salt(self, request: EngineRequest) -> CacheSalt:
        """The request's salt (`salt_of`), built once per tenant and adapter."""
        salt = self._salts.get((request.tenant, request.adapter))
        if salt is None:
            salt = self._salts[request.tenant, request.adapter] = salt_of(self.config, request)
        return salt

    def of_prompt(self, request: EngineRequest) -> list[Key]:
        """The keys of `request`'s prompt's full pages."""
        pages = len(request.prompt) // self.config.page_size
        return self.hasher.keys_of(request.prompt_bytes, pages, self.salt(request))

    def of_queued(self, entry: Queued, pages: int, kept: list[Key] | None) -> list[Key]:
        """The keys of the queued `entry`'s first `pages` full pages: those hashed at submit or
        `kept` at its preemption (the same tokens: its entry is the one they were kept with),
        extended; else hashed now."""
        request = entry.request
        keys = kept[:pages] if kept is not None else None
        if keys is not None and len(keys) == pages:
            return keys
        data = request.prompt_bytes + pack_tokens(entry.generated) if entry.generated else request.prompt_bytes
        if keys is None:
            return self.hasher.keys_of(data, pages, self.salt(request))
        self.hasher.extend(keys, data, pages, self.salt(request))
        return keys

    def through(self, slot: int, request: EngineRequest, pages: int) -> list[Key]:
        """The keys of `slot`'s first `pages` full pages (and any it already had): its running
        `request`'s, read from its token row."""
        slot_keys = self.slots[slot]
        if len(slot_keys) < pages:
            salt = None if slot_keys else self.salt(request)
            self.hasher.extend(slot_keys, self._token_bytes(), pages, salt, slot * self._tokens.shape[1] * 4)
        return slot_keys

    def of_filled(self, filled: list[list[int]], request_of: Callable[[int], EngineRequest]) -> list[Key]:
        """The key of the page each of a round's `filled` rows (admitted, slot, depth, page)
        filled. The pages that follow their slot's keyed ones are keyed in one batch; any other
        (no full page keyed yet) is keyed from its row alone."""
        slots = self.slots
        following = [(slot, depth) for _, slot, depth, _ in filled if 0 < depth == len(slots[slot])]
        if following:
            row_bytes, page_bytes = self._tokens.shape[1] * 4, self.config.page_size * 4
            parents = [slots[slot][-1] for slot, _ in following]
            starts = [slot * row_bytes + depth * page_bytes for slot, depth in following]
            hashed = self.hasher.next_keys(parents, self._token_bytes(), starts)
            for (slot, _), key in zip(following, hashed, strict=True):
                slots[slot].append(key)
        return [
            slots[slot][depth] if depth < len(slots[slot]) else self.through(slot, request_of(slot), depth + 1)[depth]
            for _, slot, depth, _ in filled
        ]

    def _token_bytes(self) -> memoryview:
        """The token rows' bytes, row after row (a view: nothing is copied)."""
        return self._tokens.data.cast("B")
