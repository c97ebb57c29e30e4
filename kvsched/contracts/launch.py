"""Run CrossHair on one target, after running the target's pairs concretely.

    python -m kvsched.contracts.launch [--samples MODULE:PAIR ...] [--max-iterations N]
                                       [--cpu-limit S] -- <crosshair arguments>

CrossHair blocks side effects (file writes) from the moment it starts, and numba touches its
kernel cache when a kernel module is imported and writes it when a kernel is first compiled. So
the target modules are imported first; impl's system pairs call the compiled kernels
(numba's own code never sees a symbolic value: the ints have been concretized into arrays by
then). So before CrossHair starts, each named diff pair runs on its `SAMPLES`: that compiles (or
loads) every kernel the programs reach, and proves the pairs non-vacuous: both must return an
equal outcome that is not None. A sample that differs is a counterexample already (exit 1).

`--max-iterations N` caps CrossHair's search at N paths per condition (a diff pair's N are
split between its two call orders): CrossHair seeds its own random choices and z3's, so an
iteration-bounded search finds the same counterexamples on every machine, however loaded; its
command line has no such option, so the launcher adds it to the options CrossHair parses.
`--cpu-limit S` ends the process (SIGXCPU) once it has used S CPU seconds, a guard that a busy
machine cannot trip early. On exit the launcher prints the CPU seconds it used to stderr.
"""

from __future__ import annotations

import atexit
import importlib
import itertools
import resource
import sys
import time
from collections.abc import Sequence

CPU_REPORT = "launcher cpu seconds:"


def run_samples(pair: str) -> str | None:
    """Run `module:name`'s samples on `spec_name` and `impl_name`; a description of the first
    failure, or None."""
    module_name, name = pair.split(":")
    module = importlib.import_module(module_name)
    spec, impl = getattr(module, f"spec_{name}"), getattr(module, f"impl_{name}")
    for sample in module.SAMPLES[name]:
        expected, actual = spec(*sample), impl(*sample)
        if expected is None or actual is None:
            return f"{pair}: sample {sample} is outside the pairs' domain (vacuous)"
        if expected != actual:
            return f"{pair}: sample {sample}: spec returns {expected!r}, impl returns {actual!r}"
    return None


def main(argv: Sequence[str]) -> int:
    """Run the samples, then CrossHair (which exits the process with its own status)."""
    arguments = list(argv)
    split = arguments.index("--") if "--" in arguments else 0
    options, crosshair_arguments = arguments[:split], arguments[split + 1 :]
    values: dict[str, list[str]] = {}
    for flag, value in itertools.pairwise(options):
        values.setdefault(flag, []).append(value)
    pairs = values.get("--samples", [])
    if cpu_limit := values.get("--cpu-limit"):
        seconds = int(float(cpu_limit[-1])) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 10))
    atexit.register(lambda: print(f"{CPU_REPORT} {time.process_time():.2f}", file=sys.stderr))
    try:
        for qualname in crosshair_arguments:
            if qualname.startswith(("kvsched.", "devtools.")):  # a target, not an option
                importlib.import_module(qualname.rpartition(".")[0])  # numba's cache set-up writes files
        failures = [failure for pair in pairs if (failure := run_samples(pair)) is not None]
    except Exception as error:  # CrossHair's own convention: 2 is an error, never a counterexample
        print(f"could not load the target: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    if failures:
        print(f"counterexample (concrete sample): {failures[0]}")
        return 1
    import crosshair.main
    from crosshair.options import AnalysisOptionSet, option_set_from_dict

    if max_iterations := values.get("--max-iterations"):
        bound = AnalysisOptionSet(max_iterations=int(max_iterations[-1]))
        vars(crosshair.main)["option_set_from_dict"] = lambda source: option_set_from_dict(source).overlay(bound)
    crosshair.main.main(crosshair_arguments)
    return 0  # crosshair_main exits the process itself


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
