"""z3 proofs of the KV groups' window arithmetic (`spec/kv_groups.py`), at every page size,
window, chunk and position.

A sliding window of W = k pages of p tokens: the query at position q reads positions
`first_read(q) = max(0, q - W + 1)` to q; chunked local attention of C = c pages reads from
`first_read(q) = q div C * C`. A request whose next query is at q keeps the pages from
`first_kept(q) = first_read(q) div p` on and releases those before. Proved (`unsat` of each
negation, z3's integers, no bound):

    released_never_read    a page released at q holds no position any query at q or later reads
    released_as_early      the first page kept holds a position the query at q reads (or q itself):
                           nothing is kept that could have been released
    hit_covers_its_reads   a prefix hit of m pages attaches pages first_kept(m p) .. m - 1, and
                           every position the query at m p reads (before it) lies in one of them
    pages_bounded          a window group holds at most k + 1 pages (its written ones, no drafts);
                           a chunked group at most c

Three broken forms are refuted with a counterexample: a window released one position early
(`first_read(q) = q - W + 2`), a window that treats its size in pages as tokens, and a hit that
attaches from the page after the first kept.
"""

from __future__ import annotations

from collections.abc import Callable

import z3

from kvsched.proofs.model import Int

RESOURCE_LIMIT = 10_000_000  # z3's counted resource units per check (never a wall-clock timeout)
Reads = Callable[[Int], Int]  # the first position a query at a position reads


def window(tokens: Int, *, early: bool = False) -> Reads:
    """A sliding window's `first_read` (`early`: released one position too soon)."""
    return lambda q: z3.If(q - tokens + (2 if early else 1) > 0, q - tokens + (2 if early else 1), 0)


def chunked(tokens: Int) -> Reads:
    return lambda q: q / tokens * tokens


def _sizes(ctx: z3.Context) -> tuple[Int, Int, Int, z3.BoolRef]:
    p, k = z3.Ints("page_size pages", ctx)
    return p, k, p * k, z3.And(p >= 1, k >= 1)


def decide(claim: z3.BoolRef) -> z3.CheckSatResult:
    """`check` of `claim` within `RESOURCE_LIMIT` units, in the claim's own context: each lemma
    builds its terms in a fresh `z3.Context`, so no earlier proof in the process changes its
    search (a nonlinear one may otherwise end `unknown`)."""
    solver = z3.Solver(ctx=claim.ctx)
    solver.set("rlimit", RESOURCE_LIMIT)
    solver.add(claim)
    return solver.check()


def released_never_read(
    first_read: Callable[[Int, Int], Reads], released: Callable[[Int, Int], Reads] | None = None
) -> z3.CheckSatResult:
    """No position a query reads lies in a page released before it (`released`: the rule the
    release follows, the reads' own by default)."""
    ctx = z3.Context()
    p, _k, size, ok = _sizes(ctx)
    q, later, x, page = z3.Ints("q later x page", ctx)
    reads = first_read(size, p)
    kept = (released or first_read)(size, p)(q) / p
    read_later = z3.And(later >= q, x >= reads(later), x <= later)
    in_released = z3.And(page >= 0, page < kept, x >= page * p, x < (page + 1) * p)
    return decide(z3.And(ok, q >= 0, read_later, in_released))


def released_as_early(first_read: Callable[[Int, Int], Reads]) -> z3.CheckSatResult:
    ctx = z3.Context()
    p, _k, size, ok = _sizes(ctx)
    q = z3.Int("q", ctx)
    reads = first_read(size, p)
    kept = reads(q) / p
    return decide(z3.And(ok, q >= 0, z3.Not(z3.And(kept * p <= reads(q), reads(q) < (kept + 1) * p))))


def hit_covers_its_reads(first_read: Callable[[Int, Int], Reads], skip: int = 0) -> z3.CheckSatResult:
    ctx = z3.Context()
    p, _k, size, ok = _sizes(ctx)
    m, x = z3.Ints("m x", ctx)
    length = m * p
    first = first_read(size, p)(length) / p + skip
    read = z3.And(x >= first_read(size, p)(length), x < length)
    outside = z3.Or(x / p < first, x / p >= m)
    return decide(z3.And(ok, m >= 1, read, outside))


def pages_bounded(first_read: Callable[[Int, Int], Reads], extra: int) -> z3.CheckSatResult:
    """At most k + `extra` pages from the first kept to the last written."""
    ctx = z3.Context()
    p, k, size, ok = _sizes(ctx)
    q = z3.Int("q", ctx)
    written = (q + p - 1) / p
    return decide(z3.And(ok, q >= 0, written - first_read(size, p)(q) / p > k + extra))


def _window(size: Int, p: Int) -> Reads:
    return window(size)


def _chunked(size: Int, p: Int) -> Reads:
    return chunked(size)


def _early(size: Int, p: Int) -> Reads:
    return window(size, early=True)


def _pages_as_tokens(size: Int, p: Int) -> Reads:
    return window(size / p)


def lemmas() -> dict[str, Callable[[], z3.CheckSatResult]]:
    """Each lemma for windows and chunks: `unsat` when it holds."""
    return {
        "window released_never_read": lambda: released_never_read(_window),
        "chunked released_never_read": lambda: released_never_read(_chunked),
        "window released_as_early": lambda: released_as_early(_window),
        "chunked released_as_early": lambda: released_as_early(_chunked),
        "window hit_covers_its_reads": lambda: hit_covers_its_reads(_window),
        "chunked hit_covers_its_reads": lambda: hit_covers_its_reads(_chunked),
        "window pages_bounded": lambda: pages_bounded(_window, 1),
        "chunked pages_bounded": lambda: pages_bounded(_chunked, 0),
    }


def broken() -> dict[str, Callable[[], z3.CheckSatResult]]:
    """The broken forms: `sat` (a counterexample) when refuted."""
    return {
        "window released one position early": lambda: released_never_read(_window, _early),
        "window size in pages read as tokens": lambda: released_never_read(_window, _pages_as_tokens),
        "hit attached from the page after the first kept": lambda: hit_covers_its_reads(_window, skip=1),
    }


def main() -> int:
    """Prove every lemma, refute every broken form; 0 when all is as it must be."""
    ok = True
    for name, lemma in lemmas().items():
        answer = lemma()
        ok &= answer == z3.unsat
        print(f"kv groups  {name:<48} {'proved' if answer == z3.unsat else f'NOT PROVED ({answer})'}")
    for name, form in broken().items():
        answer = form()
        ok &= answer == z3.sat
        print(f"kv groups  {name:<48} {'refuted' if answer == z3.sat else f'NOT REFUTED ({answer})'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
