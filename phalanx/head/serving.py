"""Serving deployments in the head: apply, scale, delete, the replicas' own reports, the
reads (the router's endpoints), and when the controller (head/serving_control.py) runs
(docs/serving-deploy.md).

A replica is an ordinary job, submitted by the head for the deployment's owner (its team,
QOS, one node, the pool's GPUs), running `RUNTIME_PYTHON -m phalanx.serve.replica`; the
scheduler places, preempts and requeues it like any job. Every change runs on the control
thread, in its transaction (a replica job and its row are stored together, so a head
restart adopts exactly the replicas that exist). The controller's pass runs after each
change, at once when a replica's job moves, and each second while a deployment needs one.
"""

from __future__ import annotations

import logging
import secrets
import sys
import threading
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from phalanx.api import models as m
from phalanx.api.serving import (
    MAX_REPLICAS,
    AutoscalerClaim,
    AutoscalerLease,
    DeploymentInfo,
    DeploymentList,
    DeploymentSpec,
    Endpoint,
    Endpoints,
    PoolStatus,
    ReplicaConfig,
    ReplicaInfo,
    ReplicaReport,
    ScaleRequest,
)
from phalanx.head import auth
from phalanx.head import serving_store as ss
from phalanx.head.auth import AuthError, Principal
from phalanx.head.control import ControlThread, HeadError
from phalanx.head.mirror import Tx
from phalanx.head.records import QOS_PRIORITY, JobRecord
from phalanx.head.serving_control import Controller, serves, shape
from phalanx.head.serving_metrics import StatsBook
from phalanx.head.serving_store import Deployment, Replica

log = logging.getLogger("phalanx.head")

TICK_S = 1.0  # the controller looks at every deployment this often (and at once on news)
MAX_DEPLOYMENTS_PER_USER = 100
MAX_DEPLOYMENTS = 10_000


class Serving:
    """The deployments of one head and their controller."""

    def __init__(self, control: ControlThread, runtime_python: str | None = None) -> None:
        self.control = control
        self.mirror = control.mirror
        self.runtime_python = runtime_python or sys.executable
        self.deployments: dict[str, Deployment] = {}  # changed on the control thread only
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._replica_jobs: set[int] = set()  # job ids of replicas (the move watcher's test)
        self.controller = Controller(self.mirror, self.runtime_python, self._replica_jobs)
        self.stats = StatsBook(control.clock.time)  # the routers' summaries (serving_stats.py)
        self._seen_errors = control.loop_errors
        # deployment -> (holder, expiry on the control clock): the one autoscaler that may
        # scale it (in memory: after a head restart the next claim takes it again).
        self.leases: dict[str, tuple[str, float]] = {}
        control.move_watchers.append(self._on_moves)

    # ------------------------------------------------------------------ life
    def load(self) -> None:
        """The deployments and their replicas from the store (after the control thread
        loaded its jobs): the replica jobs that survived a head restart are adopted."""
        with self.control.engine.connect() as conn:
            loaded = ss.load(conn)
        with self.control.lock:
            self._adopt(loaded)

    def _adopt(self, loaded: dict[str, Deployment]) -> None:
        self.deployments = loaded
        self._replica_jobs.clear()  # in place: the controller holds it too
        self._replica_jobs.update(j for d in loaded.values() for j in d.replicas)
        self._seen_errors = self.control.loop_errors

    def _fresh(self, tx: Tx) -> None:
        """After the control thread rolled a batch back (and rebuilt its mirror from the
        store), the deployments too are what the store holds."""
        if self.control.loop_errors != self._seen_errors:
            self._adopt(ss.load(tx.conn))

    def start(self) -> None:
        self.load()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="phalanx-serving", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(TICK_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            with self.control.lock:
                now = self.control.clock.time()
                due = self.control.loop_errors != self._seen_errors  # reload (_fresh)
                due = due or any(self.controller.due(d, now) for d in self.deployments.values())
            if not due:
                continue  # nothing to do: no batch (most seconds, once pools are whole)
            try:
                self.control.call(self.reconcile_all)
            except Exception:  # a refused or failed batch: the next tick tries again
                log.exception("serving: the controller's pass failed; trying again")

    def _on_moves(self, tx: Tx) -> None:
        """After a commit that moved jobs: look again at once if a replica moved."""
        if any(j in self._replica_jobs for j in tx.moved_jobs):
            self._wake.set()

    # ------------------------------------------------------------------ requests
    def apply(self, who: Principal, spec: DeploymentSpec) -> DeploymentInfo:
        """Create the deployment, or update it: a changed spec is a new generation (rolled
        out), a changed replica count only scales, the same spec changes nothing."""
        _check_spec(spec)

        def op(tx: Tx) -> DeploymentInfo:
            self._fresh(tx)
            dep = self.deployments.get(spec.name)
            team = self._team(who, spec, dep)
            if dep is None:
                self._check_room(who)
                dep = Deployment(
                    name=spec.name,
                    owner=who.user or "",
                    team=team,
                    spec=spec,
                    generation=1,
                    created=tx.now,
                    updated=tx.now,
                    engine_key=secrets.token_urlsafe(32),
                )
                ss.put_deployment(tx.conn, dep, new=True)
                self.deployments[spec.name] = dep
                tx.event(tx.now, "serve", f"deployment {spec.name} created by {who.user}")
            else:
                changed = shape(spec) != shape(dep.spec) or team != dep.team
                if changed or spec != dep.spec:
                    if changed:
                        dep.generation += 1
                        dep.health.clear()  # a new spec deserves a fresh start
                        what = f"updated to generation {dep.generation}"
                        tx.event(tx.now, "serve", f"deployment {spec.name} {what} by {who.user}")
                    dep.spec, dep.team, dep.updated = spec, team, tx.now
                    ss.put_deployment(tx.conn, dep, new=False)
            self.controller.reconcile(tx, dep)
            return self._info(dep)

        return self.control.call(op)

    def scale(self, who: Principal, name: str, req: ScaleRequest) -> DeploymentInfo:
        def op(tx: Tx) -> DeploymentInfo:
            self._fresh(tx)
            dep = self._visible(who, name)
            pools = [p for p in dep.spec.pools if p.role == req.pool]
            if not pools:
                roles = ", ".join(p.role for p in dep.spec.pools)
                raise HeadError(422, f"deployment {name} has no {req.pool} pool (it has {roles})")
            pool = pools[0]
            if req.autoscaler is not None:
                self._check_lease(name, req.autoscaler, tx.now)
            lo, hi = pool.min_replicas, pool.max_replicas
            if (lo is not None and req.replicas < lo) or (hi is not None and req.replicas > hi):
                raise HeadError(
                    422, f"{req.replicas} replicas is outside the pool's bounds [{lo}, {hi}]"
                )
            new_pools = [
                p.model_copy(update={"replicas": req.replicas}) if p.role == req.pool else p
                for p in dep.spec.pools
            ]
            dep.spec = dep.spec.model_copy(update={"pools": new_pools})
            dep.updated = tx.now
            ss.put_deployment(tx.conn, dep, new=False)
            if req.replicas != pool.replicas:
                by = f"autoscaler {req.autoscaler} of {who.user}" if req.autoscaler else who.user
                why = f": {req.reason}" if req.reason else ""
                tx.event(
                    tx.now,
                    "serve",
                    f"deployment {name} pool {req.pool} scaled {pool.replicas} -> "
                    f"{req.replicas} by {by}{why}",
                )
            self.controller.reconcile(tx, dep)
            return self._info(dep)

        return self.control.call(op)

    # ------------------------------------------------------------------ autoscaler lease
    def claim_autoscaler(
        self, who: Principal, name: str, claim: AutoscalerClaim
    ) -> AutoscalerLease:
        """Take or renew the deployment's autoscaler lease: one autoscaler acts per
        deployment; another holder is refused (409) until the lease lapses or is released."""
        with self.control.lock:
            self._visible(who, name)
            now = self.control.clock.time()
            held = self.leases.get(name)
            if held is not None and held[0] != claim.holder and held[1] > now:
                raise HeadError(
                    409,
                    f"deployment {name} is autoscaled by {held[0]} "
                    f"(its lease runs {held[1] - now:.0f} s more unless renewed)",
                )
            if held is None or held[0] != claim.holder:
                log.info("deployment %s: autoscaler %s takes the lease", name, claim.holder)
            self.leases[name] = (claim.holder, now + claim.ttl_s)
            return AutoscalerLease(deployment=name, holder=claim.holder, expires_in_s=claim.ttl_s)

    def release_autoscaler(self, who: Principal, name: str, holder: str) -> None:
        """Give the lease up (an autoscaler stopping), if `holder` holds it."""
        with self.control.lock:
            self._visible(who, name)
            held = self.leases.get(name)
            if held is not None and held[0] == holder:
                del self.leases[name]

    def _check_lease(self, name: str, holder: str, now: float) -> None:
        held = self.leases.get(name)
        if held is None or held[0] != holder or held[1] <= now:
            owner = f"{held[0]} holds it" if held and held[1] > now else "nobody holds it"
            raise HeadError(
                409, f"autoscaler {holder} does not hold deployment {name}'s lease ({owner})"
            )

    def _autoscaler(self, name: str) -> str | None:
        held = self.leases.get(name)
        return held[0] if held is not None and held[1] > self.control.clock.time() else None

    def delete(self, who: Principal, name: str) -> None:
        def op(tx: Tx) -> None:
            self._fresh(tx)
            dep = self._visible(who, name)
            for r in list(dep.replicas.values()):
                self.controller.cancel(tx, dep, r, f"deployment {name} deleted")
            ss.delete_deployment(tx.conn, name)
            del self.deployments[name]
            self.leases.pop(name, None)
            self._replica_jobs.difference_update(dep.replicas)
            tx.event(tx.now, "serve", f"deployment {name} deleted by {who.user}")

        self.control.call(op)
        self.stats.forget(name)

    def report(self, token: str | None, report: ReplicaReport) -> ReplicaInfo:
        """A replica's wrapper says where its engine listens and whether it is ready
        (authenticated by its job's step token: it reports for itself only)."""

        with self.control.lock:
            self._replica_of(token, report.job_id)  # 401 before queueing anything

        def op(tx: Tx) -> ReplicaInfo:
            self._fresh(tx)
            try:
                dep, r, rec = self._replica_of(token, report.job_id)
            except AuthError as e:  # it stopped meanwhile (an op may raise HeadError only)
                raise HeadError(401, str(e)) from None
            _check_url(self.mirror, rec, report.url)
            ready = report.ready and not r.retiring and serves(rec)
            if (r.url, r.ready) != (report.url, ready):
                r.url, r.ready = report.url, ready
                ss.put_replica(tx.conn, r)
                if ready:
                    health = dep.pool_health(r.pool)
                    if health.failures or health.backoff_until is not None:
                        health.failures, health.backoff_until = 0, None
                        ss.put_health(tx.conn, dep)
                self.controller.reconcile(tx, dep)  # a replica ready: old ones may go
            return _replica_info(r, rec)

        return self.control.call(op)

    def check_replica_token(self, token: str | None) -> None:
        """401 unless `token` is the step token of a running replica job."""
        with self.control.lock:
            self._replica_of(token, None)

    def replica_config(self, token: str | None, job_id: int | None) -> ReplicaConfig:
        """What a replica's wrapper starts (its step token names it)."""
        with self.control.lock:
            dep, r, _rec = self._replica_of(token, job_id)
            spec = dep.spec
            return ReplicaConfig(
                name=dep.name,
                job_id=r.job_id,
                pool=r.pool,  # type: ignore[arg-type]  # a PoolRole, as stored
                generation=r.generation,
                spec=spec,
                engine_key=dep.engine_key,
            )

    # ------------------------------------------------------------------ reads
    def visible(self, who: Principal) -> DeploymentList:
        with self.control.lock:
            deps = sorted(self.deployments.values(), key=lambda d: d.name)
            return DeploymentList(
                deployments=[self._info(d) for d in deps if who.may_see_job(d.owner, d.team)]
            )

    def get(self, who: Principal, name: str) -> DeploymentInfo:
        with self.control.lock:
            return self._info(self._visible(who, name))

    def endpoints(self, who: Principal, name: str) -> Endpoints:
        """The ready replicas (the router's view); it carries the engine key."""
        with self.control.lock:
            dep = self._visible(who, name)
            spec = dep.spec
            jobs = self.mirror.jobs
            ready = sorted(
                (
                    r
                    for r in dep.replicas.values()
                    if r.ready
                    and not r.retiring
                    and r.url
                    and (rec := jobs.get(r.job_id)) is not None
                    and serves(rec)
                ),
                key=lambda r: (r.pool, r.job_id),
            )
            return Endpoints(
                name=dep.name,
                served_model_name=spec.served_model_name or spec.name,
                engine=spec.engine,
                policy=spec.router.policy,
                block_chars=spec.router.block_chars,
                generation=dep.generation,
                engine_key=dep.engine_key,
                endpoints=[
                    Endpoint(
                        job_id=r.job_id,
                        pool=r.pool,  # type: ignore[arg-type]  # a PoolRole, as stored
                        url=r.url or "",
                        slots=r.slots,
                        generation=r.generation,
                    )
                    for r in ready
                ],
            )

    # ------------------------------------------------------------------ the controller
    def reconcile_all(self, tx: Tx) -> None:
        """One controller pass over every deployment (an operation of the control thread)."""
        self._fresh(tx)
        for dep in list(self.deployments.values()):
            self.controller.reconcile(tx, dep)

    # ------------------------------------------------------------------ helpers
    def _visible(self, who: Principal, name: str) -> Deployment:
        dep = self.deployments.get(name)
        if dep is None or not who.may_see_job(dep.owner, dep.team):
            raise HeadError(404, f"no deployment {name!r}")
        return dep

    def _team(self, who: Principal, spec: DeploymentSpec, dep: Deployment | None) -> str:
        if dep is not None and not who.may_see_job(dep.owner, dep.team):
            raise HeadError(409, f"the name {spec.name!r} is taken by another deployment")
        team = spec.team or (dep.team if dep is not None else None)
        team = team or who.default_team or (min(who.teams) if who.teams else None)
        if team is None:
            raise HeadError(422, "team: none given and you have no default team")
        if team not in self.mirror.teams:
            raise HeadError(422, f"team: unknown team {team!r}")
        if not who.may_submit_to(team):
            raise HeadError(403, f"team: you are not a member of team {team!r}")
        qos = spec.qos or "normal"
        if not who.may_use_qos(qos, self.mirror.team_qos.get(team)):
            raise HeadError(403, f"qos: {qos!r} is above your allowance in team {team!r}")
        return team

    def _check_room(self, who: Principal) -> None:
        mine = sum(1 for d in self.deployments.values() if d.owner == who.user)
        if mine >= MAX_DEPLOYMENTS_PER_USER:
            raise HeadError(429, f"you have {mine} deployments, the most one user may have")
        if len(self.deployments) >= MAX_DEPLOYMENTS:
            raise HeadError(429, f"the cluster has {MAX_DEPLOYMENTS} deployments, its limit")

    def _replica_of(
        self, token: str | None, job_id: int | None
    ) -> tuple[Deployment, Replica, JobRecord]:
        """The replica whose running job holds step token `token` (401 if none)."""
        if not token:
            raise AuthError("a replica reports with its job's PHALANX_STEP_TOKEN")
        candidates: Iterable[int] = [job_id] if job_id is not None else list(self._replica_jobs)
        for jid in candidates:
            rec = self.mirror.jobs.get(jid)
            if rec is None or rec.step_token is None:
                continue
            if auth.same_secret(token, rec.step_token):
                for dep in self.deployments.values():
                    r = dep.replicas.get(jid)
                    if r is not None:
                        return dep, r, rec
                raise HeadError(404, f"job {jid} is not a replica of any deployment")
        raise AuthError("not the step token of a running replica job")

    def _info(self, dep: Deployment) -> DeploymentInfo:
        # Retiring ones last, and within the wire's bound (a big pool rolled twice quickly
        # may briefly hold more jobs than it).
        replicas = sorted(dep.replicas.values(), key=lambda r: (r.retiring, r.job_id))
        replicas = replicas[: 2 * MAX_REPLICAS * 2]
        infos = []
        for r in replicas:
            rec = self.mirror.jobs.get(r.job_id)
            if rec is not None:
                infos.append(_replica_info(r, rec))
        pools = []
        for p in dep.spec.pools:
            h = dep.health.get(p.role)
            pools.append(
                PoolStatus(
                    role=p.role,
                    desired=p.replicas,
                    ready=self.controller.ready(dep, p.role, dep.generation),
                    failures=h.failures if h else 0,
                    last_failure=h.last_failure if h else None,
                    backoff_until=h.backoff_until if h else None,
                )
            )
        return DeploymentInfo(
            spec=dep.spec,
            owner=dep.owner,
            generation=dep.generation,
            created_at=dep.created,
            pools=pools,
            replicas=infos,
            team=dep.team,
            stats=self.stats.shown(dep.name),
            autoscaler=self._autoscaler(dep.name),
        )


def _replica_info(r: Replica, rec: JobRecord) -> ReplicaInfo:
    return ReplicaInfo(
        job_id=r.job_id,
        pool=r.pool,  # type: ignore[arg-type]  # a PoolRole, as stored
        generation=r.generation,
        state=rec.state.value,
        url=r.url,
        ready=r.ready and not r.retiring,
        retiring=r.retiring,
        node=rec.placement[0][0] if rec.placement else None,
    )


def _check_spec(spec: DeploymentSpec) -> None:
    """What the wire model allows but a replica job would not (422, nothing changed)."""
    for p in spec.pools:
        if p.gpus_per_replica < 1:
            raise HeadError(
                422, f"pools[{p.role}].gpus_per_replica: replicas are GPU jobs; give at least 1"
            )
        if p.gpus_per_replica > m.MAX_GPUS_PER_NODE:
            raise HeadError(
                422,
                f"pools[{p.role}].gpus_per_replica: a replica is one node; at most "
                f"{m.MAX_GPUS_PER_NODE} GPUs",
            )
    if spec.qos is not None and spec.qos not in QOS_PRIORITY:
        raise HeadError(422, f"qos: unknown qos {spec.qos!r}; known: {', '.join(QOS_PRIORITY)}")
    for what, path in (("engine_path", spec.engine_path), ("runtime_python", spec.runtime_python)):
        if path is not None and not path.startswith("/"):
            raise HeadError(422, f"{what}: must be an absolute path, got {path!r}")


def _check_url(mirror: Any, rec: JobRecord, url: str) -> None:
    """A replica's URL must be http(s) on one of its own job's nodes (the router sends the
    engine key there)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise HeadError(422, f"url: {url!r} is not a URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise HeadError(422, f"url: {url!r} must be http(s)://HOST:PORT")
    addresses = {mirror.nodes[n].address for n, _ in rec.placement if n in mirror.nodes}
    if parts.hostname not in addresses:
        raise HeadError(403, f"url: {parts.hostname} is not the address of the replica's node")
