"""Record vLLM's own `BlockPool` as traces in the reserve's alphabet, for tests without vLLM.

vLLM's `KVCacheManager` runs programs drawn by kvsched's safety machine (the `manager` adapter)
over a recording `BlockPool`: vLLM's pool, unchanged, that logs every call the way
`KvschedBlockPool` maps it onto the reserve (allocate, touch, free, free_evict_first, unpin,
register, forget, lookup, reset) with vLLM's answers, and after each call the free queue and the
counts. The tests (`tests/integrations/test_vllm_traces.py`) replay every trace on the spec's
reserve and impl's, which must give vLLM's answers call for call, without vLLM installed.

On a release whose `free_blocks` takes `evict_first` (0.34), every third free the manager makes
is passed on with `evict_first=True`, as a tier that already holds those blocks' content would
free them: vLLM's own pool then decides where they go, and the trace records it.

    python record_traces.py OUT.json [--programs 150] [--seed 0]     (vLLM's venv)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

PAGES = 12
PAGE_SIZE = 2


def recording_pool_class(trace: list[list[Any]]) -> type[Any]:
    from vllm.v1.core.block_pool import BlockPool

    from kvsched.integrations.vllm.names import require_names

    evict_first = require_names().evict_first

    keys: dict[Any, int] = {}

    def key_id(key: Any) -> int:
        return keys.setdefault(key, len(keys))

    class RecordingPool(BlockPool):  # type: ignore[misc]
        """vLLM's pool, logging each call as the reserve sees it."""

        _quiet = 0  # inside get_new_blocks: its evictions are part of allocate

        def _state(self) -> None:
            queue = [block.block_id for block in self.free_block_queue.get_all_free_blocks()]
            trace.append(["state", queue, [block.ref_cnt for block in self.blocks[1:]]])

        def get_new_blocks(self, num_blocks: int) -> list[Any]:
            self._quiet += 1
            try:
                blocks = super().get_new_blocks(num_blocks)
            except ValueError:
                trace.append(["allocate", num_blocks, None])
                raise
            finally:
                self._quiet -= 1
            trace.append(["allocate", num_blocks, [block.block_id for block in blocks]])
            self._state()
            return list(blocks)

        def touch(self, blocks: Any) -> None:
            trace.append(["touch", [block.block_id for block in blocks]])
            super().touch(blocks)
            self._state()

        _frees = 0

        def free_blocks(self, ordered_blocks: Any, *args: Any) -> None:
            blocks = list(ordered_blocks)
            self._frees += 1
            if evict_first and self._frees % 3 == 0:  # as a tier holding their content frees them
                trace.append(["free_evict_first", [block.block_id for block in blocks]])
                super().free_blocks(blocks, evict_first=True)
            else:
                trace.append(["free", [block.block_id for block in blocks]])
                super().free_blocks(blocks, *args)
            self._state()

        def _insert_block_hash(self, key: Any, block: Any, num_tokens: Any) -> None:
            if not self._quiet:
                trace.append(["register", key_id(key), block.block_id])
            super()._insert_block_hash(key, block, num_tokens)

        def _remove_cached_block_hashes(self, block: Any) -> list[Any]:
            removed = list(super()._remove_cached_block_hashes(block))
            if not self._quiet:
                trace.append(["forget", block.block_id, sorted(key_id(key) for key in removed)])
            return removed

        def get_cached_block(self, block_hash: Any, kv_cache_group_ids: list[int]) -> Any:
            from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

            found = super().get_cached_block(block_hash, kv_cache_group_ids)
            for group_id in kv_cache_group_ids:
                key = make_block_hash_with_group_id(block_hash, group_id)
                block = self.cached_block_hash_to_block.get_one_block(key)
                trace.append(["lookup", key_id(key), None if block is None else block.block_id])
                if block is None:
                    break
            return found

        def reset_prefix_cache(self) -> bool:
            done = bool(super().reset_prefix_cache())
            trace.append(["reset", done])
            self._state()
            return done

    return RecordingPool


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--programs", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import vllm.v1.core.kv_cache_coordinator as coordinator

    from kvsched.testing.adapters import vllm as adapters
    from kvsched.testing.safety_search import search_safety

    traces: list[list[list[Any]]] = []
    vllm_pool = coordinator.BlockPool

    def factory(pages: int, page_size: int) -> Any:
        trace: list[list[Any]] = [["pool", pages]]
        traces.append(trace)
        coordinator.BlockPool = recording_pool_class(trace)
        try:
            return adapters.manager(pages, page_size)
        finally:
            coordinator.BlockPool = vllm_pool

    result = search_safety(factory, examples=args.programs, seed_value=args.seed, pages=PAGES, page_size=PAGE_SIZE)
    if result.failure is not None:
        raise SystemExit(f"vLLM's manager failed a safety check while recording: {result.failure}")
    kept = [trace for trace in traces if len(trace) > 2]
    args.out.write_text(json.dumps({"pages": PAGES, "traces": kept}, separators=(",", ":")) + "\n")
    calls = sum(len(trace) for trace in kept)
    print(f"{len(kept)} traces, {calls} entries -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
