"""Helpers for tests and benchmarks: cluster and job builders (no I/O)."""

from phalanx.testing.builders import cluster_nodes, job, mixed_jobs

__all__ = ["cluster_nodes", "job", "mixed_jobs"]
