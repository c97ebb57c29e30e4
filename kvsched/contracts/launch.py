"""Run CrossHair on one target, after running the target's twins concretely.

    python -m kvsched.contracts.launch [--samples MODULE:TWIN ...] -- <crosshair arguments>

CrossHair blocks side effects (file writes) from the moment it starts, and numba touches its
kernel cache when a kernel module is imported and writes it when a kernel is first compiled. So
the target modules are imported first; impl's system twins call the compiled kernels
(numba's own code never sees a symbolic value: the ints have been concretized into arrays by
then). So before CrossHair starts, each named twin pair runs on its `SAMPLES`: that compiles (or
loads) every kernel the programs reach, and proves the twins non-vacuous: both must return an
equal outcome that is not None. A sample that differs is a counterexample already (exit 1).
"""

from __future__ import annotations

import importlib
import itertools
import sys
from collections.abc import Sequence


def run_samples(twin: str) -> str | None:
    """Run `module:name`'s samples on `spec_name` and `impl_name`; a description of the first
    failure, or None."""
    module_name, name = twin.split(":")
    module = importlib.import_module(module_name)
    spec, impl = getattr(module, f"spec_{name}"), getattr(module, f"impl_{name}")
    for sample in module.SAMPLES[name]:
        expected, actual = spec(*sample), impl(*sample)
        if expected is None or actual is None:
            return f"{twin}: sample {sample} is outside the twins' domain (vacuous)"
        if expected != actual:
            return f"{twin}: sample {sample}: spec returns {expected!r}, impl returns {actual!r}"
    return None


def main(argv: Sequence[str]) -> int:
    """Run the samples, then CrossHair (which exits the process with its own status)."""
    arguments = list(argv)
    split = arguments.index("--") if "--" in arguments else 0
    options, crosshair_arguments = arguments[:split], arguments[split + 1 :]
    twins = [value for flag, value in itertools.pairwise(options) if flag == "--samples"]
    try:
        for qualname in crosshair_arguments:
            if qualname.startswith("kvsched."):
                importlib.import_module(qualname.rpartition(".")[0])  # numba's cache set-up writes files
        failures = [failure for twin in twins if (failure := run_samples(twin)) is not None]
    except Exception as error:  # CrossHair's own convention: 2 is an error, never a counterexample
        print(f"could not load the target: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    if failures:
        print(f"counterexample (concrete sample): {failures[0]}")
        return 1
    from crosshair.main import main as crosshair_main

    crosshair_main(crosshair_arguments)
    return 0  # crosshair_main exits the process itself


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
