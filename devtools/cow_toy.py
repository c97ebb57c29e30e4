"""A third-party block manager in nano-vllm's shape with fork and copy-on-write, its adapter, and
two planted copy-on-write bugs the safety harness must find at its defaults.

`fault`:
- "in_place": a decode into a last page another request shares writes it in place (no copy);
- "release_first": copy-on-write drops the request's hold on the source before it allocates the
  copy, and a refusal for lack of pages does not take the hold back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from kvsched.testing import PoolView


class CowBlockManager:
    """Reference counts, a FIFO free list, fork shares a parent's blocks, copy-on-write on append."""

    def __init__(self, num_blocks: int, block_size: int, fault: str = "") -> None:
        self.block_size, self.fault = block_size, fault
        self.ref_count = [0] * num_blocks
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    def _take(self) -> int:
        block = self.free_blocks.popleft()
        self.ref_count[block] = 1
        return block

    def _release(self, block: int) -> None:
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            self.free_blocks.append(block)

    def allocate(self, seq_id: int, length: int) -> bool:
        blocks = -(-length // self.block_size)
        if blocks > len(self.free_blocks):
            return False
        self.tables[seq_id] = [self._take() for _ in range(blocks)]
        self.lengths[seq_id] = length
        return True

    def fork(self, parent: int, child: int) -> None:
        for block in self.tables[parent]:
            self.ref_count[block] += 1
        self.tables[child] = list(self.tables[parent])
        self.lengths[child] = self.lengths[parent]

    def append_slot(self, seq_id: int) -> tuple[bool, tuple[int, int] | None]:
        """Room for one more token: (done, the (source, copy) pair when it copied)."""
        table, copy = self.tables[seq_id], None
        if self.lengths[seq_id] % self.block_size == 0:
            if not self.free_blocks:
                return False, None
            table.append(self._take())
        elif self.ref_count[table[-1]] > 1 and self.fault != "in_place":
            source = table[-1]
            if self.fault == "release_first":
                self.ref_count[source] -= 1
            if not self.free_blocks:
                return False, None
            if self.fault != "release_first":
                self.ref_count[source] -= 1
            table[-1] = self._take()
            copy = (source, table[-1])
        self.lengths[seq_id] += 1
        return True, copy

    def free(self, seq_id: int) -> None:
        for block in self.tables.pop(seq_id):
            self._release(block)
        del self.lengths[seq_id]


# --8<-- [start:adapter]
class CowAdapter:
    """`CowBlockManager` behind the adapter protocol, every verb it supports declared."""

    capabilities = frozenset({"fork", "copy_on_write", "atomic"})

    def __init__(self, pages: int, page_size: int, fault: str = "") -> None:
        self.blocks = CowBlockManager(pages, page_size, fault)
        self._copies: list[tuple[int, int]] = []

    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        return 0 if self.blocks.allocate(request_id, len(tokens)) else None

    def append(self, request_id: int, token: int) -> bool:
        done, copy = self.blocks.append_slot(request_id)
        self._copies = [copy] if copy is not None else []
        return done

    def copies(self) -> list[tuple[int, int]]:
        return self._copies

    def written(self, request_id: int, tokens: int) -> None:
        pass  # no prefix cache: nothing to publish

    def free(self, request_id: int) -> None:
        self.blocks.free(request_id)

    def fork(self, parent_id: int, child_id: int) -> bool:
        self.blocks.fork(parent_id, child_id)
        return True

    def view(self) -> PoolView:
        blocks = self.blocks
        return PoolView(
            holders=tuple(blocks.ref_count),
            free=frozenset(blocks.free_blocks),
            tables={seq_id: tuple(table) for seq_id, table in blocks.tables.items()},
        )


# --8<-- [end:adapter]


def cow(fault: str) -> Callable[[int, int], CowAdapter]:
    """A factory of adapters over a manager with `fault` planted ("" for none)."""

    def factory(pages: int, page_size: int) -> CowAdapter:
        return CowAdapter(pages, page_size, fault)

    return factory


correct = cow("")
in_place = cow("in_place")
release_first = cow("release_first")
