"""What the hybrid campaigns exercise in SGLang's own code, counted (`make sglang`, SGLang's venv).

The harness's coverage counts its own verbs; this counts what the hybrid adapters' SGLang did
under them, over the campaigns `kvsched check` runs (seeded, pages drawn as it draws them):

- `sglang_hybrid:hybrid_swa`: window slides that freed slots, evictions made for the SWA pool
  alone (the tree tombstones nodes: their window KV goes, their full KV stays) and for the full
  pool, views whose tree holds a tombstone, admissions that hit, and hits whose window table holds
  the null page inside the hit (a tombstoned position the next query does not read);
- `sglang_mamba:hybrid_mamba` (and `hybrid_swa_mamba`, counted both ways): hits that resume
  from a snapshot (copy-on-write), checkpoints that copied a state for the tree, releases whose
  state the tree took as its snapshot, and admissions that evicted a snapshot for a state slot.

    python -m devtools.sglang.hybrid_coverage [--examples 1000] [--seeds 0 1 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvsched.testing.adapters.sglang_hybrid import SglangHybridCache
from kvsched.testing.adapters.sglang_mamba import SglangMambaCache, SglangSwaMambaCache
from kvsched.testing.safety_search import search_safety

COUNTS: Counter[str] = Counter()


class CountedWindows(SglangHybridCache):
    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        found = super().admit(request_id, tokens)
        if found:
            COUNTS["hits"] += 1
            window = self.group_tables()[request_id][1]
            COUNTS["hits over a null window position"] += 0 in window[:found]
        return found

    def _slide(self, request_id: int, computed: int | None = None) -> None:
        kv = self.requests[request_id].kv
        before = kv.get_evicted_seqlen(self.component)
        super()._slide(request_id, computed)
        COUNTS["slides that freed"] += kv.get_evicted_seqlen(self.component) > before

    def _evict_for(self, need: int) -> None:
        allocator = self.allocator
        full, window = need > allocator.full_available_size(), need > allocator.swa_available_size()
        COUNTS["evictions for the SWA pool alone"] += window and not full
        COUNTS["evictions for the full pool"] += full
        super()._evict_for(need)

    def view(self) -> Any:
        root = self.tree.tree_core.root_node
        stack, tombstones = list(root.children.values()), 0
        while stack:
            node = stack.pop()
            stack += node.children.values()
            tombstones += node.component_data[self.component].value is None
        COUNTS["views with a tombstone"] += tombstones > 0
        return super().view()


class CountedStates(SglangMambaCache):
    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        evictable = self.tree.mamba_evictable_size()
        free = self.rows.mamba_allocator.available_size()
        found = super().admit(request_id, tokens)
        COUNTS["hits resumed from a snapshot"] += bool(self.copied[0])
        taken = found is not None and not free and self.tree.mamba_evictable_size() < evictable
        COUNTS["admissions that evicted a snapshot"] += taken
        return found

    def written(self, request_id: int, tokens: int) -> None:
        super().written(request_id, tokens)
        COUNTS["checkpoints that copied a state"] += bool(self.copied[1])

    def free(self, request_id: int) -> None:
        slot = self._slot(self.requests[request_id].kv.mamba_pool_idx)
        super().free(request_id)
        COUNTS["releases whose state became a snapshot"] += slot in self._snapshot_slots()


class CountedBoth(CountedStates, CountedWindows, SglangSwaMambaCache):
    """`sglang_mamba:hybrid_swa_mamba`, counted both ways."""


ADAPTERS: dict[str, Callable[[int, int], Any]] = {
    "hybrid_swa": CountedWindows,
    "hybrid_mamba": CountedStates,
    "hybrid_swa_mamba": CountedBoth,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = []
    for name, factory in ADAPTERS.items():
        for seed in args.seeds:
            COUNTS.clear()
            result = search_safety(
                factory, examples=args.examples, seed_value=seed, page_size=1, source=("devtools", name)
            )
            row = {"adapter": name, "seed": seed, "programs": result.programs, "passed": result.passed, **COUNTS}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(row["passed"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
