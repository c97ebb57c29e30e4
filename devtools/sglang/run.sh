#!/usr/bin/env bash
# make sglang: SGLang 0.5.23's radix cache and token allocators under kvsched's safety harness.
#   1. the venv (setup.sh)
#   2. a campaign on each shipped adapter (kvsched check kvsched.testing.adapters.sglang:FACTORY,
#      and sglang_window:pure_swa_prefill_aware, the all-SWA radix cache: one sliding-window group;
#      sglang_hybrid:hybrid_swa, the hybrid cache: a full and a sliding-window group, a pool each;
#      sglang_mamba:hybrid_mamba, the hybrid cache: a full group and Mamba states in slots, and
#      hybrid_swa_mamba, all three kinds):
#      every program must pass (radix_events: the radix cache's KV events folded after every call,
#      and a publisher that stores a removed page again must fail; sglang_window:pure_swa, for a
#      model that is not prefill-aware, must fail: devtools/sglang/variants.py's FOUND); the counts of admissions, hits, appends, evictions and refusals
#      (not --strict: the allocator's get_cpu_copy, a host offload copy, reads as an undeclared
#      copy-on-write verb to the coverage warning)
#   3. each broken variant (devtools/sglang/variants.py): its pinned program and a campaign must
#      both fail with the check it names
#   3b. what the hybrid campaigns exercise in SGLang's code: slides, tombstones, evictions per pool,
#      snapshots resumed, copied and taken at release (hybrid_coverage.py)
#   4. each eviction policy's order and each allocator's free order as SGLang documents them (order.py)
#   5. SGLang's answers recorded again (record_traces.py): identical to the traces CI replays
#      (tests/testing/golden/sglang/)
# Usage: run.sh VENV WORK [EXAMPLES]     (results in WORK/results/)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$(realpath -m "${1:?usage: run.sh VENV WORK [EXAMPLES]}")"
work="$(realpath -m "${2:?usage: run.sh VENV WORK [EXAMPLES]}")"
examples="${3:-1000}"
py="$venv/bin/python"
results="$work/results"
started=$(date +%s)
step() { echo "== SGLang [$(( $(date +%s) - started )) s] $*" >&2; }

step "venv $venv"
bash "$here/setup.sh" "$venv"
mkdir -p "$results"
# SGLang's own memory-pool checks on at every call (the paged allocator's: unique indices on every
# allocation, no page freed twice, page-aligned requests): its code checks itself as the harness runs.
export PYTHONPATH="$root" PYTHONWARNINGS=ignore SGLANG_DEBUG_MEMORY_POOL=1
cd /  # nothing of the checkout but PYTHONPATH on sys.path
for adapter in sglang:radix_token:1 sglang:radix_paged:2 sglang:radix_paged:4 sglang:radix_events:2 \
  sglang:unified_token:1 sglang:unified_paged:2 sglang:unified_rust_token:1 sglang:unified_rust_paged:2 \
  sglang_window:pure_swa_prefill_aware:1 sglang_hybrid:hybrid_swa:1 sglang_mamba:hybrid_mamba:1 \
  sglang_mamba:hybrid_swa_mamba:1; do
  module="${adapter%%:*}" rest="${adapter#*:}"; factory="${rest%%:*}" size="${rest##*:}"
  step "campaign: kvsched check kvsched.testing.adapters.$module:$factory --page-size $size ($examples programs)"
  "$py" -m kvsched.cli check "kvsched.testing.adapters.$module:$factory" --page-size "$size" --examples "$examples" \
    --json "$results/$factory-$size.json" >&2
done
step "a KV event publisher that stores a page again after removing it (vLLM #49125's shape) must fail: KV events"
status=0; "$py" -m kvsched.cli check kvsched.testing.adapters.sglang:restored_events --page-size 2 --examples 300 >&2 || status=$?
[ "$status" -eq 1 ] || { echo "the restored publisher must fail with a counterexample (exit 1), got exit $status" >&2; exit 1; }
step "SGLang's all-SWA radix cache for a model that is not prefill-aware must fail: it caches slots its window freed"
status=0; "$py" -m kvsched.cli check kvsched.testing.adapters.sglang_window:pure_swa --page-size 1 --examples 300 >&2 || status=$?
[ "$status" -eq 1 ] || { echo "pure_swa must fail with a counterexample (exit 1), got exit $status" >&2; exit 1; }
step "broken variants: each pinned program and a campaign must fail with the variant's check"
"$py" -m devtools.sglang.variants --examples 300 --json "$results/variants.json"
step "what the hybrid campaigns exercise in SGLang's code (seeds 0-2)"
"$py" -m devtools.sglang.hybrid_coverage --json "$results/hybrid-coverage.json"
step "eviction order (lru, mru, fifo, filo, lfu) and free order (token and paged allocators) as SGLang documents them"
"$py" -m devtools.sglang.order >&2
step "SGLang's answers recorded again, against the traces CI replays"
"$py" -m devtools.sglang.record_traces "$results/traces"
for trace in "$root"/tests/testing/golden/sglang/*.json.gz; do
  cmp -s <(gunzip -c "$trace") <(gunzip -c "$results/traces/$(basename "$trace")") \
    || { echo "$(basename "$trace"): SGLang answered otherwise than recorded" >&2; exit 1; }
done
step "passed"
