"""What the live checker checks, on a value read from a running pool: no vLLM needed here.

`kvsched.integrations.vllm.checker` reads vLLM's live manager and pool into a `PoolView`
(through the KV connector seam; at the steps `kvsched.integrations.vllm.live_delta` sends it to,
which reads what the other steps changed) and hands it to a `LiveChecker`, which keeps what
the checks need across steps (each key's ghost content, the blocks it has verified, the finished
requests) and returns every `Finding`. Each request's cached block is verified when it first
appears at its place; the ghosts of keys the map no longer names are forgotten once there are
many more of them than the map holds.

    refcount          a block's count is not the number of request tables holding it
                      (vLLM's cache holds no references of its own)
    free_in_table     a block in the free queue, or counted 0, is in a live request's table
    free_queue        the free queue is not exactly the free blocks, each once (nor the null block)
    free_order        the queue is not in the release's order: blocks without a hash (reused
                      first) before cached ones (reused last)
    cache_map         the hash map names a block that does not carry the key, or a block carries a
                      key the map does not name for it
    ghost_content     a request's cached block does not carry the key of the tokens it holds (a
                      masked group's may carry none), or a key names other tokens (or another
                      parent) than when it was first seen
    salt              a key names the same tokens under another cache salt than when first seen
    finished_leftover a finished request still holds blocks
    stale_key         a block a request is still writing (past its cached blocks) carries a key
                      other than its own tokens': a key outlived the content it named
    copy_in_flight    a block a connector copies (a store to another tier, a load from it) is
                      in the free queue, or a block a copy writes already carries a key
    window_read       a request's pass this step, in a sliding-window or chunked local attention
                      group, finds the null block (or no block) where its queries read or write:
                      a block released, or never attached, before the pass that reads it
                      (`Pass`, `window_findings`; the groups whose queries read a bounded range)
    state_read        a request's pass this step, in a recurrent group (vLLM's Mamba manager in
                      "align" mode), finds the null block (or no block) where it resumes its state
                      (the block holding its last computed position) or where it leaves it (the
                      block holding its last position this step): a state block released before
                      the pass that copies from it (`StatePass`, `state_findings`)
    kv_events         with KV events on: the events the pool published so far, folded (one
                      `BlockStored` hash a block, one `BlockRemoved` a block, `AllBlocksCleared`
                      empties), do not count exactly the blocks its hash map names under each
                      hash (`LiveChecker.events`)

A connector beside vLLM's pool (an offloading tier) holds references of its own on the blocks
its copies in flight read or write: the view lists them (`pinned`), and they count with the
tables'. vLLM 0.34 frees a block whose content another tier now holds to the queue's front
(`evict_first`): a cached block the checker saw a store read, out of every table, and still
under the key it was stored with, may sit anywhere in the queue. The same checks run on the
offloading tier's own pool (no tables; only the connector's references): `Finding.pool` says
which.

Each finding names its check, the request and the block. A deliberately broken pool fails each
(`tests/integrations/test_live_checker.py` on views; `devtools/vllm/checker_teeth.py` on vLLM).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvsched.spec.errors import KvschedError
from kvsched.spec.kv_events import Entry, KvEvent, fold_counted
from kvsched.spec.kv_layout import Group, first_read

GHOSTS_KEPT = 65_536  # ghosts kept beyond twice the map's size before those of evicted keys go
CHECKS = (
    "refcount",
    "free_in_table",
    "free_queue",
    "free_order",
    "cache_map",
    "ghost_content",
    "salt",
    "finished_leftover",
    "stale_key",
    "copy_in_flight",
    "window_read",
    "state_read",
    "kv_events",
)


@dataclass(frozen=True, slots=True)
class Finding:
    """One divergence: which check, the request and block it concerns (None where none), what."""

    check: str
    request_id: str | None
    block_id: int | None
    detail: str
    pool: str = "device"

    def __str__(self) -> str:
        where = ", ".join(
            part
            for part in (
                "" if self.request_id is None else f"request {self.request_id}",
                "" if self.block_id is None else f"block {self.block_id}",
            )
            if part
        )
        check = self.check if self.pool == "device" else f"{self.check}, {self.pool} pool"
        return f"[{check}] {where}: {self.detail}" if where else f"[{check}] {self.detail}"


class LiveFinding(KvschedError):
    """The live checker found a divergence (raised when it is told to raise)."""

    def __init__(self, findings: Sequence[Finding]) -> None:
        self.findings = tuple(findings)
        first = self.findings[0]
        more = f" (and {len(self.findings) - 1} more)" if len(self.findings) > 1 else ""
        super().__init__(f"{first}{more}")


@dataclass(frozen=True, slots=True)
class Held:
    """One request's blocks in one cache group: its table, how many of its first blocks are
    cached, the key of each of its full blocks (as the pool keys them), its tokens and salt;
    `masked` when its group may leave a cached block without a key (a sliding window's or a
    local chunk's blocks that no later prefix hit can use: vLLM's `reachable_block_mask`)."""

    request_id: str
    group: int
    blocks: tuple[int, ...]
    cached: int
    keys: Sequence[bytes]
    tokens: Sequence[int]
    block_size: int
    salt: object = None
    masked: bool = False


@dataclass(frozen=True, slots=True)
class Pass:
    """One request's pass this step in one group whose queries read a bounded range (`group`: a
    `Window` or `Chunked` of `kvsched.spec.kv_layout`): its first query's position, the positions
    it computes (drafts included) and its table's blocks from the first one that query reads,
    through the last one it writes (fewer when the table is shorter), and the table's length;
    `start`, the position below which the request holds no KV of the group by design (vLLM's
    bounded replay after a prefix hit: the worker rebuilds the window from there and masks what
    lies below it)."""

    request_id: str
    group_id: int
    group: Group
    block_size: int
    position: int
    tokens: int
    blocks: Sequence[int]  # the table from block `first` on, through block `end - 1` at most
    length: int
    start: int = 0  # no query reads below it: vLLM's `replay_start` (a replayed window's KV is rebuilt from it)

    @property
    def first(self) -> int:
        """The first block the pass's first query reads (later queries read no earlier one)."""
        return max(first_read(self.group, self.position), self.start) // self.block_size

    @property
    def end(self) -> int:
        """The blocks the table needs: through the one holding the pass's last position."""
        return -(-(self.position + self.tokens) // self.block_size)


def window_findings(passes: Iterable[Pass], null_block: int) -> list[Finding]:
    """`window_read`: each pass finds a real block at every place its queries read or write."""
    findings = []
    for step in passes:
        if step.length < step.end:
            detail = f"group {step.group_id}: its table has {step.length} blocks, its pass writes block {step.end - 1}"
            findings.append(Finding("window_read", step.request_id, None, detail))
            continue
        for index, block in enumerate(step.blocks[: step.end - step.first], start=step.first):
            if block == null_block:
                detail = (
                    f"group {step.group_id}: its block {index} is the null block, yet the query at position"
                    f" {max(step.position, index * step.block_size)} reads it this step"
                )
                findings.append(Finding("window_read", step.request_id, block, detail))
                break
    return findings


@dataclass(frozen=True, slots=True)
class StatePass:
    """One request's pass this step in a recurrent group (`group_id`) whose states sit at block
    boundaries, one per block (vLLM's Mamba manager in "align" mode, no speculative blocks): the
    state after position q is kept in the block holding q, so the pass over `tokens` positions
    from `position` resumes the state in the block holding `position - 1` (none at position 0) and
    leaves its own in the block holding its last position. `blocks` maps those two indices of
    the request's table to their blocks (an index past the table's end is absent)."""

    request_id: str
    group_id: int
    block_size: int
    position: int
    tokens: int
    blocks: Mapping[int, int]

    @property
    def places(self) -> tuple[tuple[int, str], ...]:
        """(table index, what the pass does with the state there), the resumed one first."""
        last = self.position + self.tokens - 1
        leaves = (last // self.block_size, f"leaves its state after position {last} in it")
        if not self.position:
            return (leaves,)
        resumed = (self.position - 1) // self.block_size
        return ((resumed, f"resumes its state after position {self.position - 1} from it"), leaves)


def state_findings(passes: Iterable[StatePass], null_block: int) -> list[Finding]:
    """`state_read`: each pass finds a real block where it resumes its state and where it leaves it."""
    findings = []
    for step in passes:
        for index, what in step.places:
            block = step.blocks.get(index)
            if block is None or block == null_block:
                where = "past its table's end" if block is None else "the null block"
                detail = f"group {step.group_id}: its block {index} is {where}, yet its pass {what} this step"
                findings.append(Finding("state_read", step.request_id, block, detail))
                break
    return findings


class HashMap(Protocol):
    """A pool's hash map, read in place: key -> the blocks it names."""

    def holds(self, key: bytes, block: int) -> bool:
        """The map names `block` under `key`."""
        ...

    def pairs(self) -> int:
        """How many (key, block) pairs it holds."""
        ...

    def distinct(self) -> int:
        """How many keys it holds."""
        ...

    def names(self) -> Mapping[bytes, int] | None:
        """The map as key -> its block, when every key names one block; else None."""
        ...

    def entries(self) -> Iterable[tuple[bytes, Collection[int]]]:
        """Each key with the blocks it names."""
        ...


class Blocks(Protocol):
    """A pool read block by block: its null block and the keys each block carries."""

    @property
    def null_block(self) -> int: ...

    def carried(self, block: int) -> tuple[bytes, ...]:
        """Every key `block` carries."""
        ...


@dataclass(frozen=True, slots=True)
class PoolView:
    """A pool and its manager at one step, as read: each block's count (block id = index), the
    null block, the free queue head to tail as walked (a block twice shows twice), the count the
    queue keeps, each block's key (None: uncached) and the further keys a few blocks carry, the
    hash map, every live request's blocks, and the copies in flight: the references connectors
    hold on blocks (block -> how many), the blocks a store reads (their content leaves for another
    tier) and those a copy writes (they carry no key until it completes). The sequences and the
    map may be the pool's own, read in place."""

    ref_counts: Sequence[int]
    null_block: int
    free_queue: tuple[int, ...]
    free_count: int
    keys: Sequence[bytes | None]
    extra_keys: Mapping[int, Collection[bytes]]
    cache_map: HashMap
    held: tuple[Held, ...]
    pinned: Mapping[int, int] = field(default_factory=dict)
    storing: Collection[int] = ()
    writing: Collection[int] = ()

    def carried(self, block: int) -> tuple[bytes, ...]:
        """Every key `block` carries."""
        key = self.keys[block]
        extra = tuple(self.extra_keys.get(block, ()))
        return extra if key is None else (key, *extra)

    # -- the view as a `kvsched.integrations.vllm.live_delta.LivePool` (read block by block) ----

    def ref_count(self, block: int) -> int:
        return self.ref_counts[block]

    def key(self, block: int) -> bytes | None:
        return self.keys[block]

    def queue_links(self, block: int) -> tuple[int | None, int | None] | None:
        """None when `block` is not in the free queue; else the blocks before and after it there
        (None at an end)."""
        if block not in self.free_queue:
            return None
        at = self.free_queue.index(block)
        after = self.free_queue[at + 1] if at + 1 < len(self.free_queue) else None
        return (self.free_queue[at - 1] if at else None), after

    def groups(self) -> Iterator[tuple[int, Mapping[str, Sequence[object]], Mapping[str, int]]]:
        """Each cache group: its requests' tables and how many of each one's first blocks are cached."""
        for group in sorted({held.group for held in self.held}):
            mine = [held for held in self.held if held.group == group]
            yield (
                group,
                {held.request_id: held.blocks for held in mine},
                {held.request_id: held.cached for held in mine},
            )

    def block_of(self, entry: object) -> int:
        """The block id a table entry names."""
        assert isinstance(entry, int)
        return entry

    def held_by(self, request_id: str, group: int) -> Held:
        """`request_id`'s blocks in `group`, read whole."""
        return next(held for held in self.held if (held.request_id, held.group) == (request_id, group))

    def whole(self) -> PoolView:
        """The pool read whole: this view."""
        return self

    def published(self, key: bytes) -> Hashable:
        """A key as the pool's KV events name it."""
        return key


@dataclass(slots=True)
class LiveChecker:
    """The checks, run on each view in turn; see the module docstring."""

    ghosts: dict[bytes, tuple[tuple[int, ...], bytes | None, object]] = field(default_factory=dict)
    verified: dict[tuple[str, int], tuple[int, ...]] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    stored: dict[int, bytes] = field(default_factory=dict)  # block -> the key a store read it under
    published: Counter[Entry] = field(default_factory=Counter)  # the pool's KV events so far, folded

    def request_finished(self, request_id: str) -> None:
        """`request_id` finished: from the next view on, it must hold nothing."""
        self.finished.add(request_id)

    def request_added(self, request_id: str) -> None:
        """`request_id` is (again) a live request."""
        self.finished.discard(request_id)
        for key in [key for key in self.verified if key[0] == request_id]:
            del self.verified[key]

    def check(self, view: PoolView) -> list[Finding]:
        """Every finding on `view`."""
        if len(self.ghosts) > GHOSTS_KEPT + 2 * view.cache_map.pairs():
            self._forget_ghosts(view)
        counts = table_counts(view)
        self._remember_stores(view, counts)
        return [
            *_refcounts(view, counts),
            *_free_blocks(view, counts),
            *_order(view, self.stored),
            *_cache_map(view),
            *_written(view),
            *_stale(view),
            *self._content(view),
            *self._leftovers(view),
        ]

    def events(self, events: Iterable[KvEvent], cached: Counter[Entry]) -> list[Finding]:
        """The pool's KV events since the last call (`kvsched.spec.kv_events`, each key as
        `cached` names it) folded into all before them: a finding unless they count exactly
        `cached`, the blocks its hash map names under each key."""
        events = list(events)
        folded = fold_counted(self.published, events)
        self.published = cached
        return events_findings(folded, cached, events)

    def _remember_stores(self, view: PoolView, counts: list[int]) -> None:
        """The blocks a store read out of every table, while they keep that key and stay out of
        every table: the release may free them to the queue's front. (A block is in a table when
        more hold it than the copies do.)"""
        if not view.storing and not self.stored:
            return

        def in_table(block: int) -> bool:
            return counts[block] > view.pinned.get(block, 0)

        for block in view.storing:
            key = view.keys[block]
            if key is not None and not in_table(block):
                self.stored[block] = key
        for block in [block for block, key in self.stored.items() if view.keys[block] != key or in_table(block)]:
            del self.stored[block]

    def _forget_ghosts(self, view: PoolView) -> None:
        """Keep the ghosts of the keys the map still names (a long-running server sees keys
        without end): a key evicted and computed again is first seen again."""
        named = {key for key, _ in view.cache_map.entries()}
        self.ghosts = {key: ghost for key, ghost in self.ghosts.items() if key in named}

    def _content(self, view: PoolView) -> list[Finding]:
        findings = []
        for held in view.held:
            known = self.verified.get((held.request_id, held.group), ())
            start = min(len(known), len(held.blocks))
            if held.blocks[: len(known)] != known:  # its table changed under the blocks verified
                changed = (
                    index for index, (old, new) in enumerate(zip(known, held.blocks, strict=False)) if old != new
                )
                start = next(changed, start)
            for index in range(start, min(held.cached, len(held.blocks), len(held.keys))):
                finding = self.block_content(view, held, index)
                if finding is not None:
                    findings.append(finding)
                    break
            else:
                self.verified[held.request_id, held.group] = held.blocks[: min(held.cached, len(held.keys))]
        return findings

    def block_content(self, view: Blocks, held: Held, index: int) -> Finding | None:
        """`held`'s cached block `index` carries its tokens' key, and that key names the tokens,
        parent and salt it named when first seen; else the finding."""
        block, key = held.blocks[index], held.keys[index]
        if block == view.null_block:
            return None  # a skipped block (outside a sliding window): nothing to hold
        carried = view.carried(block)
        if key not in carried:
            if held.masked and not carried:
                return None  # counted as cached, left unkeyed: no later hit reads it
            return Finding(
                "ghost_content", held.request_id, block, f"its cached block {index} does not carry its tokens' key"
            )
        size = held.block_size
        tokens = tuple(held.tokens[index * size : (index + 1) * size])
        parent = held.keys[index - 1] if index else None
        ghost = self.ghosts.setdefault(key, (tokens, parent, held.salt))
        if ghost[:2] != (tokens, parent):
            return Finding(
                "ghost_content", held.request_id, block, f"key of block {index} named other tokens when first seen"
            )
        if ghost[2] != held.salt:
            return Finding(
                "salt", held.request_id, block, f"key of block {index} was first seen under salt {ghost[2]!r}"
            )
        return None

    def _leftovers(self, view: PoolView) -> list[Finding]:
        return [
            Finding("finished_leftover", held.request_id, held.blocks[0], f"holds {len(held.blocks)} blocks")
            for held in view.held
            if held.request_id in self.finished and held.blocks
        ]


def events_findings(folded: Counter[Entry] | None, cached: Counter[Entry], events: object = "") -> list[Finding]:
    """The `kv_events` finding, if any: the events folded (None: one removed a block no event
    stored) against `cached`, the blocks the hash map names under each key."""
    folded = None if folded is None else +folded
    if folded == cached:
        return []
    if folded is None:
        detail = f"the events {events!r:.300} remove a block no event stored"
    else:
        off = sorted(((folded - cached) + (cached - folded)).items(), key=repr)[:4]
        detail = f"the events fold to other blocks than the hash map names: {off}"
    return [Finding("kv_events", None, None, detail)]


def table_counts(view: PoolView) -> list[int]:
    """How many table entries and connectors' copies hold each block (the null block: its own
    count, unmaintained)."""
    counts = [0] * len(view.ref_counts)
    for held in view.held:
        for block in held.blocks:
            counts[block] += 1
    for block, pins in view.pinned.items():
        counts[block] += pins
    counts[view.null_block] = view.ref_counts[view.null_block]
    return counts


def _holder(view: PoolView, block: int) -> str | None:
    return next((held.request_id for held in view.held if block in held.blocks), None)


def _refcounts(view: PoolView, counts: list[int]) -> list[Finding]:
    if counts == list(view.ref_counts):
        return []
    return [
        Finding("refcount", _holder(view, block), block, f"counted {count}, held {held} times by tables and copies")
        for block, (count, held) in enumerate(zip(view.ref_counts, counts, strict=True))
        if count != held
    ]


def _free_blocks(view: PoolView, counts: list[int]) -> list[Finding]:
    findings = []
    seen: set[int] = set()
    for block in view.free_queue:
        if block in seen:
            findings.append(Finding("free_queue", None, block, "queued twice"))
        seen.add(block)
        if block == view.null_block:
            findings.append(Finding("free_queue", None, block, "the null block is queued"))
        elif counts[block] and _holder(view, block) is None:
            findings.append(Finding("copy_in_flight", None, block, "a copy in flight holds it, yet it is queued free"))
        elif counts[block]:
            findings.append(Finding("free_in_table", _holder(view, block), block, "is in the free queue"))
        elif view.ref_counts[block] != 0:
            findings.append(Finding("free_queue", None, block, f"queued with count {view.ref_counts[block]}"))
    if len(view.free_queue) != view.free_count:
        findings.append(
            Finding("free_queue", None, None, f"walks {len(view.free_queue)} blocks but counts {view.free_count}")
        )
    zeros = list(view.ref_counts).count(0) - (view.ref_counts[view.null_block] == 0)
    if findings or zeros != len(seen):  # the queue is not all the free blocks: name those missing
        findings += [
            Finding("free_queue", None, block, "counted 0 but not queued")
            for block, count in enumerate(view.ref_counts)
            if count == 0 and block != view.null_block and block not in seen
        ]
    return findings


def _cache_map(view: PoolView) -> list[Finding]:
    """Every key a block carries names it in the map, and the map holds no other pair."""
    names = view.cache_map.names()
    if names is not None and not view.extra_keys:  # the usual map, compared whole
        carried_by = dict(zip(view.keys, range(len(view.keys)), strict=True))
        carried_by.pop(None, None)
        if carried_by == names and len(carried_by) == len(view.keys) - list(view.keys).count(None):
            return []
    findings = []
    holds = view.cache_map.holds
    carried = 0
    for block, key in enumerate(view.keys):
        if key is not None:
            carried += 1
            if not holds(key, block):
                findings.append(_unnamed(block, key))
    for block, keys in view.extra_keys.items():
        for key in keys:
            carried += 1
            if not holds(key, block):
                findings.append(_unnamed(block, key))
    if carried == view.cache_map.pairs() and not findings:
        return findings
    for key, blocks in view.cache_map.entries():  # name the pairs no block carries
        for block in sorted(blocks):
            if not 0 <= block < len(view.keys) or key not in view.carried(block):
                detail = f"the map names it under a key it does not carry ({key.hex()[:16]})"
                findings.append(Finding("cache_map", None, block, detail))
    return findings


def _unnamed(block: int, key: bytes) -> Finding:
    return Finding("cache_map", None, block, f"carries a key the map does not name for it ({key.hex()[:16]})")


def _order(view: PoolView, stored: Mapping[int, bytes]) -> list[Finding]:
    """The release's order: freed blocks without a hash go to the front (reused first, newest
    first), cached ones to the back (reused last, oldest first), and allocation takes from the
    front, so the queue is its uncached blocks, then its cached ones; a block another tier
    stored may also have gone to the front (0.34's `evict_first`), so it may sit anywhere."""
    keys = [view.keys[block] for block in view.free_queue]
    kept_last = [key is not None and stored.get(block) != key for block, key in zip(view.free_queue, keys, strict=True)]
    first = kept_last.index(True) if True in kept_last else len(keys)
    behind = next((position for position in range(first, len(keys)) if keys[position] is None), None)
    if behind is None:
        return []
    return [Finding("free_order", None, view.free_queue[behind], "an uncached block is queued behind a cached one")]


def _stale(view: PoolView) -> list[Finding]:
    """A block a request is still writing holds none of the content a key names, unless it is its
    own tokens' key (the block filled, its count not yet caught up): it carries no other key."""
    findings = []
    for held in view.held:
        for index in range(held.cached, len(held.blocks)):
            block = held.blocks[index]
            carried = view.carried(block) if block != view.null_block else ()
            own = (held.keys[index],) if index < len(held.keys) else ()
            if carried and carried != own:
                detail = f"its block {index}, past its {held.cached} cached, carries a key"
                findings.append(Finding("stale_key", held.request_id, block, detail))
    return findings


def _written(view: PoolView) -> list[Finding]:
    """A block a copy in flight writes holds no content yet: it carries no key."""
    return [
        Finding("copy_in_flight", _holder(view, block), block, "a copy in flight writes it, yet it carries a key")
        for block in view.writing
        if view.carried(block)
    ]
