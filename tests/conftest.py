"""Hypothesis profiles: `ci` (loaded when CI is set) extends hypothesis' own; `deep` for `make deep`."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    settings.get_profile("ci"),
    max_examples=100,
    stateful_step_count=50,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev", max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "deep", max_examples=3000, stateful_step_count=80, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(os.environ.get("KVSCHED_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))
