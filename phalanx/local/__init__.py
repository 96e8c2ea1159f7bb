"""A whole cluster on one machine: a head and local agents as real processes."""

from phalanx.local.cluster import ClusterError, LocalCluster

__all__ = ["ClusterError", "LocalCluster"]
