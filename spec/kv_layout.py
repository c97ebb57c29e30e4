"""The layout of a model's KV groups (`kvsched.spec.kv_groups`): the kinds of KV, the sizes they
share, what a buildable layout is, and which positions a query of each kind reads.

    Full(page_bytes)            full attention: a query reads every earlier position
    Window(tokens, page_bytes)  sliding window: the query at position i reads i - tokens + 1 .. i
    Chunked(tokens, page_bytes) chunked local attention: it reads from the start of its chunk
    Recurrent()                 a recurrent state per request (its own slots, not pages)

A layout that cannot be built is refused by `require_layout` with `InvalidConfig`: a window or
chunk that is not a whole number of pages, attention groups whose pages differ in size (one
pool holds them all), a recurrent group without state slots, a draft length past the tokens a
pass may compute. `first_read` and `first_kept` are the arithmetic `kvsched.proofs.window_rules`
proves at every size.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsched.spec import refusals
from kvsched.spec.batch import U32_MAX
from kvsched.spec.domain import require_size
from kvsched.spec.pool import MAX_PAGES

MAX_TOKENS = 1 << 16


@dataclass(frozen=True, slots=True)
class Full:
    """Full attention."""

    page_bytes: int = 1


@dataclass(frozen=True, slots=True)
class Window:
    """A sliding window of `tokens` positions, the query's own included."""

    tokens: int
    page_bytes: int = 1


@dataclass(frozen=True, slots=True)
class Chunked:
    """Chunked local attention: chunks of `tokens` positions, each query reading its own chunk."""

    tokens: int
    page_bytes: int = 1


@dataclass(frozen=True, slots=True)
class Recurrent:
    """A recurrent state per request."""


Group = Full | Window | Chunked | Recurrent
ATTENTION = (Full, Window, Chunked)


@dataclass(frozen=True, slots=True)
class Layout:
    """The groups and the sizes they share; `require_layout` says what a buildable one is."""

    groups: tuple[Group, ...]
    page_size: int = 1
    pages: int = 8
    state_slots: int = 0
    draft_tokens: int = 0
    step_tokens: int = 8
    max_tokens: int = 8
    prefix_caching: bool = True


def require_layout(layout: object) -> Layout:
    """`layout` if it can be built, else `InvalidConfig` naming what is wrong."""
    if not isinstance(layout, Layout):
        raise refusals.wrong_kind("layout", "a Layout", layout)
    groups = layout.groups
    if not isinstance(groups, tuple) or not groups or not all(isinstance(g, Group) for g in groups):
        raise refusals.bad_layout("groups must be a non-empty tuple of Full, Window, Chunked and Recurrent")
    page_size = require_size("page_size", layout.page_size, 1, MAX_TOKENS)
    require_size("pages", layout.pages, 2, MAX_PAGES)
    require_size("state_slots", layout.state_slots, 0, MAX_PAGES)
    require_size("draft_tokens", layout.draft_tokens, 0, MAX_TOKENS)
    require_size("step_tokens", layout.step_tokens, 1, MAX_TOKENS)
    require_size("max_tokens", layout.max_tokens, 1, MAX_TOKENS)
    if not isinstance(layout.prefix_caching, bool):
        raise refusals.bad_layout("prefix_caching must be a bool")
    for index, group in enumerate(groups):
        if isinstance(group, Window | Chunked):
            tokens = require_size(f"group {index}'s tokens", group.tokens, 1, MAX_TOKENS)
            if tokens % page_size:
                raise refusals.bad_layout(
                    f"group {index}'s {type(group).__name__.lower()} of {tokens} tokens is not a whole "
                    f"number of pages of {page_size}"
                )
        if isinstance(group, ATTENTION):
            require_size(f"group {index}'s page_bytes", group.page_bytes, 1, U32_MAX)
    sizes = sorted({g.page_bytes for g in groups if isinstance(g, ATTENTION)})
    if len(sizes) > 1:
        raise refusals.bad_layout(f"one pool holds pages of one size; the attention groups' pages are {sizes} bytes")
    if any(isinstance(g, Recurrent) for g in groups) and layout.state_slots == 0:
        raise refusals.bad_layout("a recurrent group needs state slots: state_slots is 0")
    if layout.draft_tokens + 1 > layout.step_tokens:
        raise refusals.bad_layout(
            f"a draft step computes its last token and {layout.draft_tokens} drafts, past the "
            f"{layout.step_tokens} tokens a step may compute"
        )
    return layout


def pages_for(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


def first_read(group: Group, position: int) -> int:
    """The first position the query at `position` reads."""
    if isinstance(group, Window):
        return max(0, position - group.tokens + 1)
    if isinstance(group, Chunked):
        return position // group.tokens * group.tokens
    return 0


def first_kept(group: Group, position: int, page_size: int) -> int:
    """The first page a request whose next query is at `position` keeps: the pages before it
    are wholly outside every query it will make (released)."""
    return first_read(group, position) // page_size
