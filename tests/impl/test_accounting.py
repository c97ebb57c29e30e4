"""A prefill chunk is one accounting step: `record_tokens(request, n)` is `record_token` n times,
in spec and impl alike, saturating at 2**32 - 1, and a bad count changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from kvsched.spec import InvalidArgument, UnknownRequest
from tests.impl.support import Flavor, flavors

FLAVORS = flavors()
IDS = [flavor.name for flavor in FLAVORS]


@pytest.mark.parametrize("flavor", FLAVORS, ids=IDS)
def test_a_chunk_counts_like_its_tokens_one_by_one(flavor: Flavor) -> None:
    chunked, single = flavor.system(2, 4, 4, 1, 1), flavor.system(2, 4, 4, 1, 1)
    for system in (chunked, single):
        system.scheduler.admit_with_prefix(1, None, system.store, system.pool)
    assert chunked.scheduler.record_tokens(1, 5) == 5
    assert chunked.scheduler.record_tokens(1, np.int64(0)) == 5
    for _ in range(5):
        single.scheduler.record_token(1)
    assert chunked.snapshot() == single.snapshot()


@pytest.mark.parametrize("flavor", FLAVORS, ids=IDS)
def test_a_chunk_saturates_and_bad_counts_change_nothing(flavor: Flavor) -> None:
    system = flavor.system(1, 1, 1, 1, 1)
    system.scheduler.admit_with_prefix(1, None, system.store, system.pool)
    assert system.scheduler.record_tokens(1, 2**32 - 2) == 2**32 - 2
    assert system.scheduler.record_tokens(1, 3) == 2**32 - 1
    before = system.snapshot()
    for bad in (-1, 2**32, 1.0, True, None):
        with pytest.raises(InvalidArgument):
            system.scheduler.record_tokens(1, bad)
    with pytest.raises(UnknownRequest):
        system.scheduler.record_tokens(2, -1)  # the request is checked before the count
    assert system.snapshot() == before
