"""Which pool and store an object works with: bound once, any other refused.

A scheduler's tables and a store's entries hold references counted in one pool: handed another
pool, a finish would release pages that pool never retained for it. So a `RequestScheduler`
binds the pool and the prefix store it is constructed with, or else the first ones a call of it
succeeds with; a `PrefixKvStore` binds its pool the same way. Afterwards any
other object, or an object of the wrong kind, is refused with `InvalidArgument` before anything
changes. A binding is made only by a call that succeeds, so a refused call changes nothing,
its bindings included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kvsched.spec.errors import InvalidArgument

T = TypeVar("T")


@dataclass(slots=True)
class Binding(Generic[T]):
    """The one object of `kind` that `owner` works with, once bound."""

    kind: type[T]
    owner: str
    bound: T | None = None

    def check(self, name: str, value: object) -> T:
        """`value`, if it is a `kind` and the bound one (when there is one)."""
        if not isinstance(value, self.kind):
            raise InvalidArgument(f"{name} must be a {self.kind.__name__}, not {type(value).__name__}")
        if self.bound is not None and value is not self.bound:
            raise InvalidArgument(
                f"{name} is another {self.kind.__name__} than the one this {self.owner} is bound to: "
                f"a {self.owner} works with one"
            )
        return value

    def bind(self, value: T) -> None:
        """Bind `value` (a no-op once bound: `check` admitted only the bound one)."""
        self.bound = value


def bind_together(pools: Binding[Any], stores: Binding[Any], pool: object, store: object) -> None:
    """A scheduler's construction: check the pool and store it is given (either may be None) and
    that the store may work with that pool, then bind all three together."""
    bound_pool = None if pool is None else pools.check("pool", pool)
    bound_store = None if store is None else stores.check("prefixes", store)
    if bound_store is not None and bound_pool is not None:
        bound_store.check_pool(bound_pool)
    if bound_pool is not None:
        pools.bind(bound_pool)
    if bound_store is not None:
        stores.bind(bound_store)
        if bound_pool is not None:
            bound_store.bind_pool(bound_pool)
