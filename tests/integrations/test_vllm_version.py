"""The vLLM integration accepts only the release it is tested with, and says so clearly."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from kvsched.integrations.vllm import TESTED_VLLM, UnsupportedVllm, require_tested_vllm


def test_the_tested_release_and_its_cpu_build_are_accepted() -> None:
    assert require_tested_vllm(TESTED_VLLM) == TESTED_VLLM
    assert require_tested_vllm(f"{TESTED_VLLM}+cpu") == f"{TESTED_VLLM}+cpu"


@pytest.mark.parametrize("version", ["0.33.0", "0.31.2", "0.32.1", "0.32.0rc1"])
def test_another_release_is_refused_by_name(version: str) -> None:
    with pytest.raises(UnsupportedVllm, match=rf"tested with vLLM {TESTED_VLLM} only, and vLLM {version}"):
        require_tested_vllm(version)


def _import_pool_with(monkeypatch: pytest.MonkeyPatch, vllm: object, module: str = "block_pool") -> None:
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.delitem(sys.modules, f"kvsched.integrations.vllm.{module}", raising=False)
    importlib.import_module(f"kvsched.integrations.vllm.{module}")


def test_importing_the_pool_under_another_release_raises_before_touching_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    other = types.ModuleType("vllm")
    other.__version__ = "0.33.0"  # type: ignore[attr-defined]
    with pytest.raises(UnsupportedVllm, match=r"0\.33\.0 is installed"):
        _import_pool_with(monkeypatch, other)


@pytest.mark.parametrize("module", ["block_pool", "scheduler", "checker"])
def test_importing_the_pool_without_vllm_says_what_to_install(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    with pytest.raises(UnsupportedVllm, match=rf"needs vllm=={TESTED_VLLM}"):
        _import_pool_with(monkeypatch, None, module)
