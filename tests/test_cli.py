"""The `kvsched` command: the summary table, the exit code, and a runnable reproduction."""

from __future__ import annotations

import io

import pytest

from kvsched.cli import main
from kvsched.report import Progress


def test_verify_passes_and_prints_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--examples", "20", "--steps", "20", "--no-proofs"]) == 0
    out = capsys.readouterr().out
    assert "machine" in out and "invariants checked" in out
    assert "spec (invariants, atomicity, ghost reads)" in out
    assert "impl ⇄ spec lockstep" in out
    assert "FAIL" not in out


def test_verify_fails_on_a_broken_variant_with_a_runnable_reproduction(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["verify", "--variant", "pages reused first-in-first-out", "--examples", "2000", "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL" in out
    program = out.split("a runnable reproduction:\n", 1)[1]
    assert "state = KvschedMachine(factory, reference, config)" in program
    with pytest.raises(AssertionError, match="out of order"):
        exec(program, {})


def test_delegated_commands_get_their_options_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """`kvsched proofs --only inductive` and `kvsched bench tiers --plot PATH`: the command's own
    `main` is given its arguments untouched, an option's value neither taken for a subcommand nor
    moved away from its option. (Each command runs for real elsewhere: `make proofs` runs
    `kvsched proofs`, and tests/impl/test_bench.py the bench with `--plot` and `--json`.)"""
    import kvsched.impl.tier_bench
    import kvsched.proofs.runner

    given: list[list[str]] = []

    def record(argv: list[str]) -> int:
        given.append(list(argv))
        return 0

    for module in (kvsched.proofs.runner, kvsched.impl.tier_bench):
        monkeypatch.setattr(module, "main", record)
    assert main(["proofs", "--only", "inductive", "--no-manifest"]) == 0
    assert main(["bench", "tiers", "--plot", "tiers.svg", "--json", "-"]) == 0
    assert given == [["--only", "inductive", "--no-manifest"], ["--plot", "tiers.svg", "--json", "-"]]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_a_total_and_writes_escapes_only_to_a_terminal() -> None:
    log, terminal = io.StringIO(), Terminal()
    for stream in (log, terminal):
        with Progress("campaign", 100, stream) as progress:
            for done in range(100):
                progress.update(done)
            progress.update(100, "shrinking")
    assert "\x1b" not in log.getvalue() and "\r" not in log.getvalue()
    lines = log.getvalue().splitlines()
    assert lines[:2] == ["campaign: 0 of 100", "campaign: 10 of 100"] and len(lines) == 11
    assert lines[-1] == "campaign: shrinking, 100 run"
    assert "\x1b[2K" in terminal.getvalue() and "campaign: 99 of 100" in terminal.getvalue()


def test_a_crash_of_kvsched_itself_is_no_verdict(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def crash(args: object) -> int:
        raise RuntimeError("a bug in kvsched")

    monkeypatch.setattr("kvsched.cli.command_check", crash)
    assert main(["check", "devtools.cow_toy:correct"]) == 2  # never 1, which means "bug found"
    err = capsys.readouterr().err
    assert "RuntimeError: a bug in kvsched" in err and "no verdict (exit status 2)" in err
