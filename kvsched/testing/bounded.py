"""The one way kvsched's hypothesis searches are bounded: by examples and steps, never by time."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings


def bounded(examples: int, steps: int, *, shrink: bool = True, seeded: bool = False) -> settings:
    """A search of `examples` programs of up to `steps` steps, with no deadline and no database:
    its verdict never depends on the machine's speed or an earlier run. It is derandomized unless
    the caller `seeded` it (`hypothesis.seed`); without `shrink`, the first failing program is the
    verdict (shrinking a machine's program can take minutes); no phase explains a failure."""
    phases = [Phase.explicit, Phase.reuse, Phase.generate, *([Phase.shrink] if shrink else [])]
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        derandomize=not seeded,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        print_blob=False,
        phases=phases,
    )
