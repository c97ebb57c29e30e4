"""Whether a catalogue lists every entry of every corpus, each under exactly one bug."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from kvsched.testing.component import Corpus


def listed(bug: object, field: str) -> tuple[str, ...]:
    """The names a bug gives in the catalogue field `field` (one name, a tuple, or none)."""
    value = getattr(bug, field, None)
    if isinstance(value, tuple):
        return value
    return (value,) if isinstance(value, str) else ()


def listing_problems(bugs: Iterable[object], corpora: Iterable[Corpus]) -> list[str]:
    """What is wrong with the catalogue `bugs` against `corpora`: an entry no bug lists, a name no
    corpus has, or an entry listed twice."""
    bugs = tuple(bugs)
    problems: list[str] = []
    for corpus in corpora:
        names = Counter(name for bug in bugs for name in listed(bug, corpus.field))
        entries = set(corpus.names())
        where, field = corpus.where, corpus.field
        problems += [f"{field} {name!r} ({where}) is listed under no bug" for name in entries - set(names)]
        problems += [f"a bug lists {field} {name!r}, which {where} lacks" for name in set(names) - entries]
        problems += [f"{field} {name!r} is listed under {n} bugs" for name, n in names.items() if n > 1]
    return problems
