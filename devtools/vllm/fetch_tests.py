"""vLLM's own `tests/v1/core`, from the sdist of the tested release, into a work folder.

Downloads `vllm-<release>.tar.gz` from PyPI (kept in the folder; its SHA-256 checked against
the one PyPI publishes), extracts the tests and the few test helpers they import, writes a
`pytest.ini` with vLLM's markers, and lays out an offline Hugging Face cache holding the
config-only models of `models/` (the tests build `ModelConfig`s of these names; no weights).

    python fetch_tests.py WORK [--release 0.32.0]     prints WORK/tests-<release>
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tarfile
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
INDEX = "https://pypi.org/simple/vllm/"
KEEP = (
    "tests/__init__.py",
    "tests/utils.py",
    "tests/v1/__init__.py",
    "tests/v1/core/",
    "tests/v1/kv_connector/unit/",
    # What the tests import or read beside them (each where the release has it): the root
    # conftest.py (its fixtures, `caplog_vllm` among them) and what it imports, the speculative
    # decoding helpers, the Rust client's prompt-hash vectors.
    "tests/conftest.py",
    "tests/ci_envs.py",
    "tests/models/__init__.py",
    "tests/models/utils.py",
    "tests/models/registry.py",
    "tests/v1/spec_decode/__init__.py",
    "tests/v1/spec_decode/utils.py",
    "rust/src/engine-core-client/src/tests/prompt_block_hash_vectors.json",
)
MARKERS = ("slow_test", "skip_global_cleanup", "core_model", "hybrid_model", "cpu_model", "cpu_test")
MARKERS_MORE = ("split", "distributed", "optional")


def sdist(work: Path, release: str) -> Path:
    name = f"vllm-{release}.tar.gz"
    target = work / name
    request = urllib.request.Request(INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        files = {entry["filename"]: entry for entry in json.load(answer)["files"]}
    entry = files[name]
    if not target.exists() or hashlib.sha256(target.read_bytes()).hexdigest() != entry["hashes"]["sha256"]:
        print(f"downloading {name}", file=sys.stderr, flush=True)
        with urllib.request.urlopen(entry["url"], timeout=300) as answer, open(target, "wb") as out:
            shutil.copyfileobj(answer, out)
    if hashlib.sha256(target.read_bytes()).hexdigest() != entry["hashes"]["sha256"]:
        raise SystemExit(f"{name}: SHA-256 does not match PyPI's")
    return target


def extract(archive: Path, into: Path, release: str) -> None:
    prefix = f"vllm-{release}/"
    if into.exists():
        shutil.rmtree(into)
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.name[len(prefix) :].startswith(KEEP)]
        for member in members:
            member.name = member.name[len(prefix) :]
        tar.extractall(into, members=members, filter="data")
    (into / "tests" / "v1" / "kv_connector" / "__init__.py").touch()
    (into / "pytest.ini").write_text("[pytest]\nmarkers =\n" + "".join(f"    {m}\n" for m in MARKERS + MARKERS_MORE))


def hub(models: Path, home: Path) -> None:
    """An offline Hugging Face cache (HF_HOME) of the config-only models under `models/`."""
    revision = "0" * 40
    for config in sorted(models.glob("*/*/config.json")):
        org, name = config.parent.parent.name, config.parent.name
        repo = home / "hub" / f"models--{org}--{name}"
        snapshot = repo / "snapshots" / revision
        snapshot.mkdir(parents=True, exist_ok=True)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
        shutil.copy(config, snapshot / "config.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--release", default="0.32.0")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    tests = args.work / f"tests-{args.release}"
    extract(sdist(args.work, args.release), tests, args.release)
    hub(HERE / "models", args.work / "hf")
    print(tests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
