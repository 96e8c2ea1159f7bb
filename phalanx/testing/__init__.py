"""Helpers for tests and benchmarks: cluster and job builders (no I/O)."""

from phalanx.testing.builders import (
    apply_decisions,
    cluster_nodes,
    job,
    mixed_jobs,
    node,
    placement_on,
    run_job,
)

__all__ = [
    "apply_decisions",
    "cluster_nodes",
    "job",
    "mixed_jobs",
    "node",
    "placement_on",
    "run_job",
]
