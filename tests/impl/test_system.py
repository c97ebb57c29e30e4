"""`make_impl_system`: the bundle the stateful harness plugs in as its system under test."""

from __future__ import annotations

import numpy as np
import pytest

from kvsched import impl
from kvsched.abi import ITEM_DTYPE, OUTPUT_DTYPE
from kvsched.spec.errors import InvalidConfig
from kvsched.testing.checks import capture
from tests.impl.support import make_spec_system


@pytest.mark.parametrize(
    "sizes",
    [
        (0, 1, 1, 1, 1),
        (1, 0, 1, 1, 1),
        (1, 1, -1, 1, 1),
        (1, 1, 1, -1, 1),
        (1, 1, 1, 1, 0),
        (1, 1, 1, 1, 1, 0),
        (0, 0, -1, -1, 0),
    ],
)
def test_construction_refuses_what_the_spec_refuses(sizes: tuple[int, ...]) -> None:
    expected, actual = capture(lambda: make_spec_system(*sizes)), capture(lambda: impl.make_impl_system(*sizes))
    assert expected.error is InvalidConfig
    assert (actual.error, actual.message, actual.details) == (expected.error, expected.message, expected.details)


def test_standalone_tables_count_as_external_holders() -> None:
    system = impl.make_impl_system(2, 2, 4, 1, 1)
    held = system.pool.allocate()
    table = system.new_table(3)
    table.install_shared_prefix([held], system.pool)
    table.ensure_writable(2, system.pool)
    assert system.snapshot([held]).external == (0, 0, 1)
    assert system.check([held]) == ()
    assert system.check() == ("inv_refcount_equals_owners",)  # the test's own hold is missing


def test_scratch_constructors_give_the_round_dtypes() -> None:
    system = impl.make_impl_system(2, 2, 4, 1, 1)
    items, tables, outputs = system.new_item_scratch(3), system.new_table_scratch(6), system.new_output_scratch(3)
    assert (items.dtype, tables.dtype, outputs.dtype) == (ITEM_DTYPE, np.dtype(np.uint32), OUTPUT_DTYPE)
    assert (items.shape, tables.shape, outputs.shape) == ((3,), (6,), (3,))
    assert not (items.view(np.uint8).any() or tables.any() or outputs.view(np.uint8).any())
