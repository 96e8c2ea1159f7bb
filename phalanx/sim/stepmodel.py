"""Step-time model: how much slower a job runs when its gang is spread wider than needed.

A data-parallel step is compute plus a ring all-reduce of the gradients:
    t_step = t_compute + 2(n − 1)/n · S / B
with n the number of GPUs, S the gradient size in bytes and B the bottleneck bandwidth of
the ring in bytes/s: NVLink inside one node, the rack network between nodes of one rack,
and slower links across racks and blocks. A trace's duration is taken as the run time on
the ideal placement (fewest nodes, one rack); a job placed wider runs
    duration × t_step(actual) / t_step(ideal).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepModel:
    """Bandwidths in GB/s (10⁹ bytes/s), gradient size in GB, compute time in seconds."""

    nvlink_gbps: float = 450.0  # H100 NVLink, per direction
    rack_gbps: float = 50.0  # 400 Gb/s InfiniBand per GPU inside a rack
    block_gbps: float = 25.0  # oversubscribed spine between racks
    cluster_gbps: float = 12.5  # across blocks
    gradient_gb: float = 1.0  # e.g. 500M parameters in bf16
    compute_s: float = 1.0  # forward + backward per step

    def bandwidth(self, domain: str) -> float:
        return {
            "node": self.nvlink_gbps,
            "rack": self.rack_gbps,
            "block": self.block_gbps,
            "cluster": self.cluster_gbps,
        }[domain]

    def step_s(self, gpus: int, domain: str) -> float:
        if gpus <= 1:
            return self.compute_s
        ring = 2.0 * (gpus - 1) / gpus * self.gradient_gb / self.bandwidth(domain)
        return self.compute_s + ring

    def slowdown(self, gpus: int, nodes: int, domain: str) -> float:
        """Run-time factor of `domain` against the ideal placement of the same gang (≥ 1)."""
        ideal = "node" if nodes == 1 else "rack"
        return self.step_s(gpus, domain) / self.step_s(gpus, ideal)
