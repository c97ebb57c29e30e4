"""The corpus of deliberately broken impl variants: each is the real impl with one bug.

A `Mutant` names the impl class it breaks, the method its subclass overrides, the function
whose source it patches (the method itself, or a function or kernel the method reaches) and the
exact edits. `Mutant.build()` returns the subclass: the real impl classes and modules are never
touched (`kvsched.testing.patching`). Most bugs are ones serving engines have shipped.

Edits are written against the dedented source: a method's body is indented 4 spaces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvsched.impl.lowering import apply_round, lower_round
from kvsched.impl.page_kernels import retain_pages
from kvsched.impl.pool import BlockPool
from kvsched.impl.prefix import PrefixKvStore, attach_row, find_idle_lru
from kvsched.impl.scheduler import RequestScheduler
from kvsched.impl.slots import clear_slot
from kvsched.impl.table import fork_row, release_row
from kvsched.testing.patching import Function, patch_source, python_function, swap

COMPONENTS: dict[str, type[Any]] = {"pool": BlockPool, "store": PrefixKvStore, "scheduler": RequestScheduler}


@dataclass(frozen=True, slots=True)
class Mutant:
    """One bug: `component`'s `method`, with `target`'s source edited by `edits`."""

    name: str
    component: str
    method: str
    target: Function
    edits: tuple[tuple[str, str], ...]

    def build(self) -> type[Any]:
        """The impl class with this one bug: a subclass overriding `method`."""
        base = COMPONENTS[self.component]
        method = getattr(base, self.method)
        patched = patch_source(self.target, self.edits, self.name)
        if python_function(self.target) is not method:
            patched = swap(method, self.target, patched)
        return type(
            f"Mutant{base.__name__}", (base,), {self.method: patched, "__doc__": f"{base.__name__}: {self.name}"}
        )


def _mutant(name: str, component: str, method: str, target: Function | None = None, *edits: tuple[str, str]) -> Mutant:
    return Mutant(name, component, method, target or getattr(COMPONENTS[component], method), edits)


_PUSH = (
    "    if count == 1:\n"
    "        top = int(self._top[0])\n"
    "        self._free[top] = page\n"
    "        self._top[0] = top + 1\n"
)
_FIFO = (
    "        self._free[top] = page\n",
    "        self._free[1 : top + 1] = self._free[:top].copy()\n        self._free[0] = page\n",
)
# Edits other corpora reuse (the contract gate's broken targets break the same code).
NO_ROLLBACK = ("    if code != OK:\n        for index", "    if False:\n        for index")
RELEASE_BEFORE_ALLOCATE = (
    "    destination = self.allocate()\n    self._refs[page] = count - 1\n",
    "    self._refs[page] = count - 1\n    destination = self.allocate()\n",
)
_DUPLICATE = "    if request_id in self._slot_of:\n        raise refusals.duplicate_request(request_id)\n"
_FULL = "    if not self._empty:\n        raise refusals.scheduler_full(request_id, self.requests)\n"
_ZEROING = (
    "        output = outputs[index]\n"
    '        output["request_id"] = 0\n'
    '        output["slot"] = U32_MAX\n'
    '        output["next_token_id"] = 0\n'
)
_RELEASE_OLD = "            release_array(pool, self._pages[entry, : self._page_counts[entry]])\n"

MUTANTS: tuple[Mutant, ...] = (
    _mutant("copy-on-write skipped at refcount 2", "pool", "writable", None, ("if count == 1:", "if count <= 2:")),
    _mutant(
        "writable releases the source before allocating",
        "pool",
        "writable",
        None,
        RELEASE_BEFORE_ALLOCATE,
    ),
    _mutant("freed pages reused first-in-first-out", "pool", "release", None, _FIFO),
    _mutant("release never frees a page at zero", "pool", "release", None, (_PUSH, "")),
    _mutant(
        "block-table offset off by one in lowering",
        "scheduler",
        "execute_decode_round",
        lower_round,
        ('item["block_table_offset"] = index * width', 'item["block_table_offset"] = index * width + 1'),
    ),
    _mutant(
        "outputs applied before the identity check",
        "scheduler",
        "execute_decode_round",
        apply_round,
        (
            "            return index\n    for index in range(count):\n        slot = round_slots[index]\n",
            "            return index\n",
        ),
    ),
    _mutant("decode round leaves stale outputs", "scheduler", "execute_decode_round", lower_round, (_ZEROING, "")),
    _mutant(
        "install_shared_prefix without rollback",
        "scheduler",
        "admit_with_prefix",
        retain_pages,
        NO_ROLLBACK,
    ),
    _mutant(
        "finish leaks the first page",
        "scheduler",
        "finish",
        release_row,
        ("release_array(pool, row, skip_invalid=True)", "release_array(pool, row[1:], skip_invalid=True)"),
    ),
    _mutant("stale request-id entry after finish", "scheduler", "finish", None, ("    del self._slot_of[key]\n", "")),
    _mutant(
        "finish leaves the token count", "scheduler", "finish", clear_slot, ("    slots.token_counts[slot] = 0\n", "")
    ),
    _mutant(
        "mark_prefill_complete moves a decoding request",
        "scheduler",
        "mark_prefill_complete",
        None,
        ("    if state != PREFILL:\n", "    if state not in (PREFILL, DECODE):\n"),
    ),
    _mutant(
        "duplicate check after the capacity check",
        "scheduler",
        "_require_free_slot",
        None,
        (_DUPLICATE + _FULL, _FULL + _DUPLICATE),
    ),
    _mutant(
        "an integer id that is not a plain int is unknown",
        "scheduler",
        "_require_request",
        None,
        ("        slot = self._slot_of.get(request_id)\n", "        slot = None\n"),
    ),
    _mutant(
        "a round takes scratch buffers that share memory",
        "scheduler",
        "execute_decode_round",
        None,
        ("        require_disjoint(buffers, supplied, (*self._slots, self._round_slots, *self._writes))\n", ""),
    ),
    _mutant(
        "a prefill chunk is counted as one token",
        "scheduler",
        "record_tokens",
        None,
        (
            "    count = min(int(counts[slot]) + tokens, U32_MAX)\n",
            "    count = min(int(counts[slot]) + min(tokens, 1), U32_MAX)\n",
        ),
    ),
    _mutant(
        "admission takes the highest empty slot",
        "scheduler",
        "_require_free_slot",
        None,
        ("    return self._empty[0]\n", "    return max(self._empty)\n"),
    ),
    _mutant(
        "fork shares pages without retaining them",
        "scheduler",
        "fork",
        fork_row,
        ("    retain_array(pool, source, skip_invalid=True)\n", ""),
    ),
    _mutant(
        "retain allows one reference past the maximum",
        "pool",
        "retain",
        None,
        ("if count >= self._max_references:", "if count > self._max_references:"),
    ),
    _mutant(
        "attach does not refresh the LRU stamp",
        "scheduler",
        "admit_with_prefix",
        attach_row,
        ("    store._last_used[entry] = store._clock\n", ""),
    ),
    _mutant(
        "reclaim evicts the most recently used",
        "store",
        "_reclaim",
        find_idle_lru,
        ("last_used[entry] >= last_used[best]", "last_used[entry] <= last_used[best]"),
    ),
    _mutant(
        "reclaim evicts entries still in use",
        "store",
        "_reclaim",
        find_idle_lru,
        ("refs[page] != store_refs[page]", "refs[page] < store_refs[page]"),
    ),
    _mutant(
        "publish releases the old set before retaining the new",
        "store",
        "_publish",
        None,
        ("    retain_sequence(pool, page_set.pages)\n", ""),
        (
            "        old = self._identities[entry]\n",
            "        retain_sequence(pool, page_set.pages)\n        old = self._identities[entry]\n",
        ),
        (
            "    else:\n        heapq.heappop(self._empty)\n",
            "    else:\n        retain_sequence(pool, page_set.pages)\n        heapq.heappop(self._empty)\n",
        ),
    ),
    _mutant(
        "remove keeps the entry's page references",
        "store",
        "_remove",
        None,
        ("    release_array(pool, self._pages[entry, : self._page_counts[entry]])\n", ""),
    ),
)
