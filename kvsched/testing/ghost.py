"""Ghost memory: what every physical page slot holds, and what every request should read.

The harness plays the engine's KV writes into this record: each written slot holds the token
history it was computed from (every token at positions 0..p, `None` where a token was counted
without a known write). A request's reads are right when every position it has written or
inherited maps, through its current page table, to a slot holding exactly its own history up
to that position. Hash checks miss stale hits; this check does not: a prefix page reused for
another prefix, a skipped copy-on-write or a page handed out twice all leave some request
reading a history that is not its own.

    position q  ->  page = table[q // page_size],  row = q % page_size
    pages[page][row] == history[: q + 1]
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvsched.spec.slots import SchedulerState, is_live

History = tuple[int | None, ...]


@dataclass(slots=True)
class GhostMemory:
    """Slot contents by physical page and row, and each live request's token history."""

    page_size: int
    pages: dict[int, dict[int, History]] = field(default_factory=dict)
    histories: dict[int, History] = field(default_factory=dict)

    def copy(self) -> GhostMemory:
        """An independent copy (to compare before and after a step)."""
        pages = {page: dict(rows) for page, rows in self.pages.items()}
        return GhostMemory(self.page_size, pages, dict(self.histories))

    def write(self, page: int, position: int, history: History) -> None:
        """The KV of `history[-1]` at `position`, computed after `history[:-1]`, lands in `page`."""
        self.pages.setdefault(page, {})[position % self.page_size] = history

    def copy_page(self, source: int, destination: int) -> None:
        """Copy-on-write: the destination gets every slot of the source."""
        self.pages[destination] = dict(self.pages.get(source, {}))

    def mismatches(self, scheduler: SchedulerState) -> list[str]:
        """Every position a live request would read wrongly, described."""
        problems = []
        for slot in scheduler.slots:
            if not is_live(slot):
                continue
            history = self.histories.get(slot.request_id, ())
            for position, token in enumerate(history):
                if token is None:
                    continue
                logical = position // self.page_size
                page = slot.table[logical] if logical < len(slot.table) else None
                expected = history[: position + 1]
                found = None if page is None else self.pages.get(page, {}).get(position % self.page_size)
                if found != expected:
                    problems.append(
                        f"request {slot.request_id} position {position} (page {page}) reads {found}, "
                        f"expected {expected}"
                    )
        return problems
