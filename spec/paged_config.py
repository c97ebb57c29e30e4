"""Geometry of a paged KV arena and the identity block table of a single dense sequence.

A dense sequence of `max_context` tokens over `n_layer` layers needs
`n_layer * ceil(max_context / block_size)` pages; the identity table maps
`[layer][logical_page]` to physical page `layer * logical_blocks_per_layer + logical_page`,
which is the dense page order.
"""

from __future__ import annotations

from collections.abc import MutableSequence
from dataclasses import dataclass

from kvsched.spec.errors import TableOutputTooSmall

DEFAULT_BLOCK_SIZE = 16
MAX_BLOCK_SIZE = 256


@dataclass(frozen=True, slots=True)
class PagedKvConfig:
    """Page size, model shape and arena size, as u32 quantities."""

    block_size: int
    n_layer: int
    n_kv_head: int
    head_dim: int
    max_context: int
    physical_blocks: int

    @staticmethod
    def new(n_layer: int, n_kv_head: int, head_dim: int, max_context: int) -> PagedKvConfig | None:
        """A config sized for one dense sequence at the default block size; None if invalid."""
        blocks = -(-max_context // DEFAULT_BLOCK_SIZE) if max_context > 0 else 0
        config = PagedKvConfig(DEFAULT_BLOCK_SIZE, n_layer, n_kv_head, head_dim, max_context, n_layer * blocks)
        return config if config.is_valid() else None

    def logical_blocks_per_layer(self) -> int:
        """Pages one layer of one sequence needs."""
        return -(-self.max_context // self.block_size)

    def required_single_sequence_blocks(self) -> int:
        """Pages one dense sequence needs across all layers."""
        return self.n_layer * self.logical_blocks_per_layer()

    def block_elems(self) -> int:
        """K and V elements in one page."""
        return self.block_size * self.n_kv_head * self.head_dim * 2

    def is_valid(self) -> bool:
        """A power-of-two block size up to 256, positive dimensions, room for one sequence."""
        size = self.block_size
        dims = (self.n_layer, self.n_kv_head, self.head_dim, self.max_context)
        return (
            0 < size <= MAX_BLOCK_SIZE
            and size & (size - 1) == 0
            and all(dim > 0 for dim in dims)
            and self.physical_blocks >= self.required_single_sequence_blocks()
        )


def fill_identity_block_table(config: PagedKvConfig, out: MutableSequence[int]) -> int:
    """Write the dense `[layer][logical_page]` identity table into `out`; entries written."""
    needed = config.required_single_sequence_blocks()
    if len(out) < needed:
        raise TableOutputTooSmall(f"table buffer holds {len(out)} entries, the identity table needs {needed}")
    for index in range(needed):
        out[index] = index
    return needed
