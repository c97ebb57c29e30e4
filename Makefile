# The front door: every check a contributor needs is one target.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST  := $(BIN)/python -m pytest
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: help setup test lint docs verify demo deep bench gpu-check proofs contracts mutants vllm sglang ray clean

## This list (the default target).
help:
	@awk '/^## /{doc = substr($$0, 4)} /^[a-z-]+:/{split($$1, name, ":"); if (doc) printf "  %-10s %s\n", name[1], doc; doc = ""}' $(MAKEFILE_LIST)

## The .venv with the package and its dev extras.
setup: $(STAMP)

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	# nano-vllm's block manager, for the safety harness's shipped adapter: --no-deps, because the
	# distribution asks for torch, triton and transformers, which its block manager never imports.
	$(BIN)/python -m pip install -q --no-deps 'nano-vllm-fork==20260210'
	touch $(STAMP)

## kvsched inside vLLM, each release in its own venv (VLLM=0.32.0, 0.33.0 or 0.34.0; all three by default): its names, vLLM's tests/v1/core stock, over kvsched's pool and under the live checker, wrong reserves, greedy end to end (0.32.0's CPU build), traces, safety campaigns, W1/W2/W3 (devtools/vllm/run.sh).
VLLM ?= 0.32.0 0.33.0 0.34.0
VLLM_VENV ?= .venv-vllm-
VLLM_WORK ?= .vllm-work
vllm: setup  # the chart step draws with the project's own venv
	@for release in $(VLLM); do bash devtools/vllm/run.sh $(VLLM_VENV)$$release $(VLLM_WORK) $$release || exit 1; done

## SGLang 0.5.23's radix cache over its token and paged allocators under the safety harness, in its own venv: campaigns on each adapter, every broken variant caught, the traces CI replays recorded again (devtools/sglang/run.sh).
SGLANG_VENV ?= .venv-sglang
SGLANG_WORK ?= .sglang-work
sglang:
	bash devtools/sglang/run.sh $(SGLANG_VENV) $(SGLANG_WORK)

## kvsched check --ray and the distributed search on Ray: the Ray tests on a Ray cluster started here, in its own venv with kvsched[ray].
RAY_VENV ?= .venv-ray
ray:
	test -d $(RAY_VENV) || $(PY) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/python -m pip install -q -e '.[ray]' 'pytest>=8'
	$(RAY_VENV)/bin/python -m pytest -q -m ray tests/testing/test_check_workers.py tests/proofs/test_distributed.py tests/proofs/test_seen.py

## The test suite (fast profiles: what CI runs), on every core.
test: setup
	$(PYTEST) -q -n auto --dist worksteal

## ruff + mypy --strict over every package, tests included.
lint: setup
	$(BIN)/ruff check kvsched spec impl kernels proofs devtools tests
	$(BIN)/ruff format --check kvsched spec impl kernels proofs devtools tests
	$(BIN)/mypy -p kvsched
	$(BIN)/mypy -p devtools
	$(BIN)/mypy tests

## The main job on its built-in default: the model-checking campaigns with a summary table.
demo: setup
	$(BIN)/kvsched verify

## The documentation site, built strictly (a broken link, page or API reference fails) into site/.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict  # not --quiet: it hides the warnings --strict counts

## Tests, contracts, proofs, the impl mutant corpus and the engine variants' search: the CI gate.
verify: test contracts proofs mutants engine-search groups-search

## The engine machine finds every broken engine from scratch (KVSCHED_UPDATE_GOLDEN=1: re-pin).
engine-search: setup
	KVSCHED_ENGINE_SEARCH=1 $(PYTEST) -q tests/engine/test_variants.py -k finds

## The KV groups machine hunts the two upstream variants it takes longest to find (two minutes each).
groups-search: setup
	KVSCHED_GROUPS_SEARCH=1 $(PYTEST) -q -m proof tests/impl/test_kv_groups.py -k every_other

## The CrossHair gate on every contract and twin pair, then on the broken targets (each must fail).
contracts: setup
	$(BIN)/python -m kvsched.contracts
	$(BIN)/python -m kvsched.contracts --broken

# The exhaustive searches' workers (`kvsched.proofs.distributed`: the single process's states,
# counts and counterexamples; the CI profile's spec closure runs 1.9x faster on 2).
PROOF_WORKERS ?= 2

## The z3 proofs and the explorer; they record their bounds in proofs/MANIFEST.json (not under CI).
proofs: setup
	$(BIN)/kvsched proofs --workers $(PROOF_WORKERS) $(if $(CI),,--manifest proofs/MANIFEST.json)
	$(BIN)/python -m kvsched.proofs.engine_slots
	$(BIN)/python -m kvsched.proofs.cache_conservation
	$(BIN)/python -m kvsched.proofs.reserve_safety
	$(BIN)/python -m kvsched.proofs.tier_safety
	$(BIN)/python -m kvsched.proofs.index_fold
	$(BIN)/python -m kvsched.proofs.window_rules
	$(BIN)/python -m kvsched.proofs.group_safety
	$(BIN)/python -m kvsched.proofs.component_explorer
	$(PYTEST) -q -n auto --dist worksteal -m proof

## The harness on every impl mutant (project tooling: devtools/, not in the wheel).
mutants: setup
	$(BIN)/python -m devtools.mutants

## Deep campaigns and large proof bounds (tens of minutes).
deep: setup
	KVSCHED_PROFILE=deep $(PYTEST) -q tests/spec tests/impl
	$(BIN)/kvsched verify --profile deep --no-proofs
	$(BIN)/kvsched proofs --deep --manifest proofs/MANIFEST.json
	$(BIN)/python -m kvsched.proofs.engine_explorer --deep
	$(BIN)/python -m kvsched.proofs.component_explorer --deep

## The benchmarks (bookkeeping, decode kernels, engine step, kvsched check's defaults): JSON and charts in docs/bench/, then docs/benchmarks.md.
bench: setup
	$(BIN)/kvsched bench --json docs/bench/rounds.json --plot docs/bench/rounds.svg
	$(BIN)/kvsched bench decode --json docs/bench/decode.json --plot docs/bench/decode.svg
	$(BIN)/kvsched bench engine --json docs/bench/engine.json
	$(BIN)/kvsched bench thrash --json docs/bench/thrash.json
	$(BIN)/kvsched bench tiers --json docs/bench/tiers.json
	$(BIN)/kvsched bench router --json docs/bench/router.json
	$(BIN)/python -m devtools.check_defaults --json docs/bench/check-defaults.json
	$(BIN)/python -m kvsched.proofs.distributed --depth 6 --workers 1 2 --json docs/bench/distributed-search.json
	$(BIN)/python -m devtools.benchmarks_page

## On a machine with a GPU: the kernels natively, the ptxas report and the GPU bench.
gpu-check: setup
	PYTHON=$(BIN)/python bash tests/kernels/gpu_check.sh

## Remove the .venv and every cache.
clean:
	rm -rf $(VENV) build site *.egg-info .hypothesis .mypy_cache .ruff_cache .pytest_cache
