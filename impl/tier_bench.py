"""`kvsched bench tiers`: a multi-turn workload whose working set is about 4x the device pages, with
and without a host tier.

The trace (seeded, the same on every machine): 64 conversations, each opening with its own
context of 512 tokens; each of 4 turns resubmits the conversation so far (every earlier prompt
and answer) plus a new message of 128 tokens, and answers 32 tokens. A round submits every
conversation's next turn at once and runs to the end. The null model; page size 16; 1,152 device
pages (the last round's sequences hold about 4x that); every other setting `EngineConfig`'s
default, with the automatic prefix cache. impl's engine runs it with no host tier and with
4,608 host pages, and reports, per run: tokens served from device pages and from host pages,
tokens computed and recomputed (computed past the tokens no cache could have held: each
conversation's final sequence, once), the steps, the mean step time, and the pages copied
between the tiers per step, with their bytes for a KV page of a model the size of Llama 3 8B
(32 layers, 8 KV heads of 128, 16-bit, 16 tokens: 2 MiB). Every answer must be the tokens the
request generates alone (the bench fails loudly otherwise).
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass
from typing import Any

from kvsched import impl
from kvsched.report import bench_main
from kvsched.spec.engine_config import EngineConfig, EngineRequest
from kvsched.spec.model import null_answer

PAGE_SIZE = 16
CONVERSATIONS, TURNS = 64, 4
CONTEXT, MESSAGE, ANSWER = 512, 128, 32
DEVICE_PAGES = 1152
HOST_PAGES = (0, 4 * DEVICE_PAGES)
VOCAB = 50
PAGE_BYTES = 2 * 32 * 8 * 128 * 2 * PAGE_SIZE  # K and V, layers, KV heads, head dim, 16-bit, tokens


@dataclass(frozen=True, slots=True)
class Run:
    """One run of the trace: what came from where, what was computed, what it cost."""

    host_pages: int
    device_hit_tokens: int
    host_hit_tokens: int
    computed: int
    needed: int
    steps: int
    seconds: float
    copied_pages: int

    def row(self) -> dict[str, Any]:
        return {
            "host_pages": self.host_pages,
            "device_hit_tokens": self.device_hit_tokens,
            "host_hit_tokens": self.host_hit_tokens,
            "computed": self.computed,
            "needed": self.needed,
            "recomputed": self.computed - self.needed,
            "steps": self.steps,
            "step_ms": round(1e3 * self.seconds / self.steps, 3),
            "copied_pages_per_step": round(self.copied_pages / self.steps, 2),
            "copied_bytes_per_step": round(self.copied_pages * PAGE_BYTES / self.steps),
        }


def run(host_pages: int, seed: int = 0) -> Run:
    """The trace on impl's engine with `host_pages` host pages (0: none), to the end."""
    rng = random.Random(seed)
    config = EngineConfig(pages=DEVICE_PAGES, page_size=PAGE_SIZE, prefix_caching=True, host_pages=host_pages)
    engine = impl.Engine(config, impl.NullModel(VOCAB))
    histories = [tuple(rng.randrange(VOCAB) for _ in range(CONTEXT)) for _ in range(CONVERSATIONS)]
    device = host = computed = steps = copied = 0
    seconds = 0.0
    for turn in range(TURNS):
        prompts = {}
        for index, history in enumerate(histories):
            prompt = history + tuple(rng.randrange(VOCAB) for _ in range(MESSAGE))
            request_id = turn * CONVERSATIONS + index + 1
            prompts[request_id] = (index, prompt)
            engine.submit(EngineRequest(request_id, prompt, ANSWER))
        answers: dict[int, list[int]] = {request_id: [] for request_id in prompts}
        while engine.has_work():
            started = time.perf_counter()
            output = engine.step()
            seconds += time.perf_counter() - started
            steps += 1
            computed += output.tokens_run
            device += output.cache.hit_tokens
            host += output.host.hit_tokens
            copied += output.host.demoted + output.host.promoted
            for request_id, tokens in output.tokens.items():
                answers[request_id].extend(tokens)
        for request_id, (index, prompt) in prompts.items():
            if tuple(answers[request_id]) != null_answer(prompt, ANSWER, VOCAB):
                raise AssertionError(f"request {request_id} answered {answers[request_id][:8]}..., not its own tokens")
            histories[index] = prompt + tuple(answers[request_id])
    needed = sum(len(history) - 1 for history in histories)  # each final sequence once (its last token is never input)
    return Run(host_pages, device, host, computed, needed, steps, seconds, copied)


HEADER = (
    "host pages",
    "device hit tokens",
    "host hit tokens",
    "computed",
    "recomputed",
    "steps",
    "step (ms)",
    "pages copied/step",
    "MiB copied/step",
)


def cells(row: dict[str, Any]) -> list[object]:
    return [
        f"{row['host_pages']:,}",
        f"{row['device_hit_tokens']:,}",
        f"{row['host_hit_tokens']:,}",
        f"{row['computed']:,}",
        f"{row['recomputed']:,}",
        f"{row['steps']:,}",
        f"{row['step_ms']:.3f}",
        f"{row['copied_pages_per_step']:.2f}",
        f"{row['copied_bytes_per_step'] / 2**20:.1f}",
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the trace without and with the host tier; print the table (or the JSON)."""

    def rows() -> list[dict[str, Any]]:
        measured = []
        for host_pages in HOST_PAGES:
            print(
                f"[bench tiers] {DEVICE_PAGES} device pages, {host_pages} host pages ...", file=sys.stderr, flush=True
            )
            measured.append(run(host_pages).row())
        return measured

    def report(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "page_size": PAGE_SIZE,
            "device_pages": DEVICE_PAGES,
            "page_bytes": PAGE_BYTES,
            "trace": {"conversations": CONVERSATIONS, "turns": TURNS, "context": CONTEXT, "message": MESSAGE},
            "rows": rows,
        }

    return bench_main("kvsched bench tiers", __doc__ or "", argv, rows, report, (HEADER, cells))


if __name__ == "__main__":
    sys.exit(main())
