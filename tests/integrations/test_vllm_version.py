"""The vLLM integration accepts only the releases it is tested with, and says so clearly."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from kvsched.integrations.vllm import TESTED_VLLM, UnsupportedVllm, require_tested_vllm


@pytest.mark.parametrize("release", ["0.32.0", "0.33.0", "0.34.0"])
def test_the_tested_releases_and_their_cpu_builds_are_accepted(release: str) -> None:
    assert release in TESTED_VLLM
    assert require_tested_vllm(release) == release
    assert require_tested_vllm(f"{release}+cpu") == f"{release}+cpu"


@pytest.mark.parametrize("version", ["0.31.0", "0.31.2", "0.32.1", "0.32.0rc1", "0.35.0", "0.34.0.dev1"])
def test_another_release_is_refused_by_name(version: str) -> None:
    with pytest.raises(UnsupportedVllm, match=rf"0\.32\.0, 0\.33\.0 and 0\.34\.0 only, and vLLM {version}"):
        require_tested_vllm(version)


def _import_pool_with(monkeypatch: pytest.MonkeyPatch, vllm: object, module: str = "block_pool") -> None:
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.delitem(sys.modules, f"kvsched.integrations.vllm.{module}", raising=False)
    importlib.import_module(f"kvsched.integrations.vllm.{module}")


def test_importing_the_pool_under_another_release_raises_before_touching_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    other = types.ModuleType("vllm")
    other.__version__ = "0.31.0"  # type: ignore[attr-defined]
    with pytest.raises(UnsupportedVllm, match=r"0\.31\.0 is installed"):
        _import_pool_with(monkeypatch, other)


@pytest.mark.parametrize("module", ["block_pool", "scheduler", "checker"])
def test_importing_the_pool_without_vllm_says_what_to_install(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    with pytest.raises(UnsupportedVllm, match=r"needs it: install vllm==0\.34\.0"):
        _import_pool_with(monkeypatch, None, module)
