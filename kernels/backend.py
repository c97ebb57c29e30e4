"""The paged decode backend: the model of `kvsched.kernels.model` over a paged KV cache, on the
"numpy", "cpu" or "cuda" device, behind the scheduler's backend protocol.

    execute_ragged(items, block_tables, out)  one decode round = one call (however many kernels):
                                              every item's token at its position, KV appended,
                                              attention over position + 1 tokens, greedy argmax
    prefill(tokens, start, page_table)        a request's prompt chunk through the same kernels
                                              (append all, then causal attention); the logits
    copy_pages(pairs)                         copy-on-write: one launch for every layer's K and V
    execute_prefill(items)                    the engine's prefill call: every chunk, a token each
    start_copies(to_device, to_host), copies_done(ids)
                                              a host tier (`host_pages`): its K and V in host
                                              memory; one launch each way copies a batch of pages
                                              across (`ops.copy_tier`), all or nothing, and each
                                              copy is reported done at the next poll

It serves both scheduler forms: the spec's tuples of records and impl's structured arrays (read
through `kvsched.abi`). Ownership: the backend owns its caches
(`[layers, pages, page_size, kv_heads, head_dim]`, K and V; on "cuda" they live on the device for
the backend's lifetime); which request may write which page is the scheduler's business, and the
backend only refuses what no scheduler may ask: a table entry that is unmapped or outside the
cache where a token is read or written, a position past the request's own table, a token id
outside the vocabulary. Those raise `ValueError` before any cache is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kvsched.abi import item_columns, table_array, write_outputs
from kvsched.kernels import ops
from kvsched.kernels.layout import INVALID_BLOCK, check_reachable_pages
from kvsched.kernels.model import Transformer
from kvsched.kernels.weights import Weights
from kvsched.spec.batch import RaggedBatchReceipt
from kvsched.spec.model import HostCopy, PrefillItem

F32 = npt.NDArray[np.float32]


class PagedBackend:
    """A paged-KV model backend on one device; see the module docstring."""

    def __init__(self, weights: Weights, pages: int, device: str = "cpu", host_pages: int = 0) -> None:
        if not isinstance(pages, int) or pages < 1:
            raise ValueError(f"pages must be a positive int, got {pages!r}")
        if not isinstance(host_pages, int) or host_pages < 0:
            raise ValueError(f"host_pages must be an int >= 0, got {host_pages!r}")
        self.device = ops.check_device(device)
        self.model = Transformer(weights)
        self.config = weights.config
        self.pages = pages
        shape = self.config.cache_shape(pages)
        k_cache = np.zeros(shape, dtype=self.config.cache_numpy_dtype)
        v_cache = np.zeros(shape, dtype=self.config.cache_numpy_dtype)
        if self.device == "cuda":
            from kvsched.kernels.device import cuda

            k_cache, v_cache = cuda.to_device(k_cache), cuda.to_device(v_cache)
        self.k_cache: Any = k_cache  # [layers, pages, page_size, kv_heads, head_dim], written by this backend
        self.v_cache: Any = v_cache
        host_shape = self.config.cache_shape(host_pages)
        self.host_k = np.zeros(host_shape, dtype=self.config.cache_numpy_dtype)  # the host tier, in host memory
        self.host_v = np.zeros(host_shape, dtype=self.config.cache_numpy_dtype)
        self.done: dict[int, bool] = {}  # copies between the tiers made and not yet reported
        self.tier_copies = 0  # pages copied between the tiers so far
        self.rounds = 0  # decode rounds served (each one backend call)
        # The logits behind the latest decode round's tokens, [items, vocab] in item order: kept
        # so callers can check them against a reference (the protocol itself returns tokens only).
        self.last_logits: F32 = np.zeros((0, self.config.vocab), dtype=np.float32)

    def execute_ragged(self, items: Any, block_tables: Any, out: Any) -> RaggedBatchReceipt:
        """One decode round: for every item, consume `token_id` at `position` and answer the
        argmax next token with the item's `request_id` and `slot`, in item order."""
        columns = item_columns(items)
        tables = table_array(block_tables)
        count = int(columns["request_id"].shape[0])
        if len(out) < count:
            raise ValueError(f"output buffer holds {len(out)} entries for {count} items")
        positions = columns["position"].astype(np.int64)
        logits = self._forward(
            columns["token_id"],
            positions,
            tables,
            columns["block_table_offset"].astype(np.int32),
            columns["logical_pages"].astype(np.int32),
        )
        next_tokens = np.argmax(logits, axis=1).astype(np.uint32) if count else np.zeros(0, np.uint32)
        self.last_logits = logits
        write_outputs(out, columns["request_id"].astype(np.uint64), columns["slot"].astype(np.uint32), next_tokens)
        self.rounds += 1
        moved = self._device_to_host_bytes(count) + (next_tokens.nbytes if self.device == "cuda" else 0)
        return RaggedBatchReceipt(batch_size=count, backend_launches=1, device_to_host_bytes=moved)

    def prefill(self, tokens: Sequence[int], start: int, page_table: Sequence[int | None]) -> F32:
        """Run `tokens` at positions `start, start + 1, ...` of one request whose logical page
        table is `page_table` (`None` or INVALID_BLOCK where unmapped); returns the logits after
        every token, `[len(tokens), vocab]` (the last row picks the first generated token)."""
        table = np.fromiter(
            (INVALID_BLOCK if page is None else page for page in page_table), dtype=np.uint32, count=len(page_table)
        )
        count = len(tokens)
        return self._forward(
            np.asarray(tokens, dtype=np.int64),
            np.arange(start, start + count, dtype=np.int64),
            table,
            np.zeros(count, dtype=np.int32),
            np.full(count, table.shape[0], dtype=np.int32),
        )

    def execute_prefill(self, items: Sequence[PrefillItem]) -> list[int]:
        """The engine's prefill call: each item's chunk through `prefill`, in item order; per
        item the greedy next token after its last one."""
        return [int(np.argmax(self.prefill(item.tokens, item.start, item.table)[-1])) for item in items]

    def copy_pages(self, pairs: Sequence[tuple[int, int]] | npt.NDArray[np.integer]) -> None:
        """Copy each (source, destination) page in every layer, K and V: do this when the
        scheduler answers `Copy(source, destination)`, before anything is written there."""
        ops.copy_pages(self.k_cache, self.v_cache, pairs, device=self.device)

    def start_copies(self, to_device: Sequence[HostCopy], to_host: Sequence[HostCopy]) -> None:
        """Copy each host page `source` of `to_device` into device page `destination`, and each
        device page `source` of `to_host` into host page `destination` (one launch each way).
        All or nothing: every page of both directions is checked against its tier first, and a
        destination named twice is refused, so a call that raises has copied nothing."""
        host_pages = int(self.host_k.shape[1])
        inward = _tier_pairs(to_device, host_pages, self.pages, "to_device")
        outward = _tier_pairs(to_host, self.pages, host_pages, "to_host")
        if len(inward):
            self._copy_tier((self.host_k, self.host_v), (self.k_cache, self.v_cache), to_device, inward)
        if len(outward):
            self._copy_tier((self.k_cache, self.v_cache), (self.host_k, self.host_v), to_host, outward)

    def copies_done(self, transfer_ids: Sequence[int]) -> list[bool | None]:
        """Every copy was made when it was issued: done, reported once asked (and again if asked
        again: a step that fails asks again). The engine asks about every copy in flight, so one
        older than all it asks about is applied: its answer is forgotten."""
        if transfer_ids:
            oldest = min(transfer_ids)
            self.done = {tid: done for tid, done in self.done.items() if tid >= oldest}
        return [self.done.get(transfer_id) for transfer_id in transfer_ids]

    def _copy_tier(
        self, source: tuple[Any, Any], destination: tuple[Any, Any], copies: Sequence[HostCopy], pairs: Any
    ) -> None:
        ops.copy_tier(source, destination, pairs, device=self.device)
        for copy in copies:
            self.done[copy.transfer_id] = True
        self.tier_copies += len(copies)

    def _forward(
        self,
        tokens: npt.NDArray[np.integer],  # [n]
        positions: npt.NDArray[np.int64],  # [n]
        tables: npt.NDArray[np.uint32],  # [entries]
        offsets: npt.NDArray[np.int32],  # [n]
        lengths: npt.NDArray[np.int32],  # [n] table entries each token's request owns
    ) -> F32:
        c = self.config
        if positions.size and int(positions.max()) >= 2**31 - 1:
            raise ValueError(f"position {int(positions.max())} is beyond the kernels' int32 range")
        contexts = (positions + 1).astype(np.int32)
        # Every entry any layer will read or write is checked once, up front, so that a bad table
        # fails before layer 0 writes anything (the kernels check again, per call).
        check_reachable_pages(tables, offsets, np.zeros_like(contexts), contexts, c.page_size, self.pages, lengths)
        x = self.model.embed(tokens)
        where = positions.astype(np.int32)
        for layer in range(c.layers):
            q, k, v = self.model.project(layer, x, positions)
            k_layer, v_layer = self.k_cache[layer], self.v_cache[layer]
            ops.append_kv(k, v, k_layer, v_layer, tables, offsets, where, device=self.device)
            window = c.window(layer)  # a sliding-window layer reads its window only
            starts = np.maximum(contexts - window, 0).astype(np.int32) if window else None
            attended = ops.paged_attention(
                q,
                k_layer,
                v_layer,
                tables,
                offsets,
                contexts,
                scale=c.scale,
                device=self.device,
                table_lengths=lengths,
                context_starts=starts,
            )
            x = self.model.finish_layer(layer, x, attended)
        return self.model.logits(x)

    def _device_to_host_bytes(self, count: int) -> int:
        """Attention outputs copied back per layer (the dense layers run on the host)."""
        if self.device != "cuda":
            return 0
        return count * self.config.q_heads * self.config.head_dim * 4 * self.config.layers


def _tier_pairs(copies: Sequence[HostCopy], sources: int, destinations: int, name: str) -> npt.NDArray[np.int64]:
    """`copies` as `[copies, 2]` (source, destination) pages, each checked against its tier's page
    count (in Python's integers) and no destination named twice; else `ValueError`."""
    pairs = [(int(copy.source), int(copy.destination)) for copy in copies]
    for index, (source, destination) in enumerate(pairs):
        if not 0 <= source < sources or not 0 <= destination < destinations:
            raise ValueError(f"{name} copy {index} names pages {source} -> {destination}: outside its tiers")
    if len({destination for _, destination in pairs}) != len(pairs):
        raise ValueError(f"{name} writes a destination page twice: {[d for _, d in pairs]}")
    return np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
