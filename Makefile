# The front door: every check a contributor needs is one target.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST  := $(BIN)/python -m pytest
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: setup test lint verify demo deep bench gpu-check proofs contracts mutants clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

## The test suite (fast profiles: what CI runs), on every core.
test: setup
	$(PYTEST) -q -n auto

## ruff + mypy --strict over every package, tests included.
lint: setup
	$(BIN)/ruff check kvsched spec impl kernels proofs tests
	$(BIN)/ruff format --check kvsched spec impl kernels proofs tests
	$(BIN)/mypy -p kvsched
	$(BIN)/mypy tests

## The main job on its built-in default: the model-checking campaigns with a summary table.
demo: setup
	$(BIN)/kvsched verify

## Tests, contracts and proofs: the CI gate.
verify: test contracts proofs

## The CrossHair gate: every contract and twin pair (2 CPU s per condition, 4 per pair), then the
## broken corpus, where every target must yield a counterexample within its iteration bound.
contracts: setup
	$(BIN)/python -m kvsched.contracts
	$(BIN)/python -m kvsched.contracts --broken

proofs: setup
	$(BIN)/kvsched proofs

mutants: setup
	$(BIN)/kvsched mutants

## Deep campaigns and large proof bounds (tens of minutes).
deep: setup
	KVSCHED_PROFILE=deep $(PYTEST) -q tests/spec tests/impl
	$(BIN)/kvsched verify --profile deep --no-proofs
	$(BIN)/kvsched proofs --deep

bench: setup
	$(BIN)/kvsched bench --plot docs/bench-rounds.svg
	$(BIN)/kvsched bench decode --plot docs/bench-decode.svg

## On a machine with a GPU: the kernels natively, the ptxas report and the GPU bench.
gpu-check: setup
	bash tests/kernels/gpu_check.sh

clean:
	rm -rf $(VENV) build *.egg-info .hypothesis .mypy_cache .ruff_cache .pytest_cache
