"""The table of vLLM names the integration touches, and the check that reads vLLM against it.

Without vLLM: the check runs over a small package written here, whose definitions match the
table given it or drift from it in each way the check must report (a name gone, a definition
moved, parameters changed, in the source or in what is imported), and `require_names` raises
`UnsupportedVllm` listing them. `make vllm` runs it over each tested release itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvsched.integrations import vllm as integration
from kvsched.integrations.vllm import UnsupportedVllm, names

SOURCE = """\
import os
from collections import OrderedDict as Queue


class Pool:
    size: int = 0

    def __init__(self, blocks, caching=True):
        self.blocks = blocks
        if caching:
            self.map = {}
        self.map = None

    def free(self, ordered, *args, evict_first=False, **kwargs):
        return None

    @property
    def count(self):
        return 0


def helper(key, group):
    return key
"""

FREE_PARAMS = "ordered args evict_first kwargs"
TABLE: dict[str, tuple[int, str | None]] = {
    "Queue": (2, None),
    "Pool": (5, None),
    "Pool.size": (6, None),
    "Pool.blocks": (9, None),
    "Pool.map": (11, None),
    "Pool.free": (14, FREE_PARAMS),
    "Pool.count": (18, None),
    "helper": (22, "key group"),
}


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "fakevllm"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "pool.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("fakevllm", "fakevllm.pool"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    return folder / "pool.py"


def use(monkeypatch: pytest.MonkeyPatch, table: dict[str, tuple[int, str | None]]) -> None:
    monkeypatch.setattr(names, "NAMES", {f"fakevllm.pool:{name}": {"9.9.9": seen} for name, seen in table.items()})


def test_a_matching_package_has_no_drift(package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, TABLE)
    assert names.check_names("9.9.9") == []
    assert names.check_names("1.0.0") == []  # a release the table has no entry for checks nothing


@pytest.mark.parametrize(
    ("name", "seen", "reported"),
    [
        ("Pool.free", (15, FREE_PARAMS), "Pool.free: defined at line 14, not 15"),
        ("Pool.free", (14, "ordered"), f"Pool.free: its definition takes ({FREE_PARAMS}), not (ordered)"),
        ("Pool.blocks", (10, None), "Pool.blocks: defined at line 9, not 10"),
        ("Pool.map", (12, None), "Pool.map: defined at line 11, not 12"),  # the first assignment
        ("Pool.gone", (3, None), "Pool.gone: not defined"),
        ("helper", (22, "key"), "helper: takes (key group) when imported, not (key)"),
        ("Queue", (1, None), "Queue: defined at line 2, not 1"),
        ("Pool.count", (18, ""), "Pool.count: its definition takes (None), not ()"),
    ],
)
def test_each_drift_is_reported(
    package: Path, monkeypatch: pytest.MonkeyPatch, name: str, seen: tuple[int, str | None], reported: str
) -> None:
    use(monkeypatch, {**TABLE, name: seen})
    drift = names.check_names("9.9.9")
    assert any(line == f"fakevllm.pool:{reported}" for line in drift), drift


def test_an_imported_callable_that_differs_from_its_source_is_reported(
    package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What is imported is checked too, not only the file: a definition replaced at import."""
    package.write_text(SOURCE + "\n\ndef _other(key):\n    return key\n\n\nhelper = _other\n")
    use(monkeypatch, TABLE)
    assert names.check_names("9.9.9") == ["fakevllm.pool:helper: takes (key) when imported, not (key group)"]


def test_require_names_lists_every_drift(package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, {**TABLE, "Pool.gone": (3, None), "helper": (21, "key group")})
    monkeypatch.setattr(names, "require_tested_vllm", lambda: "9.9.9+cpu")
    names.require_names.cache_clear()
    try:
        with pytest.raises(UnsupportedVllm, match=r"9\.9\.9 differs") as raised:
            names.require_names()
    finally:
        names.require_names.cache_clear()
    assert "Pool.gone: not defined" in str(raised.value) and "helper: defined at line 22, not 21" in str(raised.value)


def test_require_offload_names_checks_the_offload_table_alone(package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The offloading manager's names fail the adapter on vLLM's offloading manager, not the pool."""
    use(monkeypatch, TABLE)
    offload = {f"fakevllm.pool:{name}": {"9.9.9": seen} for name, seen in {**TABLE, "Pool.gone": (3, None)}.items()}
    monkeypatch.setattr(names, "OFFLOAD_NAMES", offload)
    monkeypatch.setattr(names, "require_tested_vllm", lambda: "9.9.9")
    monkeypatch.setitem(names.RELEASES, "9.9.9", names.RELEASES["0.34.0"])
    names.require_names.cache_clear()
    names.require_offload_names.cache_clear()
    try:
        with pytest.raises(UnsupportedVllm, match=r"Pool\.gone: not defined"):
            names.require_offload_names()
        names.require_names()  # the pool's table has no drift
    finally:
        names.require_names.cache_clear()
        names.require_offload_names.cache_clear()


def test_the_table_names_every_tested_release_and_nothing_else() -> None:
    assert names.RELEASE_ORDER == integration.TESTED_VLLM
    assert set(names.RELEASES) == set(integration.TESTED_VLLM)
    for name, seen in {**names.NAMES, **names.OFFLOAD_NAMES}.items():
        assert ":" in name and seen, name
        assert set(seen) <= set(integration.TESTED_VLLM), name
        assert all(line > 0 for line, _ in seen.values()), name


def test_the_releases_differ_where_the_integration_follows_them() -> None:
    old, middle, new = (names.RELEASES[release] for release in integration.TESTED_VLLM)
    assert old.null_block_counted and not middle.null_block_counted and not new.null_block_counted
    assert new.evict_first and new.weak_pool and new.map_of_ids and not (middle.evict_first or old.evict_first)
    assert "evict_first" in str(names.NAMES["vllm.v1.core.block_pool:BlockPool.free_blocks"]["0.34.0"][1])
    assert "evict_first" not in str(names.NAMES["vllm.v1.core.block_pool:BlockPool.free_blocks"]["0.33.0"][1])
    assert "0.34.0" not in names.NAMES["vllm.v1.core.kv_cache_utils:KVCacheBlock._block_hash"]
