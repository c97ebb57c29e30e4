"""Spec and impl in lockstep over random operation sequences (see `tests.impl.lockstep`)."""

from __future__ import annotations

from hypothesis import settings

from tests.impl.lockstep import Lockstep, OwnershipAbuse

TestLockstep = Lockstep.TestCase
TestLockstep.settings = settings(deadline=None)

TestOwnershipAbuse = OwnershipAbuse.TestCase
TestOwnershipAbuse.settings = settings(deadline=None)
