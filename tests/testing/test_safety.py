"""Safety mode: every check fails on a manager broken for it; kvsched's own parts pass; the
harness accepts a correct manager whatever its policy (the tutorial's FIFO, tail-first toy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from devtools.broken_managers import MANAGERS, key_on_two_pages, key_outlives
from kvsched.testing import CheckFailed, SafetyMachine, safety, search_safety
from kvsched.testing.adapters import kvsched_parts
from kvsched.testing.outcome import FailureKind
from tests.helpers import weakened


@pytest.mark.parametrize("name", sorted(MANAGERS))
def test_each_check_fails_on_a_manager_broken_for_it(name: str) -> None:
    broken = MANAGERS[name]
    broken.drive(SafetyMachine(broken.correct))  # the correct manager passes the same calls
    with pytest.raises(CheckFailed) as caught:
        broken.drive(SafetyMachine(broken.factory))
    assert caught.value.failure.kind is broken.kind


def test_kvsched_parts_pass_a_safety_campaign_with_hits_forks_and_refusals() -> None:
    result = search_safety(kvsched_parts.manager, examples=150, seed_value=3)
    assert result.passed, result.program
    coverage = result.coverage
    assert coverage["hit_tokens"] > 0 and coverage["refused"] > 0 and coverage["appended"] > 0
    assert coverage["forked"] > 0 and coverage["copied"] > 0 and coverage["evicted"] > 0 and coverage["reset"] > 0
    assert result.warnings == ()


def test_kvsched_parts_pass_a_campaign_that_admits_in_every_verbs() -> None:
    """A lookup, other calls (admissions that evict what it found, frees, resets), then its commit;
    leases read, their saves copied to the host tier; pages demoted to the host tier and promoted
    back."""
    result = search_safety(kvsched_parts.every_verb, examples=150, seed_value=3)
    assert result.passed, result.program
    coverage = result.coverage
    assert coverage["committed"] > 0 and coverage["evicted"] > 0 and coverage["leases_read"] > 0
    assert coverage["demoted"] > 0 and coverage["promoted"] > 0 and coverage["saved"] > 0
    assert result.warnings == ()


def test_kvsched_parts_with_a_host_tier_pass_a_campaign() -> None:
    """Cached pages demoted to the host tier, the device cache dropped, prompts found in the host
    tier and copied back: every read checked against the ghost KV."""
    result = search_safety(kvsched_parts.tiered, examples=150, seed_value=0)
    assert result.passed, result.program
    assert result.coverage["demoted"] > 0 and result.coverage["promoted"] > 0
    assert result.warnings == ()


def test_kvsched_check_runs_both_modes_on_kvsched_itself(capsys: pytest.CaptureFixture[str]) -> None:
    from kvsched.cli import main

    assert main(["check", "kvsched.testing.adapters.kvsched_parts:manager", "--examples", "40"]) == 0
    assert main(["check", "kvsched.testing:impl_system", "--mode", "exact", "--examples", "10", "--steps", "20"]) == 0
    table = capsys.readouterr().out
    assert "safety  pass" in table and "exact  pass" in table


def test_kvsched_check_exits_nonzero_on_a_counterexample(capsys: pytest.CaptureFixture[str]) -> None:
    from kvsched.cli import main

    assert main(["check", "devtools.broken_managers:full_hit", "--examples", "100", "--json", "-"]) == 1
    assert '"check": "FULL_HIT"' in capsys.readouterr().out


SEED_SCRIPT = """
from kvsched.testing import search_safety
from kvsched.testing.adapters import kvsched_parts
first = search_safety(kvsched_parts.manager, examples=150, seed_value=0)
import kvsched.impl.bench  # a module full of literals, not imported before
again = search_safety(kvsched_parts.manager, examples=150, seed_value=0)
print((again.programs, again.coverage) == (first.programs, first.coverage))
"""


def test_a_seed_generates_the_same_campaign_whatever_the_process_imported() -> None:
    """Hypothesis draws some values from the literals of the local modules loaded so far; a
    campaign switches that off (without it, importing the bench module changed this campaign)."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", SEED_SCRIPT], cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]


def test_a_capability_the_harness_does_not_know_is_refused_not_ignored() -> None:
    class Misspelt(kvsched_parts.KvschedManager):
        capabilities = frozenset({"atomic", "forks"})

    with pytest.raises(ValueError, match="forks"):
        SafetyMachine(Misspelt)


def test_a_lease_reads_only_what_its_request_had_written() -> None:
    """A lease taken while the request's last page is half written holds what the request wrote,
    not the stale KV of the page's previous owner in the other slot: a manager that lets the
    request write that slot in place (vLLM's pool: no copy-on-write) must pass. Found on vLLM's
    pool, where a campaign failed GHOST on it."""
    machine = SafetyMachine(kvsched_parts.every_verb)
    machine.submit(1, (7, 8, 9, 6))
    machine.finish(1)
    assert machine.reset_cache()  # both pages free again, their KV still there
    machine.submit(2, (1, 2, 3))  # its second page: slot 0 written, slot 1 the old KV
    last = machine.manager.view().tables[2][1]
    assert machine.kv[last][1] == (7, 8)  # the stale KV the lease must not count as read
    lease = machine.lease(2)
    assert lease is not None
    _, seen, _ = machine.leases[lease]
    assert seen == {machine.manager.view().tables[2][0]: {0: (1,), 1: (1, 2)}, last: {0: (1, 2, 3)}}
    machine.decode(2)
    machine.end_lease(lease)
    machine.teardown()


def ghost_found(machine: SafetyMachine, name: str) -> str | None:
    """What the ghost check says of the broken manager `name`'s calls (None: nothing)."""
    try:
        MANAGERS[name].drive(machine)
    except CheckFailed as error:
        return error.failure.detail if error.failure.kind is FailureKind.GHOST else None
    return None


def test_a_key_that_outlives_its_content_is_caught_where_it_is_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's stale pool in kvsched's parts: the write into a page still cached under its old
    key is caught, and by nothing else on these calls (the page is cached anew in the same step)."""
    assert "a key that outlives its content" in (ghost_found(SafetyMachine(key_outlives), "key_outlives") or "")
    weak = weakened(safety, "if named is not None and named != context:", "if False:", monkeypatch)
    assert ghost_found(weak.SafetyMachine(key_outlives), "key_outlives") is None


def test_a_page_cached_under_another_pages_key_is_caught_after_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A map that names the last cached page under the first's key: no read comes, the after-step
    check sees it; weakened at the last cached page, it does not (the events' count sees it then)."""
    assert "is cached under key" in (ghost_found(SafetyMachine(key_on_two_pages), "key_on_two_pages") or "")
    last = "        for page, key in list(view.cached.items())[:-1]:"
    weak = weakened(safety, "        for page, key in view.cached.items():", last, monkeypatch)
    assert ghost_found(weak.SafetyMachine(key_on_two_pages), "key_on_two_pages") is None
