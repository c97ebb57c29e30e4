"""Seed B's sequence and sequence-manager tests (lattice-inference 0.6.0), ported."""

from __future__ import annotations

from kvsched.spec import FinishReason, GenerationSequence, SeqId, SequenceManager
from kvsched.spec.sequence import Decoding, Finished, Prefilling


def make(prompt_len: int = 5, max_new: int = 3) -> GenerationSequence:
    return GenerationSequence(SeqId(1), list(range(prompt_len)), max_new)


def test_new_sequence_is_prefilling_at_zero() -> None:
    assert make().state == Prefilling(0)


def test_advance_prefill_partial_chunk() -> None:
    sequence = make(prompt_len=10)
    sequence.advance_prefill(4)
    assert sequence.state == Prefilling(4)


def test_advance_prefill_complete_transitions_to_decoding() -> None:
    sequence = make(prompt_len=4)
    sequence.advance_prefill(4)
    assert sequence.state == Decoding()


def test_advance_prefill_overshoot_transitions_to_decoding() -> None:
    sequence = make(prompt_len=4)
    sequence.advance_prefill(100)
    assert sequence.state == Decoding()


def test_push_token_normal() -> None:
    sequence = make(max_new=3)
    sequence.advance_prefill(5)
    assert not sequence.push_token(7, eos=2)
    assert sequence.generated_ids == [7]
    assert sequence.state == Decoding()


def test_push_token_eos_finishes_sequence() -> None:
    sequence = make(max_new=3)
    sequence.advance_prefill(5)
    assert sequence.push_token(2, eos=2)
    assert sequence.state == Finished(FinishReason.EOS)


def test_eos_is_checked_before_max_length() -> None:
    sequence = make(max_new=1)
    sequence.advance_prefill(5)
    assert sequence.push_token(2, eos=2)
    assert sequence.state == Finished(FinishReason.EOS)


def test_push_token_max_length_finishes_sequence() -> None:
    sequence = make(max_new=2)
    sequence.advance_prefill(5)
    assert not sequence.push_token(7, eos=None)
    assert sequence.push_token(8, eos=None)
    assert sequence.state == Finished(FinishReason.MAX_LENGTH)


def test_preempt_marks_sequence_finished() -> None:
    sequence = make()
    sequence.preempt()
    assert sequence.state == Finished(FinishReason.PREEMPTED)
    assert not sequence.is_active()


def test_position_prefilling_returns_chunk_start() -> None:
    sequence = make(prompt_len=10)
    sequence.advance_prefill(3)
    assert sequence.position() == 3


def test_position_decoding_returns_prompt_plus_generated() -> None:
    sequence = make(prompt_len=5, max_new=10)
    sequence.advance_prefill(5)
    for token in (1, 2, 3):
        sequence.push_token(token, eos=None)
    assert sequence.position() == 8


def test_manager_add_get_remove() -> None:
    manager = SequenceManager()
    seq_id = manager.next_id()
    manager.add(GenerationSequence(seq_id, [1, 2], 4))
    got = manager.get(seq_id)
    assert got is not None and got.prompt_ids == [1, 2]
    removed = manager.remove(seq_id)
    assert removed is not None and removed.id == seq_id
    assert manager.remove(seq_id) is None
    assert len(manager) == 0


def test_manager_ids_by_state() -> None:
    manager = SequenceManager()
    ids = [manager.next_id() for _ in range(3)]
    for seq_id in ids:
        manager.add(GenerationSequence(seq_id, [1, 2], 1))
    decoding = manager.get(ids[1])
    finished = manager.get(ids[2])
    assert decoding is not None and finished is not None
    decoding.advance_prefill(2)
    finished.advance_prefill(2)
    finished.push_token(5, eos=None)
    assert manager.ids_prefilling() == [ids[0]]
    assert manager.ids_decoding() == [ids[1]]
    assert manager.ids_finished() == [ids[2]]


def test_manager_next_id_is_unique() -> None:
    manager = SequenceManager()
    assert len({manager.next_id() for _ in range(100)}) == 100


def test_manager_get_mut_allows_state_update() -> None:
    manager = SequenceManager()
    seq_id = manager.next_id()
    manager.add(GenerationSequence(seq_id, [1, 2, 3], 2))
    sequence = manager.get(seq_id)
    assert sequence is not None
    sequence.advance_prefill(3)
    assert manager.ids_decoding() == [seq_id]
