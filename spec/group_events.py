"""The KV groups' public operations as events (`kvsched.spec.kv_groups`).

Each event names one call and makes it (`perform`), so `kvsched.spec.step.apply` runs it on the
spec's `KvGroups`, impl's, or any object with the same API. Arguments are whatever a caller may
pass, in range or not: the groups must refuse what is wrong and change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LookupTokens:
    """`groups.lookup(tokens)`: the prefix every group can serve (a query)."""

    tokens: Any

    def perform(self, groups: Any) -> Any:
        return groups.lookup(self.tokens)


@dataclass(frozen=True, slots=True)
class AdmitTokens:
    """`groups.admit(request_id, tokens)`: a request, attached to the longest prefix found."""

    request_id: Any
    tokens: Any

    def perform(self, groups: Any) -> Any:
        return groups.admit(self.request_id, self.tokens)


@dataclass(frozen=True, slots=True)
class ForwardPass:
    """`groups.compute(request_id, count, drafts)`: a forward pass (what it read is returned)."""

    request_id: Any
    count: Any = 1
    drafts: Any = ()

    def perform(self, groups: Any) -> Any:
        return groups.compute(self.request_id, self.count, self.drafts)


@dataclass(frozen=True, slots=True)
class AcceptDrafts:
    """`groups.accept(request_id, accepted, token)`: drafts kept, the next token sampled."""

    request_id: Any
    accepted: Any
    token: Any

    def perform(self, groups: Any) -> Any:
        return groups.accept(self.request_id, self.accepted, self.token)


@dataclass(frozen=True, slots=True)
class Leave:
    """`groups.free(request_id)`: a finish, a cancel or a preemption."""

    request_id: Any

    def perform(self, groups: Any) -> Any:
        return groups.free(self.request_id)


GroupEvent = LookupTokens | AdmitTokens | ForwardPass | AcceptDrafts | Leave
GROUP_EVENTS: tuple[type[Any], ...] = GroupEvent.__args__
