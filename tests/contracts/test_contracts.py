"""The contract modules themselves, concretely (no CrossHair): every contract is satisfiable and
holds on random inputs that meet its precondition, and every diff pair agrees on its samples.
(The mutation run over impl/ includes this file: it drives impl's kernels through their failure
and undo paths, which a request's life never reaches.)"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from kvsched.contracts import gate
from kvsched.contracts.launch import run_samples
from tests.contracts.conditions import conditions as _conditions
from tests.contracts.conditions import function as _function

CHECK_TARGETS = [target for module in gate.CHECK_MODULES for target in gate.check_targets(module)]


def _draw(function: Callable[..., Any], rng: random.Random) -> dict[str, object]:
    values: dict[str, object] = {}
    for name, parameter in inspect.signature(function).parameters.items():
        annotation = str(parameter.annotation)
        values[name] = (
            rng.random() < 0.5 if annotation == "bool" else rng.choice(range(-1, 3 if rng.random() < 0.7 else 8))
        )
    return values


def _holds(conditions: Any, bindings: Mapping[str, object]) -> list[str]:
    return [post.expr_source for post in conditions.post if not post.evaluate(bindings)]


@pytest.mark.parametrize("target", CHECK_TARGETS, ids=lambda target: target.name.removeprefix("kvsched.contracts."))
def test_contract_holds_on_random_inputs(target: gate.Target) -> None:
    function = _function(target.qualnames[0])
    conditions = _conditions(function)
    assert len(conditions.post) == target.conditions == gate.count_conditions(function)
    rng, met = random.Random(0), 0
    for _ in range(20_000):
        arguments = _draw(function, rng)
        if not all(pre.evaluate(arguments) for pre in conditions.pre):
            continue
        met += 1
        failed = _holds(conditions, {**arguments, "__return__": function(**arguments)})
        assert not failed, f"{function.__name__}({arguments}) breaks {failed}"
        if met == (400 if "impl_kernels" in target.name else 60):  # kernels are cheap: cover their failure paths
            break
    assert met >= 10, f"only {met} of 20000 random inputs meet the precondition of {function.__name__}"


@pytest.mark.parametrize(
    "pair", [target.samples for module in gate.PAIR_MODULES for target in gate.pair_targets(module)]
)
def test_pairs_agree_on_their_samples(pair: str) -> None:
    assert run_samples(str(pair)) is None
