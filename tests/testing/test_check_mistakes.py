"""Every mistake in how `kvsched check` (and the other commands) is called or configured exits 2
with one line naming what to fix, before anything runs: never a traceback, never a verdict on the
manager (exit 1) for a mistake of the caller's, never a pass (exit 0) of a campaign that could
not check anything."""

from __future__ import annotations

from typing import Any, cast

import pytest

from devtools import cow_toy
from kvsched.cli import main
from kvsched.testing import search_safety
from kvsched.testing.safety import BadCapabilities, NotAnAdapter, view_shape_problem
from kvsched.testing.safety_search import BadSetting

HERE = "tests.testing.test_check_mistakes"


class Misspelt(cow_toy.CowAdapter):
    capabilities = frozenset({"fork", "copy_on_wrte"})


class HalfPair(cow_toy.CowAdapter):
    capabilities = frozenset({"fork", "lease"})


class Listed(cow_toy.CowAdapter):
    """Capabilities as a list: accepted, the same as the frozenset."""

    def __init__(self, pages: int, page_size: int) -> None:
        super().__init__(pages, page_size)
        self.capabilities = cast(Any, ["fork", "copy_on_write", "atomic"])


class Named(cow_toy.CowAdapter):
    capabilities: Any = "fork"


class DictView(cow_toy.CowAdapter):
    def view(self) -> Any:
        return {"holders": ()}


class ListFree(cow_toy.CowAdapter):
    def view(self) -> Any:
        view = super().view()
        return type(view)(view.holders, cast(Any, list(view.free)), view.tables)  # a list where a frozenset goes


def misspelt(pages: int, page_size: int) -> Misspelt:
    return Misspelt(pages, page_size)


def half_pair(pages: int, page_size: int) -> HalfPair:
    return HalfPair(pages, page_size)


def listed(pages: int, page_size: int) -> Listed:
    return Listed(pages, page_size)


def named(pages: int, page_size: int) -> Named:
    return Named(pages, page_size)


def dict_view(pages: int, page_size: int) -> DictView:
    return DictView(pages, page_size)


def list_free(pages: int, page_size: int) -> ListFree:
    return ListFree(pages, page_size)


def small_only(pages: int, page_size: int) -> cow_toy.CowAdapter:
    """A factory that refuses the campaign's largest pool."""
    if pages > 8:
        raise ValueError(f"at most 8 pages, not {pages}")
    return cow_toy.CowAdapter(pages, page_size)


def no_arguments() -> cow_toy.CowAdapter:
    return cow_toy.CowAdapter(4, 2)


CORRECT = "devtools.cow_toy:correct"


def status(arguments: list[str]) -> int:
    """`kvsched ARGUMENTS`'s exit status (a usage mistake exits through argparse, `CommandParser`)."""
    try:
        return main(arguments)
    except SystemExit as done:
        return int(done.code or 0)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([CORRECT, "--page-size", "0"], "--page-size must be an int from 1 to 256 (tokens per page), not 0"),
        ([CORRECT, "--page-size", "-1"], "--page-size must be an int from 1 to 256"),
        ([CORRECT, "--page-size", "257"], "--page-size must be an int from 1 to 256"),
        ([CORRECT, "--pages", "0"], "--pages must be an int from 1 to 4096 (pages per manager), not 0"),
        ([CORRECT, "--pages", "5000"], "--pages must be an int from 1 to 4096"),
        ([CORRECT, "--examples", "0"], "--examples must be an int at least 1 (programs to run), not 0"),
        ([CORRECT, "--steps", "0"], "--steps must be an int at least 1 (calls per program), not 0"),
        ([CORRECT, "--shrinks", "-1"], "--shrinks must be an int at least 0"),
        ([CORRECT, "--mode", "exact"], "--mode exact takes a SystemFactory, factory(config)"),
        ([CORRECT, "--mode", "exact", "--pages", "4", "--strict"], "--pages, --strict: safety mode only"),
        ([CORRECT, "--mode", "exact", "--examples", "0"], "--examples and --steps must be at least 1"),
        ([CORRECT, "--mode", "nope"], "argument --mode: invalid choice: 'nope'"),
        ([CORRECT, "--examples", "many"], "argument --examples: invalid int value: 'many'"),
        ([CORRECT, "--json", "/no/such/folder/out.json"], "--json /no/such/folder/out.json: no folder /no/such/folder"),
        ([CORRECT, "--json", "."], "--json . is a folder; name a file"),
        ([], "the following arguments are required: target"),
        ([f"{HERE}:misspelt"], "Misspelt declares unknown capabilities ['copy_on_wrte']; the harness knows ["),
        ([f"{HERE}:half_pair"], "HalfPair declares ['lease'] alone: capabilities ['end_lease', 'lease'] go together"),
        ([f"{HERE}:named"], "Named.capabilities must be a frozenset of capability names, not str 'fork'"),
        ([f"{HERE}:dict_view"], "DictView.view() returned dict, not a kvsched.testing.PoolView"),
        ([f"{HERE}:list_free"], "ListFree.view() returned a PoolView whose free is a list, not a frozenset"),
        ([f"{HERE}:small_only"], "factory(16, 2) raised ValueError: at most 8 pages, not 16 (the campaign builds"),
        ([f"{HERE}:no_arguments"], "factory(4, 2) raised TypeError"),
    ],
)
def test_each_mistake_exits_2_with_one_line_before_anything_runs(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert status(["check", *arguments]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1, err
    assert message in err
    assert "of 1000" not in err and not captured.out  # no campaign ran, no table printed


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["verify", "--examples", "-5", "--no-proofs"], "--examples and --steps must be at least 1 (0: the profile's)"),
        (["verify", "--no-proofs", "--json", "/no/such/folder/v.json"], "no folder /no/such/folder"),
        (["bench", "no-such-bench"], "kvsched bench: unrecognized arguments: no-such-bench (see kvsched bench --help)"),
        (["bench", "engine", "--requests", "0"], "kvsched bench engine: unrecognized arguments: --requests 0"),
        (["bench", "--spec-rounds", "0"], "--spec-rounds must be within 1.."),
        (["proofs", "--only", "nothing"], "argument --only: invalid choice: 'nothing'"),
    ],
)
def test_the_other_commands_mistakes_exit_2_with_one_line(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert status(arguments) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert message in err


def test_a_capabilities_list_is_read_as_the_set_it_names() -> None:
    result = search_safety(listed, examples=30)
    assert result.passed and result.coverage["forked"] > 0


@pytest.mark.parametrize(
    "settings",
    [{"examples": 0}, {"steps": -1}, {"pages": 0}, {"page_size": 0}, {"shrinks": -2}, {"examples": True}],
)
def test_search_safety_refuses_a_setting_out_of_range_before_it_builds_a_manager(settings: dict[str, Any]) -> None:
    built: list[int] = []

    def factory(pages: int, page_size: int) -> cow_toy.CowAdapter:
        built.append(pages)
        return cow_toy.CowAdapter(pages, page_size)

    with pytest.raises(BadSetting):
        search_safety(factory, **settings)
    assert built == []


def test_a_misspelt_capability_is_a_value_error_and_not_an_adapter() -> None:
    with pytest.raises(BadCapabilities) as raised:
        search_safety(misspelt)
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, NotAnAdapter)


def _view(**fields: Any) -> Any:
    view = cow_toy.CowAdapter(4, 2).view()
    values = {name: getattr(view, name) for name in type(view).__dataclass_fields__}
    return type(view)(**{**values, **fields})


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"holders": (0, 0, 0, "0")}, "holders is tuple"),
        ({"tables": {1: (0, None)}}, "table of request 1"),
        ({"cached": [(0, "k")]}, "cached is list"),
        ({"leased": {0: 1.0}}, "leased counts"),
        ({"host_pending": (0,)}, "host_pending is a tuple"),
    ],
)
def test_a_view_of_the_wrong_shape_is_named_by_its_field(fields: dict[str, Any], problem: str) -> None:
    found = view_shape_problem(_view(**fields))
    assert found is not None and problem in found
    assert view_shape_problem(_view()) is None


def test_a_view_that_goes_wrong_mid_campaign_is_a_finding_not_a_crash() -> None:
    """The first views are well formed; one with two requests is not: the manager's bug, a finding."""

    class LateDict(cow_toy.CowAdapter):
        def view(self) -> Any:
            return super().view() if len(self.blocks.tables) < 2 else {"tables": self.blocks.tables}

    result = search_safety(lambda pages, page_size: LateDict(pages, page_size), examples=20)
    assert result.failure is not None and "view() returned dict" in result.failure.detail
