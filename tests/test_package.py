"""The package boundary: the core needs only numpy, numba and xxhash, each command says which extra it
needs, and the wheel carries no project tooling, bug corpus, report or manifest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Run in a fresh interpreter where the optional dependencies and the checkout's tooling cannot be
# imported, as in an installation without extras.
BLOCKER = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Blocker())
"""


def _run(code: str, blocked: set[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = BLOCKER.format(blocked=sorted(blocked)) + code
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, cwd=tmp_path, timeout=300
    )


WITHOUT_EXTRAS = {"hypothesis", "z3", "crosshair", "devtools", "pytest"}


def test_the_core_imports_without_any_extra_and_the_kernels_without_impl(tmp_path: Path) -> None:
    done = _run(
        "import kvsched.spec, kvsched.abi, kvsched.kernels, kvsched.kernels.backend, kvsched.kernels.ops\n"
        "print([m for m in sys.modules if m.startswith('kvsched.impl')])\n"
        "import kvsched.impl, kvsched.cli\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'hypothesis', 'z3', 'crosshair', 'devtools'}))\n",
        WITHOUT_EXTRAS,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "[]"]


def test_help_works_without_extras(tmp_path: Path) -> None:
    done = _run("from kvsched.cli import main\nmain(['--help'])\n", WITHOUT_EXTRAS, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "kvsched verify" in done.stdout and "kvsched contracts" in done.stdout


@pytest.mark.parametrize(
    ("argv", "blocked", "extra"),
    [
        (["verify"], WITHOUT_EXTRAS, "verify"),
        (["verify", "--no-proofs"], WITHOUT_EXTRAS, "testing"),
        (["verify", "--examples", "1", "--steps", "1"], {"z3", "devtools"}, "verify"),  # never silently without proofs
        (["proofs"], WITHOUT_EXTRAS, "verify"),
        (["contracts"], WITHOUT_EXTRAS, "verify"),
        (["check", "devtools.cow_toy:correct"], WITHOUT_EXTRAS, "testing"),
        (["bench", "--quick", "--plot", "rounds.svg"], {"matplotlib"}, "bench"),
    ],
)
def test_a_command_without_its_extra_fails_naming_it(
    argv: list[str], blocked: set[str], extra: str, tmp_path: Path
) -> None:
    done = _run(f"from kvsched.cli import main\nsys.exit(main({argv!r}))\n", blocked, tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"pip install '.[{extra}]' in a kvsched checkout" in done.stderr
    assert not list(tmp_path.iterdir())  # and wrote nothing


def test_the_wheel_holds_the_package_and_no_tooling(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: setuptools would reuse a stale build/ in the checkout
    skipped = shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "docs")
    shutil.copytree(ROOT, source, symlinks=True, ignore=skipped)
    command = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q"]
    done = subprocess.run(
        [*command, "-w", str(tmp_path)], capture_output=True, text=True, check=False, timeout=300, cwd=source
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("kvsched-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("kvsched/abi.py", "kvsched/spec/scheduler.py", "kvsched/impl/scheduler.py", "kvsched/py.typed"):
        assert needed in names
    for needed in ("kvsched/kernels/ops.py", "kvsched/testing/machine.py", "kvsched/proofs/runner.py"):
        assert needed in names
    assert "kvsched/charts.py" in names  # --plot from an installed wheel, with the bench extra
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"dist/{wheel.name}[testing]" in readme  # the README's install line names this wheel
    leaked = [
        name
        for name in names
        if name.startswith(("devtools/", "tests/"))
        or name.endswith(("MANIFEST.json", "MUTATION.md"))
        or "mutant" in name
        or "broken_contracts" in name
    ]
    assert leaked == []


def test_the_wheel_lists_every_package() -> None:
    """Every folder of the package with an `__init__.py` is in pyproject's package list (a missing
    one installs without it, and only a non-editable install, such as `make vllm`'s, shows it)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    found = {
        ".".join(Path(folder).relative_to(ROOT).parts)
        for folder, _, files in os.walk(ROOT / "kvsched", followlinks=True)  # spec/, impl/, ... are links
        if "__init__.py" in files
    }
    assert found == listed
