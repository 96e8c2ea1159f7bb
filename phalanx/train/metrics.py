"""Throughput and MFU: the FLOPs-per-token formula, device peaks, and a step meter.

MFU (model FLOPs utilisation) = achieved model FLOP/s per device / the device's peak.

Model FLOPs per token, forward + backward (PaLM, appendix B; nanoGPT; torchtitan):

    6·N + 12·L·H·Q·T        [FLOP / token]

N   parameters that multiply activations (embedding lookups excluded; a head tied to the
    token embedding counted once), so 2·N FLOPs forward, 4·N backward;
L   layers; H heads; Q head dimension; T sequence length (tokens of context);
12·L·H·Q·T  the attention scores and the weighted sum (2·2·H·Q·T per token per layer
    forward, twice that backward). Causal attention needs only half of these products,
    but the formula is NOT halved, as in PaLM, nanoGPT and torchtitan, so MFU stays
    comparable with theirs; it therefore overstates useful work by 6·L·H·Q·T per token.
    Activation-checkpoint recomputation is not counted (that is HFU, not MFU).

Achieved TFLOP/s per device = FLOPs/token × tokens/s (whole job) / devices / 1e12.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

# Dense (no sparsity) BF16 tensor-core peaks from NVIDIA's datasheets, TFLOP/s per GPU.
# Matched against torch.cuda.get_device_name(); the first key found in the name wins, so
# the more specific names come first.
PEAK_BF16_TFLOPS: dict[str, float] = {
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H200 NVL": 835.0,
    "H100": 989.0,  # SXM5 (names like "NVIDIA H100 80GB HBM3")
    "H200": 989.0,  # SXM
    "GH200": 989.0,
    "A100": 312.0,  # SXM4 and PCIe alike
}
PEAK_ENV = "PHALANX_PEAK_TFLOPS"  # overrides the table (e.g. another GPU or precision)


def flops_per_token(
    n_params: int, n_layers: int, n_heads: int, head_dim: int, seq_len: int
) -> float:
    """6·N + 12·L·H·Q·T training FLOPs per token (see the module docstring)."""
    return 6.0 * n_params + 12.0 * n_layers * n_heads * head_dim * seq_len


def peak_tflops_for(device_name: str) -> float | None:
    """The dense BF16 peak of a GPU by its CUDA name, or None when the table lacks it."""
    for key, tflops in PEAK_BF16_TFLOPS.items():
        if key.lower() in device_name.lower():
            return tflops
    return None


_cpu_peak: float | None = None


def measured_cpu_tflops(size: int = 512, repeats: int = 5) -> float:
    """A CPU's matmul peak, measured: the best of `repeats` fp32 size×size matmuls
    (2·size³ FLOPs each) with the current torch thread count. Cached per process."""
    global _cpu_peak
    if _cpu_peak is None:
        a = torch.randn(size, size)
        b = torch.randn(size, size)
        torch.mm(a, b)  # warm-up
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
        _cpu_peak = 2.0 * size**3 / max(best, 1e-9) / 1e12
    return _cpu_peak


def peak_tflops(device: torch.device) -> float | None:
    """Peak TFLOP/s of one device: PHALANX_PEAK_TFLOPS if set, the table for a GPU
    (None if unknown), a measured matmul peak on CPU."""
    override = os.environ.get(PEAK_ENV)
    if override:
        return float(override)
    if device.type == "cuda":
        return peak_tflops_for(torch.cuda.get_device_name(device))
    if device.type == "cpu":
        return measured_cpu_tflops()
    return None


@dataclass(frozen=True)
class StepStats:
    """Throughput over the steps since the last report."""

    step_time_s: float  # mean wall time of one step
    tokens_per_s: float  # whole job
    tflops_per_device: float | None  # achieved model TFLOP/s per device
    mfu: float | None  # tflops_per_device / peak, 0..1


class ThroughputMeter:
    """Counts steps between reports and turns them into StepStats.

    Wall time between two reports (the report reads the loss, which synchronises the
    device), so no extra synchronisation is added to any step.
    """

    def __init__(
        self,
        tokens_per_step: int,
        devices: int,
        flops_per_token: float | None,
        peak_tflops: float | None,
    ) -> None:
        self.tokens_per_step = tokens_per_step
        self.devices = devices
        self.flops_per_token = flops_per_token
        self.peak_tflops = peak_tflops
        self._start = time.perf_counter()
        self._steps = 0

    def restart(self) -> None:
        """Forget the steps so far (after a pause such as a blocking checkpoint)."""
        self._start = time.perf_counter()
        self._steps = 0

    def step(self) -> None:
        """One step done."""
        self._steps += 1

    def read(self) -> StepStats | None:
        """Stats since the last read (None before any step), and start a new window."""
        if self._steps == 0:
            return None
        now = time.perf_counter()
        step_time = (now - self._start) / self._steps
        tokens_per_s = self.tokens_per_step / step_time
        tflops = mfu = None
        if self.flops_per_token is not None:
            tflops = self.flops_per_token * tokens_per_s / self.devices / 1e12
            if self.peak_tflops:
                mfu = tflops / self.peak_tflops
        self._start = now
        self._steps = 0
        return StepStats(step_time, tokens_per_s, tflops, mfu)
