"""Serving deployments in memory and in the store (tables serve_deployments and
serve_replicas, migration 0011). The controller (head/serving.py) changes them only on the
control thread, in its transaction; readers take the control lock."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, delete, select, update

from phalanx.api.serving import DeploymentSpec
from phalanx.head import db


@dataclass
class Replica:
    """One replica job of a deployment."""

    job_id: int
    deployment: str
    pool: str
    generation: int
    slots: int
    url: str | None = None
    ready: bool = False
    retiring: bool = False  # the controller cancelled it (scale down, update, delete)


@dataclass
class PoolHealth:
    """Replicas of a pool that ended on their own since one was last ready, and until when
    their replacements wait (exponential backoff: a crashing engine is not resubmitted
    every second)."""

    failures: int = 0
    last_failure: str | None = None
    backoff_until: float | None = None


@dataclass
class Deployment:
    name: str
    owner: str
    team: str
    spec: DeploymentSpec
    generation: int
    created: float
    updated: float
    engine_key: str
    health: dict[str, PoolHealth] = field(default_factory=dict)
    replicas: dict[int, Replica] = field(default_factory=dict)

    def pool_health(self, role: str) -> PoolHealth:
        return self.health.setdefault(role, PoolHealth())


# ---------------------------------------------------------------------------- loading
def load(conn: Connection) -> dict[str, Deployment]:
    """Every deployment and its replicas, as the store holds them (a head start)."""
    out: dict[str, Deployment] = {}
    for r in conn.execute(select(db.serve_deployments)):
        out[r.name] = Deployment(
            name=r.name,
            owner=r.owner,
            team=r.team,
            spec=DeploymentSpec.model_validate_json(r.spec_json),
            generation=r.generation,
            created=r.created,
            updated=r.updated,
            engine_key=r.engine_key,
            health=_health(r.status_json),
        )
    for r in conn.execute(select(db.serve_replicas)):
        dep = out.get(r.deployment)
        if dep is None:
            continue  # its deployment was deleted: nothing adopts it
        dep.replicas[r.job_id] = Replica(
            job_id=r.job_id,
            deployment=r.deployment,
            pool=r.pool,
            generation=r.generation,
            slots=r.slots,
            url=r.url,
            ready=bool(r.ready),
            retiring=bool(r.retiring),
        )
    return out


def _health(text: str | None) -> dict[str, PoolHealth]:
    if not text:
        return {}
    raw: dict[str, dict[str, Any]] = json.loads(text)
    return {role: PoolHealth(**h) for role, h in raw.items()}


# ---------------------------------------------------------------------------- writing
def put_deployment(conn: Connection, dep: Deployment, new: bool) -> None:
    values = {
        "owner": dep.owner,
        "team": dep.team,
        "spec_json": dep.spec.model_dump_json(),
        "generation": dep.generation,
        "created": dep.created,
        "updated": dep.updated,
        "engine_key": dep.engine_key,
        "status_json": health_json(dep),
    }
    t = db.serve_deployments
    if new:
        conn.execute(t.insert().values(name=dep.name, **values))
    else:
        conn.execute(update(t).where(t.c.name == dep.name).values(**values))


def put_health(conn: Connection, dep: Deployment) -> None:
    t = db.serve_deployments
    conn.execute(update(t).where(t.c.name == dep.name).values(status_json=health_json(dep)))


def health_json(dep: Deployment) -> str:
    return json.dumps(
        {
            role: {
                "failures": h.failures,
                "last_failure": h.last_failure,
                "backoff_until": h.backoff_until,
            }
            for role, h in sorted(dep.health.items())
        }
    )


def delete_deployment(conn: Connection, name: str) -> None:
    conn.execute(delete(db.serve_replicas).where(db.serve_replicas.c.deployment == name))
    conn.execute(delete(db.serve_deployments).where(db.serve_deployments.c.name == name))


def add_replica(conn: Connection, r: Replica) -> None:
    conn.execute(
        db.serve_replicas.insert().values(
            job_id=r.job_id,
            deployment=r.deployment,
            pool=r.pool,
            generation=r.generation,
            slots=r.slots,
            url=r.url,
            ready=r.ready,
            retiring=r.retiring,
        )
    )


def put_replica(conn: Connection, r: Replica) -> None:
    t = db.serve_replicas
    conn.execute(
        update(t)
        .where(t.c.job_id == r.job_id)
        .values(url=r.url, ready=r.ready, retiring=r.retiring)
    )


def drop_replica(conn: Connection, job_id: int) -> None:
    conn.execute(delete(db.serve_replicas).where(db.serve_replicas.c.job_id == job_id))
