"""Fixtures for the impl tests: the spec and impl flavors of the API."""

from __future__ import annotations

import pytest

from tests.impl.support import Flavor, flavors


@pytest.fixture(params=flavors(), ids=lambda flavor: flavor.name)
def kv(request: pytest.FixtureRequest) -> Flavor:
    """The spec or impl flavor: every test using it pins the same behaviour on both."""
    flavor: Flavor = request.param
    return flavor
