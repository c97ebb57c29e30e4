"""Every broken engine is caught: each variant's pinned program (found once by the engine
machine, shrunk by hypothesis, or for a few by the engine explorer; kept in `golden/`) fails
with the variant's named check, with the spec beside it and (where its own checks can tell)
alone, and the same program passes every check on the correct impl engine. The search itself runs in `make verify`
(`KVSCHED_ENGINE_SEARCH=1`; with `KVSCHED_UPDATE_GOLDEN=1` it rewrites the programs).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from kvsched.spec import EngineRequest, PrefixIdentity
from kvsched.spec import events as ev
from kvsched.testing.bounded import bounded
from kvsched.testing.checks import CheckFailed, FailureKind
from kvsched.testing.engine_machine import SHAPES, EngineMachine, engine_machine, impl_engine, spec_engine
from kvsched.testing.engine_variants import ENGINE_VARIANTS, EngineVariant
from tests.engine.support import SEARCH

GOLDEN = Path(__file__).with_name("golden")
NAMESPACE: dict[str, Any] = {"EngineRequest": EngineRequest, "PrefixIdentity": PrefixIdentity}
exec("from kvsched.spec.events import *", NAMESPACE)


def replay(machine: EngineMachine, program: list[ev.Event]) -> FailureKind | None:
    """Run `program` on `machine`, then its teardown; the kind of the check that failed."""
    try:
        for event in program:
            machine.run(event)
        machine.teardown()
    except CheckFailed as failed:
        return failed.failure.kind
    return None


def read_program(path: Path) -> list[ev.Event]:
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return [eval(line, NAMESPACE) for line in lines]


def search(variant: EngineVariant, reference: Any) -> tuple[FailureKind, list[ev.Event]]:
    """Run the machine on the variant until a check fails (or the explorer, for a variant that
    names its bounds); the kind and the shrunk (or shortest) program."""
    if variant.explorer is not None:
        from kvsched.proofs import engine_explorer

        bounds = getattr(engine_explorer, variant.explorer)
        found = engine_explorer.EngineExplorer(bounds, variant.factory(), reference).run()
        assert found.violation is not None, f"the explorer's {variant.explorer} bounds miss {variant.name}"
        return found.violation.kind, found.path
    programs: list[list[ev.Event]] = []

    machine = engine_machine(factory=variant.factory(), reference=reference, config=SHAPES[variant.shape])

    class Recording(machine):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            programs.append([])

        def run(self, event: ev.Event) -> Any:
            programs[-1].append(event)
            return super().run(event)

    Recording.TestCase.settings = bounded(variant.examples, SEARCH.stateful_step_count)
    with pytest.raises(CheckFailed) as caught:
        Recording.TestCase().runTest()
    return caught.value.failure.kind, programs[-1]  # hypothesis replays the shrunk program last


def golden_path(variant: EngineVariant, alone: bool) -> Path:
    return GOLDEN / f"{variant.name}{'.alone' if alone else ''}.txt"


@pytest.mark.skipif(not os.environ.get("KVSCHED_ENGINE_SEARCH"), reason="the search runs in make verify")
@pytest.mark.parametrize("variant", ENGINE_VARIANTS, ids=lambda variant: variant.name)
def test_the_engine_machine_finds_every_variant(variant: EngineVariant) -> None:
    for alone, expected in ((False, variant.with_reference), (True, variant.alone)):
        if expected is None:
            continue
        kind, program = search(variant, None if alone else spec_engine)
        assert kind is expected, program
        if os.environ.get("KVSCHED_UPDATE_GOLDEN"):
            how = "alone" if alone else "with the spec"
            lines = [f"# {variant.sentence}", f"# caught by: {kind.name} ({how})", *map(repr, program)]
            golden_path(variant, alone).write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("variant", ENGINE_VARIANTS, ids=lambda variant: variant.name)
def test_every_variant_fails_its_pinned_program_by_the_named_check(variant: EngineVariant) -> None:
    for alone, expected in ((False, variant.with_reference), (True, variant.alone)):
        if expected is None:
            continue
        path = golden_path(variant, alone)
        assert path.exists(), f"no golden program {path.name}: run KVSCHED_ENGINE_SEARCH=1 KVSCHED_UPDATE_GOLDEN=1"
        program = read_program(path)
        config = variant.config()
        assert replay(EngineMachine(variant.factory(), None if alone else spec_engine, config), program) is expected
        assert replay(EngineMachine(impl_engine, spec_engine, config), program) is None  # the correct engine passes
