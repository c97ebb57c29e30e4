"""The mutation tool over impl/: mutmut against the fast lockstep tests, reproducibly.

    python -m devtools.mutants_tool [--workdir DIR] [--max-children N] [--output PATH]
                                           [--extra-tests PATH ...] [MUTANT ...]

Too slow for CI (an hour or more on two cores); its result is committed in
`devtools/MUTATION.md`. The run works on a scratch copy of the committed tree (`git
archive HEAD`), prepared so mutmut can mutate impl:

- the `kvsched/{spec,impl,kernels,proofs}` symlinks become real folders (mutmut copies files,
  not links);
- the `@jit` lines of impl are dropped: mutmut cannot put its trampolines in decorated
  functions, and with `NUMBA_DISABLE_JIT=1` a kernel is its plain Python function anyway (impl
  promises identical results in both modes; tests/impl/test_nojit.py checks it);
- `[tool.mutmut]` selects `kvsched/impl/*` (bench.py aside) and the tests
  `tests/testing/test_machine.py::test_impl_in_lockstep_with_the_spec` and `tests/impl` (the
  memory and bench tests aside: they measure, they do not check behaviour);
- a `mutation` hypothesis profile: the `dev` sizes, a fixed seed (`--hypothesis-seed=0`), no
  shrinking (a kill needs the failure, not its minimal form) and no example database.

The summary (the commit mutated, counts per status, and every surviving mutant with its diff)
goes to `--output`. mutmut is run from this interpreter's scripts folder, so the venv need not
be activated.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

MUTMUT_CONFIG = """
[tool.mutmut]
source_paths = ["kvsched"]
only_mutate = ["kvsched/impl/*"]
do_not_mutate = ["kvsched/impl/bench.py"]
pytest_add_cli_args = ["-p", "no:cacheprovider", "--hypothesis-seed=0"]
pytest_add_cli_args_test_selection = [
    "tests/testing/test_machine.py::test_impl_in_lockstep_with_the_spec",
    "tests/impl",
    "--ignore=tests/impl/test_memory.py",
    "--ignore=tests/impl/test_bench.py",
]
"""

MUTATION_PROFILE = """from hypothesis import Phase as _Phase

settings.register_profile(
    "mutation",
    settings.get_profile("dev"),
    phases=[_Phase.explicit, _Phase.reuse, _Phase.generate],
    database=None,
)
"""

COMMIT_FILE = "MUTATED_COMMIT"  # in the workdir: the commit `prepare` archived

# mutmut's exit codes (mutmut/stats.py), folded into the statuses a report needs.
STATUS = {0: "survived", 1: "killed", 3: "killed", 5: "no tests", 33: "no tests", 34: "skipped", 36: "timeout"}
STATUS |= {-24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", -11: "crashed", -9: "crashed"}


def prepare(repository: Path, workdir: Path, extra_tests: tuple[str, ...] = ()) -> None:
    """A scratch copy of HEAD that mutmut can mutate (see the module docstring); `extra_tests`
    join the test selection."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=repository, capture_output=True, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repository, capture_output=True, text=True, check=True)
    (workdir / COMMIT_FILE).write_text(head.stdout)
    subprocess.run(["tar", "-x", "-C", str(workdir)], input=archive.stdout, check=True)
    for name in ("spec", "impl", "kernels", "proofs"):
        link = workdir / "kvsched" / name
        if link.is_symlink():
            link.unlink()
            shutil.move(str(workdir / name), str(link))
    for source in (workdir / "kvsched" / "impl").glob("*.py"):
        lines = source.read_text().splitlines(keepends=True)
        source.write_text("".join(line for line in lines if line.strip() != "@jit"))
    config = MUTMUT_CONFIG.replace(
        '    "tests/impl",\n', '    "tests/impl",\n' + "".join(f'    "{t}",\n' for t in extra_tests)
    )
    with (workdir / "pyproject.toml").open("a") as handle:
        handle.write(config)
    conftest = workdir / "tests" / "conftest.py"
    text = conftest.read_text()
    load = text.index("settings.load_profile(")  # register the profile before the conftest loads one
    conftest.write_text(text[:load] + MUTATION_PROFILE + text[load:])


def summarize(workdir: Path) -> tuple[Counter[str], list[str]]:
    """Counts per status and the surviving mutants, from mutmut's result files."""
    statuses: Counter[str] = Counter()
    survivors: list[str] = []
    for meta in sorted((workdir / "mutants").rglob("*.meta")):
        for name, code in json.loads(meta.read_text()).get("exit_code_by_key", {}).items():
            status = "not checked" if code is None else STATUS.get(code, "suspicious")
            statuses[status] += 1
            if status == "survived":
                survivors.append(name)
    return statuses, survivors


def kill_rate(statuses: Counter[str]) -> float | None:
    """Killed (a timeout counts: the tests noticed) over every mutant the tests ran."""
    killed = statuses["killed"] + statuses["timeout"]
    checked = killed + statuses["survived"]
    return round(killed / checked, 4) if checked else None


def mutmut_environment() -> dict[str, str]:
    """The environment mutmut runs in: this interpreter's scripts first on PATH (mutmut is found
    without an activated venv), kernels uncompiled, the `mutation` profile, CI unset."""
    environment = {**os.environ, "NUMBA_DISABLE_JIT": "1", "KVSCHED_PROFILE": "mutation"}
    environment["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), environment.get("PATH", "")])
    environment.pop("CI", None)
    return environment


def show(workdir: Path, name: str) -> str:
    """mutmut's diff of one mutant."""
    done = subprocess.run(
        ["mutmut", "show", name], cwd=workdir, env=mutmut_environment(), capture_output=True, text=True, check=False
    )
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    """Prepare the copy, run mutmut, write the summary; mutmut's exit status."""
    parser = argparse.ArgumentParser(prog="python -m devtools.mutants_tool", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kvsched-mutation"))
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--output", type=Path, default=Path("mutation.json"))
    parser.add_argument("--summarize-only", action="store_true", help="summarize an earlier run in --workdir")
    parser.add_argument("--extra-tests", action="append", default=[], help="one more test path (repeatable)")
    parser.add_argument("mutants", nargs="*", help="run only these mutants (names as mutmut prints them)")
    args = parser.parse_args(argv)
    repository = Path(
        subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    status = 0
    if not args.summarize_only:
        prepare(repository, args.workdir, tuple(args.extra_tests))
        command = ["mutmut", "run", "--max-children", str(args.max_children), *args.mutants]
        status = subprocess.run(command, cwd=args.workdir, env=mutmut_environment(), check=False).returncode
    statuses, survivors = summarize(args.workdir)
    commit = args.workdir / COMMIT_FILE
    summary = {
        "commit": commit.read_text().strip() if commit.exists() else None,  # the commit the run mutated
        "statuses": dict(statuses),
        "kill_rate": kill_rate(statuses),
        "survivors": {name: show(args.workdir, name) for name in survivors},
    }
    args.output.write_text(json.dumps(summary, indent=2))
    print(json.dumps({"statuses": summary["statuses"], "kill_rate": summary["kill_rate"]}, indent=2))
    return status


if __name__ == "__main__":
    sys.exit(main())
