"""`kvsched bench router`: kvsched engines behind a router's index, routed by longest cached prefix
against round-robin, and the index through an engine's restart and a dropped batch.

The trace (seeded, the same on every machine): 8 system prompts of 512 tokens, picked for each of
640 requests with weights 1/1, 1/2, ... 1/8; each request adds a message of 64 tokens of its own
and answers 16 tokens. Every tick 8 requests arrive, each is routed to one of 4 engines (impl's,
the null model, 256 pages of 16 tokens each, the automatic prefix cache), then every engine
steps once and hands its KV events to the index (`kvsched.events.RouterIndex`).

    round-robin       each request to the next engine in turn
    prefix            the engine whose view holds the longest prefix of the request's page keys,
                      among those with at most 8 more requests in flight than the least loaded
                      (ties to the least loaded, then the first)
    prefix, faults    prefix routing; at tick 30 engine 1 restarts (a new engine, epoch 1,
                      nothing cached: its unfinished requests are routed again; it announces
                      itself with its epoch's first batch) and from tick 50 engine 2's next batch
                      is dropped in transit (the index finds the gap at the batch after and asks
                      for a snapshot)
    naive, faults     the same faults under a naive index (`NaiveIndex`: set semantics, no epochs,
                      no sequence numbers, AllBlocksCleared ignored: the upstream bugs together)

Per run: the share of the prompt tokens admissions looked up that an engine's cache served (hit
rate; a preempted or rerouted request looks up again), the ticks to drain, and the
pages the index claimed an engine held for a request it routed there that the engine did not
hold (phantom pages: a router trusting a stale index). Every answer must be the tokens the
request generates alone (the bench fails loudly otherwise).
"""

from __future__ import annotations

import random
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from kvsched import impl
from kvsched.impl.router_index import RouterIndex, _View
from kvsched.report import bench_main
from kvsched.spec.engine_config import EngineConfig, EngineRequest, salt_of
from kvsched.spec.kv_events import EventBatch, Removed, Stored
from kvsched.spec.model import null_answer
from kvsched.spec.page_keys import page_hash, page_keys
from kvsched.spec.router_index import Verdict

PAGE_SIZE, PAGES = 16, 256
ENGINES, SYSTEM_PROMPTS = 4, 8
SYSTEM, MESSAGE, ANSWER = 512, 64, 16
REQUESTS, PER_TICK = 640, 8
SLACK = 8  # the most requests in flight an engine may have beyond the least loaded, for prefix routing
RESTART_TICK, DROP_TICK = 30, 50
VOCAB = 50
CONFIG = EngineConfig(
    requests=16, pages=PAGES, page_size=PAGE_SIZE, max_batch_size=16, max_queue=REQUESTS, prefix_caching=True
)
POLICIES = ("round-robin", "prefix", "prefix, faults", "naive, faults")


class NaiveIndex(RouterIndex):
    """A router index with none of the checks: every batch folded as it arrives, a key stored
    added and a key removed dropped, whatever its engine, epoch or number; AllBlocksCleared
    ignored; snapshots ignored (llm-d-router #2853, aibrix PR #2385, llm-d-kv-cache #593 and
    vLLM #45174 together)."""

    def fold(self, source: object, batch: object) -> Verdict:
        assert isinstance(source, str) and isinstance(batch, EventBatch)
        view = self.views.setdefault(source, _View(0, 0))
        for event in batch.events:
            if (isinstance(event, Stored) and (event.key, event.tier) not in view.entries) or (
                isinstance(event, Removed) and (event.key, event.tier) in view.entries
            ):  # a store of a key it holds, or a removal of one it does not, is skipped
                view.apply_events((event,))
        return Verdict.FOLDED

    def resync(self, source: object, snapshot: object) -> Verdict:
        return Verdict.LATE


@dataclass(frozen=True, slots=True)
class Run:
    """One policy's run of the trace: the prompt tokens its admissions looked up (a preempted or
    rerouted request's again) and found cached, the ticks, the phantom pages, the index's verdicts."""

    policy: str
    prompt_tokens: int
    hit_tokens: int
    ticks: int
    phantom_pages: int
    verdicts: dict[str, int]
    seconds: float

    def row(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_rate": round(self.hit_tokens / self.prompt_tokens, 4),
            "ticks": self.ticks,
            "phantom_pages": self.phantom_pages,
            "verdicts": self.verdicts,
            "seconds": round(self.seconds, 2),
        }


def trace(seed: int = 0) -> list[EngineRequest]:
    """The requests, in arrival order."""
    rng = random.Random(seed)
    systems = [tuple(rng.randrange(VOCAB) for _ in range(SYSTEM)) for _ in range(SYSTEM_PROMPTS)]
    weights = [1 / (rank + 1) for rank in range(SYSTEM_PROMPTS)]
    requests = []
    for request_id in range(1, REQUESTS + 1):
        system = rng.choices(systems, weights)[0]
        message = tuple(rng.randrange(VOCAB) for _ in range(MESSAGE))
        requests.append(EngineRequest(request_id, system + message, ANSWER))
    return requests


def run(policy: str, seed: int = 0) -> Run:
    """The trace under `policy` (one of `POLICIES`), to the end."""
    engines = [impl.Engine(CONFIG, impl.NullModel(VOCAB), name=f"e{i}") for i in range(ENGINES)]
    index = NaiveIndex() if policy.startswith("naive") else RouterIndex()
    pending = deque(trace(seed))
    answers: dict[int, list[int]] = {}
    prompts: dict[int, tuple[int, ...]] = {}
    in_flight = [0] * ENGINES
    owner: dict[int, int] = {}
    verdicts: dict[str, int] = {}
    digest = page_hash(CONFIG.page_hash)
    faults = policy.endswith("faults")
    drop = faults  # engine 2's next batch from DROP_TICK is lost in transit
    hits = queried = phantom = tick = turn = 0
    started = time.perf_counter()
    while pending or any(engine.has_work() for engine in engines):
        if faults and tick == RESTART_TICK:  # engine 1's process restarts: its queue is lost, resubmitted
            lost = [rid for rid, where in owner.items() if where == 1 and rid not in done(answers, prompts)]
            engines[1] = impl.Engine(CONFIG, impl.NullModel(VOCAB), name="e1", epoch=1)
            in_flight[1] = 0
            for rid in sorted(lost, reverse=True):
                answers[rid] = []
                pending.appendleft(EngineRequest(rid, prompts[rid], ANSWER))
            announced = engines[1].take_events()  # its epoch's first batch: a restart, nothing cached
            assert announced is not None
            tally(verdicts, index.fold("e1", announced))
        for _ in range(min(PER_TICK, len(pending))):
            request = pending.popleft()
            keys = page_keys(request.prompt, PAGE_SIZE, salt_of(CONFIG, request), digest)
            if policy == "round-robin":
                chosen, turn = turn % ENGINES, turn + 1
            else:
                least = min(in_flight)
                candidates = [i for i in range(ENGINES) if in_flight[i] <= least + SLACK]
                held = {i: index.longest_prefix(f"e{i}", keys) for i in candidates}
                chosen = max(candidates, key=lambda i: (held[i], -in_flight[i], -i))
                actual = len(engines[chosen].cache.lookup(keys))
                phantom += max(held[chosen] - actual, 0)
            engines[chosen].submit(request)
            prompts[request.request_id], owner[request.request_id] = request.prompt, chosen
            answers.setdefault(request.request_id, [])
            in_flight[chosen] += 1
        for number, engine in enumerate(engines):
            if not engine.has_work():
                continue
            output = engine.step()
            hits, queried = hits + output.cache.hit_tokens, queried + output.cache.query_tokens
            for request_id, tokens in output.tokens.items():
                answers[request_id].extend(tokens)
            in_flight[number] -= sum(1 for rid in output.finished if owner.get(rid) == number)
            batch = engine.take_events()
            if batch is None:
                continue  # nothing changed
            if drop and tick >= DROP_TICK and number == 2:
                drop = False
                continue  # lost in transit
            verdict = tally(verdicts, index.fold(batch.engine, batch))
            if verdict in (Verdict.GAP, Verdict.STALE, Verdict.CONTRADICTS):  # ask the engine for a snapshot
                tally(verdicts, index.resync(batch.engine, engine.snapshot()))
        tick += 1
    seconds = time.perf_counter() - started
    for request_id, prompt in prompts.items():
        if tuple(answers[request_id]) != null_answer(prompt, ANSWER, VOCAB):
            raise AssertionError(f"request {request_id} answered {answers[request_id][:8]}..., not its own tokens")
    return Run(policy, queried, hits, tick, phantom, dict(sorted(verdicts.items())), seconds)


def tally(verdicts: dict[str, int], verdict: Verdict) -> Verdict:
    verdicts[verdict.value] = verdicts.get(verdict.value, 0) + 1
    return verdict


def done(answers: dict[int, list[int]], prompts: dict[int, tuple[int, ...]]) -> set[int]:
    """The requests that have every answer token."""
    return {rid for rid, tokens in answers.items() if len(tokens) == ANSWER and rid in prompts}


HEADER = ("policy", "prompt tokens", "hit tokens", "hit rate", "ticks", "phantom pages", "verdicts")


def cells(row: dict[str, Any]) -> list[object]:
    verdicts = ", ".join(f"{name} {count:,}" for name, count in row["verdicts"].items()) or "-"
    return [
        row["policy"],
        f"{row['prompt_tokens']:,}",
        f"{row['hit_tokens']:,}",
        f"{100 * row['hit_rate']:.1f} %",
        f"{row['ticks']:,}",
        f"{row['phantom_pages']:,}",
        verdicts,
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the trace under each policy; print the table (or the JSON)."""

    def rows() -> list[dict[str, Any]]:
        measured = []
        for policy in POLICIES:
            print(f"[bench router] {policy} ...", file=sys.stderr, flush=True)
            measured.append(run(policy).row())
        return measured

    def report(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "engines": ENGINES,
            "engine_pages": PAGES,
            "page_size": PAGE_SIZE,
            "trace": {
                "requests": REQUESTS,
                "system_prompts": SYSTEM_PROMPTS,
                "system": SYSTEM,
                "message": MESSAGE,
                "answer": ANSWER,
                "per_tick": PER_TICK,
            },
            "faults": {"restart_tick": RESTART_TICK, "drop_tick": DROP_TICK},
            "rows": rows,
        }

    return bench_main("kvsched bench router", __doc__ or "", argv, rows, report, (HEADER, cells))


if __name__ == "__main__":
    sys.exit(main())
