"""The safety harness on vLLM's CPU offloading manager (`kvsched.testing.adapters.vllm_offload`):
the reference adapter passes, and each broken host tier or connector save, the shape of a shipped
bug, is caught by the check named on its pinned program.

    never_registers   `complete_store` never makes a stored chunk loadable: its key is never
                      registered, every host lookup misses (vLLM #53498) -> INVARIANT (the host
                      page a demotion took is neither free nor holds the key)
    loads_sorted      `prepare_load` names the chunks in chunk order, not in the keys' order: a
                      promotion restores another block's KV (TRT-LLM #8813) -> GHOST
    save_without_hold a connector's save notes the blocks it will read but takes no reference:
                      its request finishes, another takes the blocks, the save reads that
                      request's KV (DingoCache PR #76, SGLang #24527) -> GHOST
    commit_trusts_lookup
                      a commit pins the device blocks its lookup named without asking the pool
                      again; one was evicted and reused in between (vLLM #37076) -> GHOST
    evicted_freed_twice
                      an evicted chunk goes on the free list twice, so the host's free count is
                      one too many (TRT-LLM PR #12834's per-tier counters): the next store takes
                      the chunk again, and two keys name one chunk; the key stored first then
                      restores the other's KV -> GHOST (the view maps a host page to one key,
                      so the two keys show only when one is read)

Each pinned program passes on vLLM's own manager with the same host size. A search of
`--examples` programs must also find each broken manager (by whichever check fails first), and
the same search on the reference adapter must pass, with demotions and promotions seen.

    python offload_teeth.py [--examples N] [--json OUT]   (vLLM's venv; run from outside the checkout)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kvsched.testing import CheckFailed, SafetyMachine, search_safety
from kvsched.testing.outcome import FailureKind

Drive = Callable[[SafetyMachine], None]


def demote_evict_then_return(machine: SafetyMachine) -> None:
    """Two pages cached and demoted, evicted by a prompt as long as the pool, then asked for again."""
    machine.submit(1, (0, 0, 0, 0, 1))
    machine.finish(1)
    machine.demote()
    machine.submit(2, (2,) * 14)  # every block but the null one: the cached ones evicted
    machine.finish(2)
    machine.submit(3, (0, 0, 0, 0, 1))  # found in the host tier only


def demote_past_the_host(machine: SafetyMachine) -> None:
    """Two prompts' pages demoted, the second's into a host tier the first's fill (it evicts),
    both evicted from the device, then each asked for again."""
    machine.submit(1, (0, 0, 0, 0, 1))
    machine.finish(1)
    machine.demote()
    machine.submit(2, (1, 1, 1, 1, 0))
    machine.finish(2)
    machine.demote()
    machine.submit(3, (2,) * 14)  # every block but the null one: the cached ones evicted
    machine.finish(3)
    for request_id, prompt in ((4, (1, 1, 1, 1, 0)), (5, (0, 0, 0, 0, 1))):
        machine.submit(request_id, prompt)
        machine.finish(request_id)


def save_two_blocks(machine: SafetyMachine) -> None:
    """A connector's save of a request with two full blocks, ended; then the prompt again."""
    machine.submit(1, (0, 0, 0, 0, 1))
    lease = machine.lease(1)
    assert lease is not None
    machine.end_lease(lease)
    machine.finish(1)


def look_up_then_reuse_then_commit(machine: SafetyMachine) -> None:
    """A block a lookup found is evicted and reused for another prompt before the commit."""
    machine.submit(1, (0, 0, 0, 0, 1))
    machine.finish(1)  # two blocks cached, only the cache holds them
    machine.lookup(2, (0, 0, 0, 0, 1))  # finds them
    machine.submit(3, (2,) * 14)  # every block but the null one: they are evicted and rewritten
    machine.finish(3)
    machine.commit(2)


def save_then_finish_then_reuse(machine: SafetyMachine) -> None:
    """A connector's save holds a request's blocks; the request finishes; another takes blocks."""
    machine.submit(1, (0, 1, 2, 0, 1, 2))
    lease = machine.lease(1)
    machine.finish(1)
    machine.submit(2, (2,) * 14)  # every block but the null one: the saved ones too, if unheld
    assert lease is not None
    machine.end_lease(lease)


def saves_without_hold() -> Any:
    """The reference adapter whose connector's save notes the blocks it will read but takes no
    reference on them (DingoCache PR #76's shape): nothing keeps them from their next owner, and
    the store keeps whatever they then hold."""
    from kvsched.testing.adapters import vllm_offload

    class Unheld(vllm_offload.VllmOffloaded):
        unheld: dict[int, Any]

        def lease(self, request_id: int) -> int:
            number = super().lease(request_id)
            save = self.leases.pop(number)
            self.pool.free_blocks(reversed(save.blocks))  # the hold given back at once
            self.unheld = {**getattr(self, "unheld", {}), number: save}
            return number

        def end_lease(self, lease: int) -> list[tuple[int, int]]:
            self.leases[lease] = replace(self.unheld.pop(lease), blocks=[])
            return super().end_lease(lease)

    return Unheld


def stores_crossed() -> Any:
    """The reference adapter whose save copies its first two blocks each into the chunk the
    other's key was given (TRT-LLM #8813's shape, on the store side): a later load restores the
    other block's KV."""
    from kvsched.testing.adapters import vllm_offload

    class Crossed(vllm_offload.VllmOffloaded):
        def lease(self, request_id: int) -> int:
            number = super().lease(request_id)
            save = self.leases[number]
            if len(save.pairs) >= 2:
                (first, one), (second, other), *rest = save.pairs
                self.leases[number] = replace(save, pairs=[(first, other), (second, one), *rest])
            return number

    return Crossed


def commits_as_looked_up() -> Any:
    """The reference adapter whose commit pins the device blocks its lookup named, without asking
    the pool again (vLLM #37076's shape): a block evicted and reused between the two is attached."""
    from kvsched.testing.adapters import vllm_offload

    class Trusting(vllm_offload.VllmOffloaded):
        def commit(self, request_id: int, tokens: Any, found: Any) -> int | None:
            request = self.vllm.request_for(request_id, tokens, self.page_size)
            hits = [self.pool.blocks[block_id] for block_id in found.blocks]
            return self._admit(request_id, request, len(tokens), vllm_offload.Match(hits, []))

    return Trusting


@dataclass(frozen=True)
class Variant:
    """A broken host tier or connector: how it breaks vLLM's offloading manager (or the
    adapter's save), the program and the check that catches it."""

    bug: str
    breaks: Callable[[Any], Any]  # vLLM's CPUOffloadingManager class -> the broken subclass
    drive: Drive
    kind: FailureKind
    host_pages: int
    adapter: Callable[[], Any] | None = None  # a broken adapter class (the save, the commit); None: the reference


def never_registers(base: Any) -> Any:
    class NeverRegisters(base):  # type: ignore[misc]
        def complete_store(self, keys: Any, req_context: Any, success: bool = True) -> None:
            return None

    return NeverRegisters


def loads_sorted(base: Any) -> Any:
    class LoadsSorted(base):  # type: ignore[misc]
        def prepare_load(self, keys: Any, req_context: Any) -> Any:
            spec = super().prepare_load(keys, req_context)
            return type(spec)(sorted(int(chunk) for chunk in spec.block_ids))

    return LoadsSorted


def evicted_freed_twice(base: Any) -> Any:
    class EvictedFreedTwice(base):  # type: ignore[misc]
        def _free_chunk(self, chunk: Any) -> None:
            super()._free_chunk(chunk)
            super()._free_chunk(chunk)

    return EvictedFreedTwice


def unchanged(base: Any) -> Any:
    return base


VARIANTS: dict[str, Variant] = {
    "never_registers": Variant("vLLM #53498", never_registers, demote_evict_then_return, FailureKind.INVARIANT, 8),
    "loads_sorted": Variant("TRT-LLM #8813", loads_sorted, demote_evict_then_return, FailureKind.GHOST, 8),
    "evicted_freed_twice": Variant(
        "TRT-LLM PR #12834", evicted_freed_twice, demote_past_the_host, FailureKind.GHOST, 2
    ),
    "save_without_hold": Variant(
        "DingoCache PR #76", unchanged, save_then_finish_then_reuse, FailureKind.GHOST, 8, saves_without_hold
    ),
    "stores_crossed": Variant(
        "TRT-LLM #8813 (store side)", unchanged, save_two_blocks, FailureKind.INVARIANT, 8, stores_crossed
    ),
    "commit_trusts_lookup": Variant(
        "vLLM #37076", unchanged, look_up_then_reuse_then_commit, FailureKind.GHOST, 8, commits_as_looked_up
    ),
}


def factory(variant: Variant | None, host_pages: int) -> Callable[[int, int], Any]:
    """The reference adapter with `host_pages` chunks, its host tier broken by `variant`."""
    from kvsched.testing.adapters import vllm_offload

    def make(pages: int, page_size: int) -> Any:
        base = vllm_offload._offload().cpu.CPUOffloadingManager
        host_class = base if variant is None else variant.breaks(base)
        adapter_class = vllm_offload.VllmOffloaded if variant is None or variant.adapter is None else variant.adapter()
        return adapter_class(pages, page_size, host_pages=host_pages, host_class=host_class)

    return make


def caught(variant: Variant) -> str:
    """The variant's pinned program on vLLM's own manager (must pass) and on the broken one (must
    fail with the variant's kind); the failure's detail."""
    variant.drive(SafetyMachine(factory(None, variant.host_pages)))
    try:
        variant.drive(SafetyMachine(factory(variant, variant.host_pages)))
    except CheckFailed as failed:
        if failed.failure.kind is not variant.kind:
            raise SystemExit(
                f"caught by {failed.failure.kind.value}, not {variant.kind.value}: {failed.failure.detail}"
            ) from failed
        return failed.failure.detail
    raise SystemExit(f"{variant.bug}'s shape passed its pinned program")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=3000)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"variants": {}}
    for name, variant in VARIANTS.items():
        detail = caught(variant)
        found = search_safety(factory(variant, variant.host_pages), examples=args.examples, seed_value=2).failure
        if found is None:
            print(f"{name} ({variant.bug}): the search of {args.examples} programs did not find it", file=sys.stderr)
            return 1
        results["variants"][name] = {
            "bug": variant.bug,
            "kind": variant.kind.value,
            "detail": detail,
            "searched": found.kind.value,
        }
        print(f"{name} ({variant.bug}): caught by {variant.kind.value}: {detail}", file=sys.stderr)
        print(f"  and found by the search: {found.kind.value}: {found.detail[:160]}", file=sys.stderr)
    started = time.process_time()
    campaign = search_safety(factory(None, 8), examples=args.examples, seed_value=2)
    seconds = time.process_time() - started
    coverage = dict(campaign.coverage)
    print(
        f"campaign: {args.examples} programs, {seconds:.1f} s CPU, passed={campaign.passed}, {coverage}",
        file=sys.stderr,
    )
    if not campaign.passed:
        print(campaign.program, file=sys.stderr)
        return 1
    if not all(coverage[counter] for counter in ("demoted", "promoted", "committed", "saved")):
        print("the campaign never demoted, promoted, committed a lookup or saved", file=sys.stderr)
        return 1
    results["campaign"] = {"examples": args.examples, "cpu_seconds": round(seconds, 1), "coverage": coverage}
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
