"""End-to-end fixtures: a real head and two agents (2 fake GPUs each) on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.client.api import PhalanxClient
from phalanx.local import LocalCluster
from phalanx.testing.postgres import PostgresServer
from tests.e2e.helpers import cancel_all

__all__ = ["api", "cluster", "workdir"]


# One cluster per database and test process (pytest-xdist worker), shared by every e2e module:
# start-up costs seconds, and xdist spreads a module's tests over both workers, so a
# module-scoped cluster would start up to once per module, database and worker. Tests stay
# independent: each ends by cancelling what it left queued or running (the `api` fixture)
# and names what it creates (users, teams) uniquely.
@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    """A head and agents 127.0.0.2 and 127.0.0.3, each with two fake H100s."""
    db_url = None
    if request.param == "postgresql":
        pg: PostgresServer = request.getfixturevalue("postgres")
        pg.reset()
        db_url = pg.url
    state = tmp_path_factory.mktemp(f"e2e-{request.param}")
    with LocalCluster(state, nodes=2, gpus_per_node=2, db_url=db_url) as running:
        yield running


@pytest.fixture
def api(cluster: LocalCluster) -> Iterator[PhalanxClient]:
    """The cluster's admin client; afterwards every job the test left is cancelled."""
    with cluster.client() as client:
        yield client
        try:
            cancel_all(client)
        finally:
            cluster.check()  # no head or agent died during the test


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """The test's job working directory (absolute, as the head requires)."""
    path = tmp_path.resolve() / "work"
    path.mkdir(exist_ok=True)
    return path
