"""Hypothesis profiles: `ci` (loaded when CI is set) extends hypothesis' own; `deep` for `make deep`.

numba's on-disk cache (`cache=True`) is keyed by each function's own source file only: a cached
function keeps whatever it inlined from another file after that file changes (numba's documented
limit), so a test could pass on code that is no longer there. Tests therefore cache under a
folder named by a hash of every Python source in the checkout (unless NUMBA_CACHE_DIR is set):
any change to any source starts a fresh cache, and older folders are removed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE_ROOT = ROOT / ".numba-cache"


def _sources_digest() -> str:
    digest = hashlib.sha256()
    folders = [path for path in ROOT.iterdir() if path.is_dir() and not path.name.startswith(".")]
    for path in sorted(source for folder in folders for source in folder.rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


if "NUMBA_CACHE_DIR" not in os.environ:  # before anything imports numba
    current = CACHE_ROOT / _sources_digest()
    for stale in CACHE_ROOT.glob("*"):
        if stale != current:
            shutil.rmtree(stale, ignore_errors=True)
    os.environ["NUMBA_CACHE_DIR"] = str(current)

from hypothesis import HealthCheck, settings  # noqa: E402  (after the cache folder is chosen)

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
