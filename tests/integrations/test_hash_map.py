"""vLLM's hash map in both releases' shapes reads the same through `read_hash_map`: one map of
five (key, block) pairs, key "b" held by three blocks, written as 0.32/0.33 write it (a block, or
a dict of blocks by id) and as 0.34 writes it (an id, every id of "b" in `_dup_ids`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvsched.integrations.vllm.hash_map import read_hash_map


def block(block_id: int) -> SimpleNamespace:
    return SimpleNamespace(block_id=block_id)


OLD = SimpleNamespace(_cache={b"a": block(1), b"b": {2: block(2), 5: block(5), 7: block(7)}, b"c": block(3)})
NEW = SimpleNamespace(_cache={b"a": 1, b"b": 2, b"c": 3}, _dup_ids={b"b": {2: None, 5: None, 7: None}})


@pytest.mark.parametrize(("hash_map", "map_of_ids"), [(OLD, False), (NEW, True)], ids=["0.32", "0.34"])
def test_both_shapes_read_alike(hash_map: SimpleNamespace, map_of_ids: bool) -> None:
    view = read_hash_map(hash_map, map_of_ids)
    assert view.pairs() == 5
    assert {key: sorted(blocks) for key, blocks in view.entries()} == {b"a": [1], b"b": [2, 5, 7], b"c": [3]}
    assert view.holds(b"b", 7) and view.holds(b"a", 1) and not view.holds(b"a", 2) and not view.holds(b"z", 1)
    assert view.names() is None  # a key names several blocks


@pytest.mark.parametrize("map_of_ids", [False, True], ids=["0.32", "0.34"])
def test_one_block_per_key_names_each(map_of_ids: bool) -> None:
    hash_map = (
        SimpleNamespace(_cache={b"a": 1, b"c": 3}, _dup_ids={})
        if map_of_ids
        else SimpleNamespace(_cache={b"a": block(1), b"c": block(3)})
    )
    view = read_hash_map(hash_map, map_of_ids)
    assert view.names() == {b"a": 1, b"c": 3} and view.pairs() == 2
