"""`LocalCluster` failing to start: a clear error with the log, and no process left."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.local import ClusterError, LocalCluster
from tests.cli.conftest import processes_mentioning


def test_an_agent_that_cannot_start_is_reported_with_its_log(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, nodes=1, gpus_per_node=63)  # more than a node can hold
    with pytest.raises(ClusterError, match=r"agent 127\.0\.0\.2 exited with code 2") as info:
        cluster.start()
    assert "--fake-gpus" in str(info.value)  # the tail of the agent's log
    assert str(tmp_path / "logs" / "agent-127.0.0.2.log") in str(info.value)
    assert processes_mentioning(str(tmp_path)) == []  # the head was stopped again
    assert cluster.processes() == []
    with pytest.raises(ClusterError, match="not started"):
        _ = cluster.url


def test_bad_sizes_are_refused_before_starting_anything(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="nodes must be between 0 and 253"):
        LocalCluster(tmp_path, nodes=-1)


def test_a_standby_head_without_postgresql_is_refused_before_starting_anything(
    tmp_path: Path,
) -> None:
    # Only PostgreSQL elects a leader: a second head on SQLite would exit 2 at start.
    for db_url in (None, f"sqlite:///{tmp_path}/phalanx.db"):
        with pytest.raises(ClusterError, match="a standby head needs a PostgreSQL db_url"):
            LocalCluster(tmp_path, standby=True, db_url=db_url)
    assert not any(tmp_path.iterdir())
