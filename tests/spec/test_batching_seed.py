"""Seed B's config, sequence and FIFO-scheduler tests (lattice-inference 0.6.0), ported.

The one representational change: a continuation chunk's start is `None`, where the original
used the in-band sentinel `usize::MAX`.
"""

from __future__ import annotations

import pytest

from kvsched.spec import BatchConfig, FifoScheduler, InvalidConfig, PrefillChunk, SeqId, SeqIdCounter


def small_sched(max_batch: int, chunk: int, reserve: int) -> FifoScheduler:
    return FifoScheduler(BatchConfig(max_batch, 4096, chunk, reserve))


# --- config ---


def test_default_config_is_valid() -> None:
    config = BatchConfig()
    assert (config.max_batch_size, config.max_seq_len, config.chunk_size, config.prefill_reserve_pages) == (
        32,
        4096,
        512,
        8,
    )


def test_zero_batch_size_is_invalid() -> None:
    with pytest.raises(InvalidConfig, match="max_batch_size must be > 0"):
        BatchConfig(max_batch_size=0)


def test_zero_chunk_size_is_invalid() -> None:
    with pytest.raises(InvalidConfig, match="chunk_size must be > 0"):
        BatchConfig(chunk_size=0)


def test_chunk_size_exceeds_512_is_invalid() -> None:
    with pytest.raises(InvalidConfig, match="512"):
        BatchConfig(chunk_size=513)


def test_chunk_size_512_is_valid() -> None:
    assert BatchConfig(chunk_size=512).chunk_size == 512


def test_zero_max_seq_len_is_invalid() -> None:
    with pytest.raises(InvalidConfig, match="max_seq_len must be > 0"):
        BatchConfig(max_seq_len=0)


def test_invalid_config_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        BatchConfig(max_batch_size=-1)


# --- ids ---


def test_seq_id_counter_increments() -> None:
    counter = SeqIdCounter()
    assert counter.next() == SeqId(0)
    assert counter.next() == SeqId(1)
    assert counter.value == 2


def test_seq_id_display() -> None:
    assert str(SeqId(42)) == "seq:42"


# --- FIFO scheduler ---


def test_empty_state_returns_empty_decision() -> None:
    decision = FifoScheduler(BatchConfig()).select_batch([], [], 100, 100)
    assert decision.prefill == [] and decision.decode == [] and decision.evict == []


def test_new_sequence_admitted_into_prefill() -> None:
    scheduler = FifoScheduler(BatchConfig())
    scheduler.enqueue(SeqId(1))
    decision = scheduler.select_batch([], [], 100, 100)
    assert decision.prefill == [PrefillChunk(SeqId(1), 0, 512)]


def test_admission_respects_max_batch_size() -> None:
    scheduler = small_sched(2, 512, 0)
    for value in (1, 2, 3):
        scheduler.enqueue(SeqId(value))
    decision = scheduler.select_batch([], [], 100, 100)
    assert [chunk.seq_id for chunk in decision.prefill] == [SeqId(1), SeqId(2)]
    assert scheduler.waiting_count() == 1


def test_admission_refuses_when_active_count_full() -> None:
    scheduler = small_sched(2, 512, 0)
    scheduler.enqueue(SeqId(10))
    decision = scheduler.select_batch([], [SeqId(1), SeqId(2)], 100, 100)
    assert decision.prefill == []
    assert scheduler.waiting_count() == 1


def test_admission_blocked_by_memory_guard() -> None:
    scheduler = small_sched(32, 512, 8)
    scheduler.enqueue(SeqId(1))
    decision = scheduler.select_batch([SeqId(0)], [], 3, 100)
    assert decision.prefill == [PrefillChunk(SeqId(0), None, 512)]
    assert scheduler.waiting_count() == 1


def test_admission_allowed_when_batch_empty_despite_low_pages() -> None:
    scheduler = small_sched(32, 512, 8)
    scheduler.enqueue(SeqId(1))
    assert len(scheduler.select_batch([], [], 0, 100).prefill) == 1


def test_running_sequences_go_to_decode() -> None:
    decision = FifoScheduler(BatchConfig()).select_batch([], [SeqId(5), SeqId(6)], 100, 100)
    assert decision.decode == [SeqId(5), SeqId(6)]


def test_all_running_sequences_decode_regardless_of_free_state_slots() -> None:
    decision = FifoScheduler(BatchConfig()).select_batch([], [SeqId(1), SeqId(2), SeqId(3)], 100, 0)
    assert decision.decode == [SeqId(1), SeqId(2), SeqId(3)]


def test_waiting_sequences_get_continuation_chunk() -> None:
    decision = small_sched(32, 128, 0).select_batch([SeqId(2)], [], 100, 100)
    assert PrefillChunk(SeqId(2), None, 128) in decision.prefill


def test_no_duplicate_seqid_in_prefill_between_new_and_waiting() -> None:
    scheduler = small_sched(32, 512, 0)
    scheduler.enqueue(SeqId(99))
    decision = scheduler.select_batch([SeqId(10)], [], 100, 100)
    ids = [chunk.seq_id for chunk in decision.prefill]
    assert ids == [SeqId(99), SeqId(10)]
    assert len(ids) == len(set(ids))


def test_phase1_no_evictions() -> None:
    assert FifoScheduler(BatchConfig()).select_batch([], [SeqId(1)], 100, 100).evict == []


def test_on_preempt_does_not_change_the_queue() -> None:
    scheduler = FifoScheduler(BatchConfig())
    scheduler.enqueue(SeqId(1))
    scheduler.on_preempt(SeqId(42))
    assert scheduler.queued() == (SeqId(1),)


def test_chunk_size_propagated_to_new_admissions() -> None:
    scheduler = small_sched(32, 256, 0)
    scheduler.enqueue(SeqId(1))
    _, _, length = scheduler.select_batch([], [], 100, 100).prefill[0]
    assert length == 256
