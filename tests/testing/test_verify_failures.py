"""`kvsched verify --failures DIR`: a campaign's counterexample is stored, and every later run runs
the stored programs of each campaign first; a stored line is data, never code."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvsched.cli import main
from kvsched.spec import events as ev
from kvsched.testing.campaign import program_namespace
from kvsched.testing.failures import FailureStore
from kvsched.testing.variants import VARIANTS
from kvsched.testing.verify_failures import FOLDER, ProgramFinding, ProgramStore, parse_line, replay

FIFO = "pages reused first-in-first-out"
CAMPAIGN = f"spec variant: {FIFO}"
SPEC = "spec (invariants, atomicity, ghost reads)"


def verify(*arguments: str) -> list[str]:
    return ["verify", "--no-proofs", "--json", "-", *arguments]


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ProgramFinding]:
    """The broken variant's campaign, run once with a store: the store and what it kept."""
    store = tmp_path_factory.mktemp("failures")
    assert main(verify("--variant", FIFO, "--examples", "10", "--steps", "8", "--failures", str(store))) == 1
    ((_, finding),) = ProgramStore(store).findings(CAMPAIGN)
    return store, finding


def test_a_counterexample_is_stored_and_run_first(
    found: tuple[Path, ProgramFinding], capsys: pytest.CaptureFixture[str]
) -> None:
    store, finding = found
    assert finding.lines and finding.failure.startswith("CheckFailed: ")
    # another seed, one program: the stored one runs first, and the campaign searches nothing
    assert main(verify("--variant", FIFO, "--seed", "7", "--examples", "1", "--failures", str(store))) == 1
    captured = capsys.readouterr()
    (row,) = json.loads(captured.out)
    assert (row["machine"], row["examples"], row["outcome"]) == (CAMPAIGN, 0, "FAIL")
    assert "still fails; not searched" in captured.err
    assert len(list((store / FOLDER).glob("*.json"))) == 1  # stored once


def test_the_reproduction_printed_from_the_store_runs_and_fails(found: tuple[Path, ProgramFinding]) -> None:
    _, finding = found
    program = finding.program(f"factory, reference = VARIANTS[{FIFO!r}], None", finding.failure)
    namespace = {**program_namespace(), "VARIANTS": VARIANTS}
    with pytest.raises(Exception) as raised:
        exec(program, namespace)
        namespace["state"].teardown()
    assert f"{type(raised.value).__name__}: {raised.value}" == finding.failure


def test_the_replay_runs_every_line_to_the_last(found: tuple[Path, ProgramFinding]) -> None:
    _, finding = found
    assert replay(VARIANTS[FIFO], None, finding) == finding.failure
    assert replay(VARIANTS[FIFO], None, replace(finding, lines=())) is None
    calls = [line for line in finding.lines if not line.startswith(("state.teardown", "state.check_system"))]
    shorter = tuple(line for line in finding.lines if line != calls[-1])
    # without its last call the program fails elsewhere (at the teardown): a replay that skipped
    # the last line would not report the stored failure
    assert replay(VARIANTS[FIFO], None, replace(finding, lines=shorter)) != finding.failure


def test_a_stored_program_that_passes_now_is_said_and_the_campaign_searches(
    found: tuple[Path, ProgramFinding], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, finding = found
    ProgramStore(tmp_path).add(replace(finding, campaign=SPEC))  # the correct spec passes it
    assert main(verify("--examples", "2", "--steps", "5", "--failures", str(tmp_path))) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert [row["outcome"] for row in rows] == ["pass", "pass"] and all(row["examples"] >= 2 for row in rows)
    assert f"{SPEC}: 1 stored counterexample(s) pass now" in captured.err


def test_a_campaign_on_workers_runs_its_stored_program_first(
    found: tuple[Path, ProgramFinding], capsys: pytest.CaptureFixture[str]
) -> None:
    store, _ = found
    arguments = ("--variant", FIFO, "--examples", "1", "--workers", "1", "--failures", str(store))
    assert main(verify(*arguments)) == 1
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["examples"], row["outcome"]) == (0, "FAIL")


def test_the_check_commands_store_and_the_campaigns_share_a_directory(found: tuple[Path, ProgramFinding]) -> None:
    store, _ = found
    assert FailureStore(store).findings(CAMPAIGN, 2) == []  # its own files only, not verify's folder


ACCEPTED = [
    ("state.out_of_domain(event=Admit(request_id=1.5, prefix=None))", {"event": ev.Admit(1.5, None)}),
    ("state.decode_round(fault=Fault.NONE, short='items')", {"fault": ev.Fault.NONE, "short": "items"}),
    ("state.reclaim(pages=-1)", {"pages": -1}),
    ("state.teardown()", {}),
]


@pytest.mark.parametrize(("line", "arguments"), ACCEPTED)
def test_a_stored_line_calls_a_rule_with_values(line: str, arguments: dict[str, object]) -> None:
    assert parse_line(line) == (line[6 : line.index("(")], arguments)


@pytest.mark.parametrize(
    "line",
    [
        "__import__('os').system('true')",
        "state.__class__()",
        "state._rules()",
        "state.no_such_rule()",
        "state.reclaim(-1)",  # positional: not as hypothesis prints a rule
        "state.reclaim(page=1)",  # not its signature
        "state.reclaim(pages=open('x'))",
        "state.out_of_domain(event=Admit.__init__)",
        "state.decode_round(fault=Fault.NOPE, short='')",
        "state.out_of_domain(event=KvschedMachine(None, None))",
        "state.reclaim(pages=1); state.teardown()",
        "other.reclaim(pages=1)",
    ],
)
def test_a_stored_line_that_is_not_a_rule_with_values_is_refused(line: str) -> None:
    with pytest.raises(ValueError):
        parse_line(line)


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        json.dumps({"campaign": SPEC, "config": {}, "lines": ["state.__class__()"], "failure": ""}),
        json.dumps({"campaign": SPEC, "config": {"requests": True}, "lines": [], "failure": ""}),
        json.dumps({"campaign": SPEC, "config": {"pages": 3}, "lines": [], "failure": ""}),
        json.dumps({"campaign": SPEC, "config": {}, "lines": []}),
    ],
)
def test_a_file_that_is_not_a_stored_program_is_exit_2(
    content: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / FOLDER).mkdir()
    (tmp_path / FOLDER / "bad.json").write_text(content)
    assert main(verify("--examples", "1", "--failures", str(tmp_path))) == 2
    assert "bad.json: not a stored program" in capsys.readouterr().err


def test_a_store_that_cannot_be_made_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("")
    assert main(verify("--examples", "1", "--failures", str(tmp_path / "file"))) == 2
    assert "kvsched verify --failures:" in capsys.readouterr().err
