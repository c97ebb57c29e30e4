"""The engine's state slots: the proofs print their verdicts (its transitions and broken forms:
`test_small_models.py`)."""

from __future__ import annotations

import pytest

from kvsched.proofs import engine_slots


def test_the_proofs_print_their_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    assert engine_slots.main() == 0
    printed = capsys.readouterr().out
    assert printed.count("proved") == 2 and printed.count("refuted") == 2
