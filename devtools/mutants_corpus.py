"""The corpus of deliberately broken impl variants: each is the real impl with one bug.

A `Mutant` is a subclass of one impl class (`component`) overriding one small named method
(`seam`): most with a few lines written here, the bug in plain sight; the ones whose bug lives in
a numba kernel override the method that reaches the kernel with a copy calling a patched kernel
(`kvsched.testing.patching`: statements addressed by position and kind, never by text). The real
impl classes and modules are never touched. Most bugs are ones serving engines have shipped.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsched.impl.lowering import apply_round, lower_round
from kvsched.impl.page_kernels import clear_row, retain_pages
from kvsched.impl.pool import BlockPool, release_array, retain_sequence
from kvsched.impl.prefix import PrefixKvStore, find_idle_lru
from kvsched.impl.scheduler import RequestScheduler
from kvsched.impl.slots import DECODE, PREFILL
from kvsched.impl.table import TableRow
from kvsched.spec.batch import U32_MAX
from kvsched.spec.pool import Copy
from kvsched.spec.prefix import PrefixPageSet
from kvsched.testing.patching import Function, Statement, patch_statements, swap

COMPONENTS: dict[str, type[Any]] = {"pool": BlockPool, "store": PrefixKvStore, "scheduler": RequestScheduler}


@dataclass(frozen=True)
class Mutant:
    """One bug: `component`'s method `seam` overridden by `override`, or, for a kernel's bug, by
    a copy of the method that calls `kernel` with `edits` applied."""

    name: str
    component: str
    seam: str
    override: Callable[..., Any] | None = None
    kernel: Function | None = None
    edits: tuple[Statement, ...] = ()

    def build(self) -> type[Any]:
        """The impl class with this one bug: a subclass overriding `seam`."""
        base = COMPONENTS[self.component]
        method = self.override
        if method is None:
            assert self.kernel is not None, f"mutant {self.name!r} has neither an override nor a kernel"
            method = swap(getattr(base, self.seam), self.kernel, patch_statements(self.kernel, self.edits, self.name))
        return type(f"Mutant{base.__name__}", (base,), {self.seam: method, "__doc__": f"{base.__name__}: {self.name}"})


# -- the pool -----------------------------------------------------------------------------------


def copies_only_past_two(self: BlockPool, count: int) -> bool:
    return count > 2


def releases_before_allocating(self: BlockPool, page: int, count: int) -> Copy:
    self._refs[page] = count - 1
    destination = self.allocate()
    return Copy(page, destination)


def pushes_to_the_bottom(self: BlockPool, page: int) -> None:
    top = int(self._top[0])
    self._free[1 : top + 1] = self._free[:top].copy()
    self._free[0] = page
    self._top[0] = top + 1


def never_pushes(self: BlockPool, page: int) -> None:
    pass


def one_past_the_maximum(self: BlockPool, count: int) -> bool:
    return count > self._max_references


# -- the scheduler ------------------------------------------------------------------------------


def leaks_the_first_page(self: RequestScheduler, row: TableRow, pool: BlockPool) -> None:
    release_array(pool, row[1:], skip_invalid=True)
    clear_row(row)


def keeps_the_id(self: RequestScheduler, request_id: int) -> None:
    pass


def keeps_the_token_count(self: RequestScheduler, slot: int) -> None:
    count = int(self._slots.token_counts[slot])
    RequestScheduler._clear_slot(self, slot)
    self._slots.token_counts[slot] = count


def completes_a_decoding_request(self: RequestScheduler, state: int) -> bool:
    return state in (PREFILL, DECODE)


def full_before_duplicate(self: RequestScheduler, request_id: int) -> int:
    self._refuse_full(request_id)
    self._refuse_duplicate(request_id)
    return self._lowest_empty()


def finds_no_normalized_id(self: RequestScheduler, request_id: int) -> int | None:
    return None


def shares_scratch(self: RequestScheduler, buffers: dict[str, Any], supplied: tuple[str, ...]) -> None:
    pass


def counts_a_chunk_as_one(self: RequestScheduler, count: int, tokens: int) -> int:
    return min(count + min(tokens, 1), U32_MAX)


def highest_empty(self: RequestScheduler) -> int:
    return max(self._empty)


def shares_without_retaining(self: RequestScheduler, source: TableRow, target: TableRow, pool: BlockPool) -> None:
    target[:] = source


# -- the store ----------------------------------------------------------------------------------


def keeps_the_stamp(self: PrefixKvStore, entry: int) -> None:
    pass


def releases_the_old_set_first(
    self: PrefixKvStore, page_set: PrefixPageSet, replaced: int | None, pool: BlockPool
) -> Any:
    if replaced is not None:
        release_array(pool, self._pages[replaced, : self._page_counts[replaced]])
    retain_sequence(pool, page_set.pages)
    return np.array(page_set.pages, dtype=np.uint32)


def keeps_the_references(self: PrefixKvStore, entry: int, pool: BlockPool) -> None:
    pass


# -- kernel edits -------------------------------------------------------------------------------

NO_ROLLBACK = (Statement((4,), ast.If),)  # retain_pages: the undo of a refused retain (the gate reuses it)

_ITEM_OFFSET = (5, 6)  # lower_round: item["block_table_offset"] = index * width
_OUTPUT_RESET = ((5, 12), (5, 13), (5, 14))  # lower_round: an unwritten output never matches
_APPLIED_WHILE_CHECKED = """
for index in range(count):
    slot = round_slots[index]
    output = outputs[index]
    if output["request_id"] != request_ids[slot] or output["slot"] != slot:
        return index
    next_tokens[slot] = outputs[index]["next_token_id"]
    if token_counts[slot] < U32_MAX:
        token_counts[slot] += 1
    token_ready[slot] = True
"""


def _reclaim_mutant(name: str, path: tuple[int, ...], source: str) -> Mutant:
    """A bug in the store's choice of an idle entry to evict: one `if` of `find_idle_lru`."""
    return Mutant(name, "store", "_reclaim", kernel=find_idle_lru, edits=(Statement(path, ast.If, source),))


MUTANTS: tuple[Mutant, ...] = (
    Mutant("copy-on-write skipped at refcount 2", "pool", "_must_copy", copies_only_past_two),
    Mutant("writable releases the source before allocating", "pool", "_copy", releases_before_allocating),
    Mutant("freed pages reused first-in-first-out", "pool", "_push_free", pushes_to_the_bottom),
    Mutant("release never frees a page at zero", "pool", "_push_free", never_pushes),
    Mutant("retain allows one reference past the maximum", "pool", "_at_maximum", one_past_the_maximum),
    Mutant(
        "block-table offset off by one in lowering",
        "scheduler",
        "execute_decode_round",
        kernel=lower_round,
        edits=(Statement(_ITEM_OFFSET, ast.Assign, 'item["block_table_offset"] = index * width + 1'),),
    ),
    Mutant(
        "outputs applied before the identity check",
        "scheduler",
        "execute_decode_round",
        kernel=apply_round,
        edits=(Statement((1,), ast.For, _APPLIED_WHILE_CHECKED), Statement((2,), ast.For)),
    ),
    Mutant(
        "decode round leaves stale outputs",
        "scheduler",
        "execute_decode_round",
        kernel=lower_round,
        edits=tuple(Statement(path, ast.Assign) for path in _OUTPUT_RESET),
    ),
    Mutant(
        "install_shared_prefix without rollback",
        "scheduler",
        "admit_with_prefix",
        kernel=retain_pages,
        edits=NO_ROLLBACK,
    ),
    Mutant("finish leaks the first page", "scheduler", "_release_row", leaks_the_first_page),
    Mutant("stale request-id entry after finish", "scheduler", "_forget_id", keeps_the_id),
    Mutant("finish leaves the token count", "scheduler", "_clear_slot", keeps_the_token_count),
    Mutant("mark_prefill_complete moves a decoding request", "scheduler", "_completes", completes_a_decoding_request),
    Mutant("duplicate check after the capacity check", "scheduler", "_require_free_slot", full_before_duplicate),
    Mutant("an integer id that is not a plain int is unknown", "scheduler", "_find", finds_no_normalized_id),
    Mutant("a round takes scratch buffers that share memory", "scheduler", "_require_disjoint", shares_scratch),
    Mutant("a prefill chunk is counted as one token", "scheduler", "_counted", counts_a_chunk_as_one),
    Mutant("admission takes the highest empty slot", "scheduler", "_lowest_empty", highest_empty),
    Mutant("fork shares pages without retaining them", "scheduler", "_share_row", shares_without_retaining),
    Mutant("attach does not refresh the LRU stamp", "store", "_refresh", keeps_the_stamp),
    _reclaim_mutant(
        "reclaim evicts the most recently used",
        (5, 0),
        "if not occupied[entry] or (best >= 0 and last_used[entry] <= last_used[best]):\n    continue",
    ),
    _reclaim_mutant(
        "reclaim evicts entries still in use",
        (5, 2, 1),
        "if page >= size or refs[page] < store_refs[page] + spare[page]:\n    idle = False\n    break",
    ),
    Mutant("publish releases the old set before retaining the new", "store", "_exchange", releases_the_old_set_first),
    Mutant("remove keeps the entry's page references", "store", "_release_entry", keeps_the_references),
)
