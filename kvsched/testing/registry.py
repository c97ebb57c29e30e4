"""Every checked component of kvsched, registered once: the one place to read what is checked.

Each `Component` (`kvsched.testing.component`) lives in its own module of
`kvsched.testing.components`, which lists its events, each with the harnesses that drive it and,
for each that does not, why; its invariants; its own step checks, which the step checker
(`kvsched.testing.checks.check_step`) runs after the shared ones (typed errors, lockstep,
atomicity, read-only queries); and its corpora of broken variants, which the bug catalogue
lists. `tests/testing/test_registry.py` prints the event-by-harness matrix from what each
harness really drives and fails on a gap not explained.

    SYSTEM   the pool, prefix store and request scheduler (with an external holder of page
             references and standalone tables)
    ENGINE   the engine: the step loop over its own parts, with the automatic prefix cache
    RESERVE  the evictable reserve: the pool of an engine whose cache holds no reference
    MANAGER  a foreign page manager in safety mode, through its adapter's view
    TIERS    the tiered cache: device and host pages, copies in flight, leases, two-phase admission
    ROUTER_INDEX  the router's index: each engine's cached set folded from its KV events
    GROUPS   KV of more than one kind: full, sliding-window and chunked attention groups over one
             pool, recurrent states and their snapshots, speculative drafts

A new event touches its spec module (the event, whose `perform` makes its call) and its component's
module (its entry); a new component, its spec modules, its module here and `COMPONENTS`.
"""

from __future__ import annotations

from typing import Any

from kvsched.testing.component import Component
from kvsched.testing.components.engine import ENGINE
from kvsched.testing.components.groups import GROUPS
from kvsched.testing.components.manager import MANAGER
from kvsched.testing.components.reserve import RESERVE
from kvsched.testing.components.router_index import ROUTER_INDEX
from kvsched.testing.components.system import SYSTEM
from kvsched.testing.components.tiers import TIERS

__all__ = [
    "COMPONENTS",
    "ENGINE",
    "GROUPS",
    "MANAGER",
    "RESERVE",
    "ROUTER_INDEX",
    "SYSTEM",
    "TIERS",
    "component_of",
]

COMPONENTS: tuple[Component, ...] = (SYSTEM, ENGINE, RESERVE, MANAGER, TIERS, ROUTER_INDEX, GROUPS)

_BY_EVENT: dict[type[Any], Component] = {entry.event: c for c in COMPONENTS for entry in c.events}


def component_of(event: object) -> Component:
    """The registered component whose alphabet `event` belongs to."""
    component = _BY_EVENT.get(type(event))
    if component is None:
        raise KeyError(f"{type(event).__name__} is not a registered event")
    return component
