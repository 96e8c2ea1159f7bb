"""The MFU arithmetic: FLOPs per token against a hand count, device peaks, the meter."""

from __future__ import annotations

import pytest
import torch

from phalanx.train.metrics import (
    ThroughputMeter,
    flops_per_token,
    measured_cpu_tflops,
    peak_tflops,
    peak_tflops_for,
)
from phalanx.train.model import GPT, GPTConfig, preset


def test_flops_per_token_of_a_small_gpt_matches_a_hand_count() -> None:
    d, layers, heads, vocab, seq = 32, 2, 2, 256, 64
    cfg = GPTConfig(vocab_size=vocab, seq_len=seq, n_layer=layers, n_head=heads, d_model=d)
    # One block: ln1 + ln2 (2·2d), q/k/v/o (4·(d² + d)), fc (d·4d + 4d), proj (4d·d + d).
    block = 2 * 2 * d + 4 * (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    assert block == 12 * d * d + 13 * d == 12_704
    # N: the blocks, the final norm, and the head (tied to the token table, counted once);
    # the position table is a lookup and does not count.
    n = layers * block + 2 * d + vocab * d
    assert n == 33_664
    # 6·N for the matmuls' forward + backward, 12·L·H·Q·T for attention (not halved).
    expected = 6 * n + 12 * layers * heads * (d // heads) * seq
    assert expected == 251_136
    model = GPT(cfg)
    assert model.matmul_params() == n
    assert model.num_params() == n + seq * d
    assert model.flops_per_token() == expected
    assert flops_per_token(n, layers, heads, d // heads, seq) == expected


def test_untied_head_counts_the_head_not_the_token_table() -> None:
    tied = GPT(preset("tiny"))
    untied = GPT(preset("tiny", tie_embeddings=False))
    assert untied.num_params() == tied.num_params() + 256 * 32
    assert untied.matmul_params() == tied.matmul_params()


def test_gpt2_small_preset_is_the_124m_model() -> None:
    with torch.device("meta"):
        model = GPT(preset("gpt2-small"))
    # 12 × (12·768² + 13·768) + 50304·768 (tied) + 1024·768 + 2·768
    assert model.num_params() == 124_475_904
    with torch.device("meta"):
        big = GPT(preset("gpt-1b"))
    assert 0.9e9 < big.num_params() < 1.1e9


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100-PCIE-40GB", 312.0),
        ("Tesla T4", None),
    ],
)
def test_peak_table_by_device_name(name: str, tflops: float | None) -> None:
    assert peak_tflops_for(name) == tflops


def test_cpu_peak_is_measured_and_the_env_overrides_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PHALANX_PEAK_TFLOPS", raising=False)
    measured = peak_tflops(torch.device("cpu"))
    assert measured is not None and measured == measured_cpu_tflops() and measured > 0
    monkeypatch.setenv("PHALANX_PEAK_TFLOPS", "123.5")
    assert peak_tflops(torch.device("cpu")) == 123.5


def test_meter_turns_steps_into_tokens_tflops_and_mfu() -> None:
    meter = ThroughputMeter(tokens_per_step=4096, devices=4, flops_per_token=1e9, peak_tflops=2.0)
    assert meter.read() is None
    for _ in range(3):
        meter.step()
    stats = meter.read()
    assert stats is not None and stats.tflops_per_device is not None and stats.mfu is not None
    assert stats.tokens_per_s == pytest.approx(4096 / stats.step_time_s)
    assert stats.tflops_per_device == pytest.approx(1e9 * stats.tokens_per_s / 4 / 1e12)
    assert stats.mfu == pytest.approx(stats.tflops_per_device / 2.0)
    no_flops = ThroughputMeter(4096, 4, None, 2.0)
    no_flops.step()
    stats = no_flops.read()
    assert stats is not None and stats.mfu is None and stats.tflops_per_device is None
