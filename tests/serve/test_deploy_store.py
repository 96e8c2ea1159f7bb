"""The serving store (migration 0011) on SQLite and PostgreSQL: deployments, their replicas
and pool health survive a reload exactly (what a head restart adopts)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from phalanx.api.serving import DeploymentSpec, PoolSpec
from phalanx.head import db
from phalanx.head import serving_store as ss
from phalanx.head.migrate import upgrade
from phalanx.head.serving_store import Deployment, PoolHealth, Replica
from phalanx.testing.postgres import PostgresServer


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    if request.param == "postgresql":
        pg: PostgresServer = request.getfixturevalue("postgres")
        url = pg.new_database("deploy_store")
    else:
        url = f"sqlite:///{tmp_path / 'x.db'}"
    e = db.make_engine(url)
    upgrade(e)
    yield e
    e.dispose()


def _deployment() -> Deployment:
    spec = DeploymentSpec(
        name="chat",
        engine="llama.cpp",
        model="/m.gguf",
        engine_path="/bin/llama-server",
        pools=[PoolSpec(role="prefill", replicas=2), PoolSpec(role="decode", replicas=3)],
        handoff_dir="/shared/h",
    )
    return Deployment("chat", "ann", "research", spec, 4, 100.0, 200.0, "key-1")


def test_a_deployment_its_replicas_and_health_load_back_as_stored(engine: sa.Engine) -> None:
    dep = _deployment()
    dep.health["decode"] = PoolHealth(3, "replica job 9 ended F (exit 1:0)", 1234.5)
    a = Replica(7, "chat", "prefill", 4, 4, "http://10.0.0.2:8001", True, False)
    b = Replica(8, "chat", "decode", 3, 2, None, False, True)
    with engine.begin() as conn:
        ss.put_deployment(conn, dep, new=True)
        ss.add_replica(conn, a)
        ss.add_replica(conn, b)
    with engine.connect() as conn:
        loaded = ss.load(conn)
    assert list(loaded) == ["chat"]
    got = loaded["chat"]
    assert got.spec == dep.spec and (got.owner, got.team, got.generation) == ("ann", "research", 4)
    assert got.engine_key == "key-1" and got.health == dep.health
    assert got.replicas == {7: a, 8: b}

    a.ready, a.url, b.retiring = False, None, False
    dep.generation += 1
    dep.health.clear()
    with engine.begin() as conn:
        ss.put_replica(conn, a)
        ss.put_replica(conn, b)
        ss.put_deployment(conn, dep, new=False)
        ss.drop_replica(conn, 8)
    with engine.connect() as conn:
        got = ss.load(conn)["chat"]
    assert got.generation == 5 and got.health == {}
    assert got.replicas == {7: a}

    with engine.begin() as conn:
        ss.delete_deployment(conn, "chat")
    with engine.connect() as conn:
        assert ss.load(conn) == {}
        assert conn.execute(sa.select(db.serve_replicas)).first() is None
