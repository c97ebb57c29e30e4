"""`kvsched bench thrash` on a short trace: the counts it reports are what the engine did."""

from __future__ import annotations

from kvsched.impl.thrash_bench import cells, run, trace


def test_the_default_policy_recomputes_less_than_first_chunk_admission() -> None:
    requests = trace(requests=30)
    whole, first = run(200, "whole_prompt", requests), run(200, "first_chunk", requests)
    assert whole.needed == first.needed == sum(len(r.prompt) + r.max_new_tokens - 1 for r in requests)
    assert 1.0 <= whole.ratio < first.ratio  # preemption only ever adds work
    assert whole.preemptions < first.preemptions
    assert cells(whole.row())[:3] == [200, "whole_prompt", f"{whole.ratio:.3f}x"]


def test_the_trace_is_a_function_of_the_seed() -> None:
    assert trace(seed=3, requests=5) == trace(seed=3, requests=5) != trace(seed=4, requests=5)
