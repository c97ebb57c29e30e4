"""nano-vllm's `BlockManager` behind the adapter protocol (the `nano-vllm-fork` distribution).

Only `nanovllm.engine.block_manager` and `nanovllm.engine.sequence` are loaded: the package's
`__init__` imports torch and the model runner, so a bare `nanovllm` package is registered first
and its `__init__` never runs (the block manager needs only numpy and xxhash). The adapter is
the scheduler's calls, as nano-vllm's `Scheduler` makes them: `can_allocate` then `allocate` to
admit, `append_token` then `can_append` and `may_append` to decode, `deallocate` to free or
preempt. nano-vllm publishes a full page's hash when the page is allocated and never waits for
the KV, so `written` does nothing. A refused call changes nothing ("atomic").

`upstream_manager` is the test double for nano-vllm issue #163: upstream's `deallocate`, before
the fork's fix, leaves a freed page's hash in `hash_to_block_id`; once the page is reused for the
same tokens under another prefix, the old hash serves it for a prefix whose KV it does not hold.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import Any

from kvsched.testing.adapter import PoolView


def _modules() -> tuple[Any, Any]:
    """nanovllm's `BlockManager` and `Sequence` classes, without the package's `__init__`."""
    if "nanovllm" not in sys.modules:
        found = importlib.util.find_spec("nanovllm")
        if found is None or not found.submodule_search_locations:
            raise ImportError("nano-vllm is not installed: pip install --no-deps nano-vllm-fork numpy xxhash")
        package = types.ModuleType("nanovllm")  # a bare package: its __init__ (torch) never runs
        package.__path__ = list(found.submodule_search_locations)
        sys.modules["nanovllm"] = package
    block_manager: Any = importlib.import_module("nanovllm.engine.block_manager")
    sequence: Any = importlib.import_module("nanovllm.engine.sequence")
    return block_manager.BlockManager, sequence.Sequence


class NanoVllmManager:
    """One nano-vllm `BlockManager` (or a subclass) of `pages` blocks of `page_size` tokens."""

    capabilities = frozenset({"atomic"})

    def __init__(self, pages: int, page_size: int, block_manager: type | None = None) -> None:
        manager_class, self._sequence = _modules()
        self.blocks = (block_manager or manager_class)(pages, page_size)
        self.page_size = page_size
        self.sequences: dict[int, Any] = {}

    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        sequence = self._sequence(list(tokens))
        sequence.block_size = self.page_size  # a class attribute upstream (256): set per sequence
        if not self.blocks.can_allocate(sequence):
            return None
        self.blocks.allocate(sequence)
        self.sequences[request_id] = sequence
        return int(sequence.num_cached_tokens)

    def append(self, request_id: int, token: int) -> bool:
        sequence = self.sequences[request_id]
        sequence.append_token(token)
        if not self.blocks.can_append(sequence):
            sequence.token_ids.pop()
            sequence.num_tokens -= 1
            sequence.last_token = sequence.token_ids[-1]
            return False
        self.blocks.may_append(sequence)
        return True

    def written(self, request_id: int, tokens: int) -> None:
        pass

    def free(self, request_id: int) -> None:
        self.blocks.deallocate(self.sequences.pop(request_id))

    def view(self) -> PoolView:
        blocks = self.blocks
        return PoolView(
            holders=tuple(block.ref_count for block in blocks.blocks),
            free=frozenset(blocks.free_block_ids),
            tables={request_id: tuple(sequence.block_table) for request_id, sequence in self.sequences.items()},
            cached={block_id: key for key, block_id in blocks.hash_to_block_id.items()},
        )


def manager(pages: int, page_size: int) -> NanoVllmManager:
    """nano-vllm's `BlockManager` as installed."""
    return NanoVllmManager(pages, page_size)


def _upstream_class() -> type:
    block_manager, _ = _modules()

    class UpstreamBlockManager(block_manager):  # type: ignore[misc,valid-type]
        """Upstream nano-vllm's `deallocate`, which keeps a freed block's hash mapping (#163),
        and an `allocate` that never hits a prompt's last full page (so the full-hit bug of the
        released block manager does not come first: the one line marked differs)."""

        def allocate(self, seq: Any) -> None:
            assert not seq.block_table
            h = -1
            cache_miss = False
            for i in range(seq.num_blocks):
                token_ids = seq.block(i)
                h = self.compute_hash(token_ids, h) if len(token_ids) == self.block_size else -1
                block_id = self.hash_to_block_id.get(h, -1)
                if block_id == -1 or self.blocks[block_id].token_ids != token_ids:
                    cache_miss = True
                if i == seq.num_blocks - 1:  # the line that differs: the last page is computed
                    cache_miss = True
                if cache_miss:
                    block_id = self.free_block_ids[0]
                    block = self._allocate_block(block_id)
                else:
                    seq.num_cached_tokens += self.block_size
                    if block_id in self.used_block_ids:
                        block = self.blocks[block_id]
                        block.ref_count += 1
                    else:
                        block = self._allocate_block(block_id)
                if h != -1:
                    block.update(h, token_ids)
                    self.hash_to_block_id[h] = block_id
                seq.block_table.append(block_id)

        def deallocate(self, seq: Any) -> None:
            for block_id in reversed(seq.block_table):
                block = self.blocks[block_id]
                block.ref_count -= 1
                if block.ref_count == 0:
                    self._deallocate_block(block_id)
            seq.num_cached_tokens = 0
            seq.block_table.clear()

    return UpstreamBlockManager


def upstream_manager(pages: int, page_size: int) -> NanoVllmManager:
    """nano-vllm's `BlockManager` with upstream's `deallocate` (before the fix for #163), its
    full prefix hits capped (see `UpstreamBlockManager`)."""
    return NanoVllmManager(pages, page_size, _upstream_class())
