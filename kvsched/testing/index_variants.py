"""Broken router indexes, one per bug routers shipped folding engines' KV events, each impl's
`RouterIndex` with the one mistake the upstream bug made.

Each is caught by the index's step check (`views_match_their_engines`: a view not called stale
holds what its engine had) on a pinned program (`tests/impl/test_router_index.py`, a test named
after the upstream bug), and the machine and the explorer tell each apart from the spec.
"""

from __future__ import annotations

from kvsched.impl.router_index import RouterIndex
from kvsched.spec.kv_events import Cleared, EventBatch, require_batch
from kvsched.spec.router_index import Verdict


class RestartKeepsBlocks(RouterIndex):
    """llm-d-router #2853 / llm-d-kv-cache #593: an engine restarts and its sequence begins
    again, with no replay; the index keeps the blocks the old process had cached. A later epoch's
    first batch is folded onto the old set."""

    def fold(self, source: object, batch: object) -> Verdict:
        checked = require_batch(batch)
        view = self.views.get(checked.engine)
        if view is not None and checked.engine == source and checked.epoch > view.epoch and checked.seq == 0:
            view.epoch, view.next_seq, view.stale = checked.epoch, 0, False
        return super().fold(source, batch)


class IgnoresAllCleared(RouterIndex):
    """aibrix PR #2385: `AllBlocksCleared` is ignored, so an engine's reset leaves every block it
    dropped in the index."""

    def fold(self, source: object, batch: object) -> Verdict:
        checked = require_batch(batch)
        kept = tuple(event for event in checked.events if not isinstance(event, Cleared))
        return super().fold(source, EventBatch(checked.engine, checked.epoch, checked.seq, kept))


class FoldsForeignBatches(RouterIndex):
    """vLLM #45174: replay drops the topic frame, so a batch is folded into whichever stream it
    arrived on, whatever engine published it."""

    def fold(self, source: object, batch: object) -> Verdict:
        checked = require_batch(batch)
        if isinstance(source, str) and source and checked.engine != source:
            checked = EventBatch(source, checked.epoch, checked.seq, checked.events)
        return super().fold(source, checked)


class FoldsAcrossAGap(RouterIndex):
    """llm-d-kv-cache #593's class: the index does not look at sequence numbers within an epoch,
    so a batch after a dropped one is folded as if nothing were missing."""

    def fold(self, source: object, batch: object) -> Verdict:
        checked = require_batch(batch)
        view = self.views.get(checked.engine)
        same = view is not None and checked.engine == source and checked.epoch == view.epoch
        if same and view is not None and not view.stale and checked.seq > view.next_seq:
            view.next_seq = checked.seq
        return super().fold(source, batch)


VARIANTS: dict[str, type[RouterIndex]] = {
    "llmd_2853_restart_keeps_blocks": RestartKeepsBlocks,
    "aibrix_2385_ignores_all_cleared": IgnoresAllCleared,
    "vllm_45174_folds_foreign_batches": FoldsForeignBatches,
    "llmd_kv_cache_593_folds_across_a_gap": FoldsAcrossAGap,
}
