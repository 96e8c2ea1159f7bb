"""Byte-level data: generated text, per-rank slices of one global order, resumable position."""

from __future__ import annotations

import pytest
import torch

from phalanx.train.data import BatchLoader, ByteDataset, generate_text
from phalanx.train.errors import TrainConfigError


def test_generated_text_is_deterministic_ascii_of_the_asked_size() -> None:
    a = generate_text(10_000, seed=1)
    assert a == generate_text(10_000, seed=1)
    assert a != generate_text(10_000, seed=2)
    assert len(a) == 10_000 and a.isascii()


def test_samples_are_windows_with_targets_shifted_by_one() -> None:
    data = ByteDataset(torch.arange(100, dtype=torch.uint8), seq_len=10)
    assert data.num_samples == 9
    x, y = data.batch(torch.tensor([0, 3]))
    assert x.tolist()[1] == list(range(30, 40)) and y.tolist()[1] == list(range(31, 41))
    assert x.dtype == torch.long


def _global_batches(loader_per_rank: list[BatchLoader], steps: int) -> list[torch.Tensor]:
    batches = []
    for _ in range(steps):
        batches.append(torch.cat([loader.next_batch()[0] for loader in loader_per_rank]))
    return batches


def test_data_parallel_ranks_split_exactly_the_single_process_batches() -> None:
    data = ByteDataset.generated(seq_len=16, n_bytes=16 * 40 + 1)  # 40 samples: epochs roll
    single = _global_batches([BatchLoader(data, 8, seed=3)], steps=12)
    four = _global_batches([BatchLoader(data, 8, r, 4, seed=3) for r in range(4)], steps=12)
    for a, b in zip(single, four, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(single[0], single[5])  # a new epoch has a new order


def test_position_resumes_on_another_number_of_ranks() -> None:
    data = ByteDataset.generated(seq_len=16, n_bytes=16 * 40 + 1)
    run = BatchLoader(data, 8, seed=3)
    expected = _global_batches([run], steps=10)
    first = BatchLoader(data, 8, 0, 4, seed=3)
    for _ in range(7):
        first.next_batch()
    state = first.state_dict()
    resumed = [BatchLoader(data, 8, r, 2, seed=0) for r in range(2)]  # seed comes from state
    for loader in resumed:
        loader.load_state_dict(state)
    for a, b in zip(expected[7:], _global_batches(resumed, steps=3), strict=True):
        assert torch.equal(a, b)


def test_batch_that_does_not_split_over_ranks_is_rejected() -> None:
    data = ByteDataset.generated(seq_len=16, n_bytes=4096)
    with pytest.raises(TrainConfigError, match="not divisible by the 3 data-parallel ranks"):
        BatchLoader(data, 8, 0, 3)
    with pytest.raises(TrainConfigError, match="too few"):
        ByteDataset(torch.zeros(5, dtype=torch.uint8), seq_len=16)
