"""Spec and impl in lockstep over random operation sequences (see `tests.impl.lockstep`).

The machines are the main refinement check and cheap (a few ms per sequence), so they run five
times the loaded profile's example count; the profile still decides (dev, ci, deep).
"""

from __future__ import annotations

from hypothesis import settings

from tests.impl.lockstep import Lockstep, OwnershipAbuse

SCALED = settings(deadline=None, max_examples=5 * settings().max_examples)

TestLockstep = Lockstep.TestCase
TestLockstep.settings = SCALED

TestOwnershipAbuse = OwnershipAbuse.TestCase
TestOwnershipAbuse.settings = SCALED
