"""Serving deployments in the head: apply, scale, delete, the replicas' own reports, and the
controller that keeps every pool at its replica count (docs/serving-deploy.md).

A replica is an ordinary job, submitted by the head for the deployment's owner (its team,
QOS, one node, the pool's GPUs), running `RUNTIME_PYTHON -m phalanx.serve.replica`; the
scheduler places, preempts and requeues it like any job. The controller runs on the
control thread, in its transaction (a replica job and its row are stored together, so a
head restart adopts exactly the replicas that exist): it replaces replicas that ended on
their own (with backoff), adds or retires replicas to match the pool's count, and rolls
a changed spec out as a new generation whose replicas replace the old ones only once they
are ready.
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
    DeploymentInfo,
    DeploymentList,
    DeploymentSpec,
    Endpoint,
    Endpoints,
    PoolSpec,
    PoolStatus,
    ReplicaConfig,
    ReplicaInfo,
    ReplicaReport,
    ScaleRequest,
)
from phalanx.head import auth, jobs, lifecycle, store
from phalanx.head import serving_store as ss
from phalanx.head.auth import AuthError, Principal
from phalanx.head.control import ControlThread, HeadError
from phalanx.head.mirror import Tx
from phalanx.head.records import JobRecord
from phalanx.head.serving_store import Deployment, Replica

log = logging.getLogger("phalanx.head")

TICK_S = 1.0  # the controller looks at every deployment this often (and at once on news)
MAX_BACKOFF_S = 300.0
MAX_DEPLOYMENTS_PER_USER = 100
MAX_DEPLOYMENTS = 10_000
REPLICA_WORKDIR = "/tmp"  # the wrapper's cwd; its files go in a private dir
# Fields of a pool that do not change what its replicas run: changing them scales the pool
# (or its autoscaler's bounds), it does not roll out a new generation.
_SCALING_FIELDS = frozenset({"replicas", "min_replicas", "max_replicas", "slo"})


def backoff_s(failures: int) -> float:
    """How long a pool waits before replacing a replica after `failures` in a row: the
    first at once, then 2, 4, 8 … seconds, at most MAX_BACKOFF_S."""
    if failures <= 1:
        return 0.0
    return min(MAX_BACKOFF_S, 2.0 ** (failures - 1))


def shape(spec: DeploymentSpec) -> dict[str, Any]:
    """What the replicas run: the spec without the pools' replica counts and SLOs."""
    out = spec.model_dump(mode="json")
    out["pools"] = [{k: v for k, v in p.items() if k not in _SCALING_FIELDS} for p in out["pools"]]
    return out


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
        self._seen_errors = control.loop_errors
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
        self._replica_jobs = {j for d in loaded.values() for j in d.replicas}
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
            if not self.deployments:
                continue
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
            self.reconcile(tx, dep)
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
            self.reconcile(tx, dep)
            return self._info(dep)

        return self.control.call(op)

    def delete(self, who: Principal, name: str) -> None:
        def op(tx: Tx) -> None:
            self._fresh(tx)
            dep = self._visible(who, name)
            for r in list(dep.replicas.values()):
                self._cancel(tx, dep, r, f"deployment {name} deleted")
            ss.delete_deployment(tx.conn, name)
            del self.deployments[name]
            tx.event(tx.now, "serve", f"deployment {name} deleted by {who.user}")

        self.control.call(op)

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
            ready = report.ready and not r.retiring and rec.state.running
            if (r.url, r.ready) != (report.url, ready):
                r.url, r.ready = report.url, ready
                ss.put_replica(tx.conn, r)
                if ready:
                    health = dep.pool_health(r.pool)
                    if health.failures or health.backoff_until is not None:
                        health.failures, health.backoff_until = 0, None
                        ss.put_health(tx.conn, dep)
                self.reconcile(tx, dep)  # a replica ready: old ones may go
            return _replica_info(r, rec)

        return self.control.call(op)

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
    def list(self, who: Principal) -> DeploymentList:
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
            ready = sorted(
                (r for r in dep.replicas.values() if r.ready and not r.retiring and r.url),
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
        self._fresh(tx)
        for dep in list(self.deployments.values()):
            self.reconcile(tx, dep)

    def reconcile(self, tx: Tx, dep: Deployment) -> None:
        """Bring `dep`'s replicas to its spec (on the control thread, in `tx`)."""
        self._observe(tx, dep)
        roles = {p.role for p in dep.spec.pools}
        for pool in dep.spec.pools:
            self._keep_pool(tx, dep, pool)
        # Pools the spec no longer has: gone once every pool it has is ready.
        if all(self._ready(dep, p.role, dep.generation) >= p.replicas for p in dep.spec.pools):
            for r in list(dep.replicas.values()):
                if r.pool not in roles and not r.retiring:
                    self._cancel(tx, dep, r, f"pool {r.pool} left the spec")

    def _observe(self, tx: Tx, dep: Deployment) -> None:
        """Forget replicas whose jobs ended (one that ended on its own is a failure of its
        pool); one whose job is not running is not ready."""
        for r in list(dep.replicas.values()):
            rec = self.mirror.jobs.get(r.job_id)
            if rec is None:
                del dep.replicas[r.job_id]
                self._replica_jobs.discard(r.job_id)
                ss.drop_replica(tx.conn, r.job_id)
                if not r.retiring:
                    self._failed(tx, dep, r)
                continue
            if (r.ready or r.url) and (not rec.state.running or rec.stopping is not None):
                r.ready, r.url = False, None
                ss.put_replica(tx.conn, r)

    def _failed(self, tx: Tx, dep: Deployment, r: Replica) -> None:
        tx.flush()
        ended = store.job(tx.conn, r.job_id)
        how = "ended"
        if ended is not None:
            how = f"ended {ended.state.value} (exit {ended.exit_code or '?'})"
            why = ended.reason_message or ended.reason
            if why:
                how += f": {why}"
        self._note_failure(tx, dep, r.pool, f"replica job {r.job_id} {how}")

    def _note_failure(self, tx: Tx, dep: Deployment, role: str, what: str) -> None:
        health = dep.pool_health(role)
        health.failures += 1
        health.last_failure = what[:4000]
        wait = backoff_s(health.failures)
        health.backoff_until = tx.now + wait if wait > 0 else None
        ss.put_health(tx.conn, dep)
        later = f"; next replacement in {wait:.0f} s" if wait > 0 else ""
        tx.event(tx.now, "serve", f"deployment {dep.name} pool {role}: {what}{later}")

    def _keep_pool(self, tx: Tx, dep: Deployment, pool: PoolSpec) -> None:
        role, gen, desired = pool.role, dep.generation, pool.replicas
        mine = [r for r in dep.replicas.values() if r.pool == role and not r.retiring]
        current = [r for r in mine if r.generation == gen]
        old = [r for r in mine if r.generation != gen]
        # 1. Too few of this generation: submit (unless the pool is backing off).
        health = dep.pool_health(role)
        missing = desired - len(current)
        if missing > 0 and (health.backoff_until is None or tx.now >= health.backoff_until):
            for _ in range(missing):
                if not self._submit(tx, dep, pool):
                    break
        # 2. Too many: retire the least useful first (not ready, not placed, newest).
        if len(current) > desired:
            extra = sorted(current, key=lambda r: self._keep_rank(r))[desired:]
            for r in extra:
                self._cancel(tx, dep, r, f"scaled to {desired}")
        # 3. Older generations: those not ready go now; ready ones as new ones get ready.
        ready_new = sum(1 for r in current if r.ready)
        keep_old = max(0, desired - ready_new)
        old_ready = sorted((r for r in old if r.ready), key=lambda r: -r.job_id)
        for r in old:
            if not r.ready:
                self._cancel(tx, dep, r, f"generation {gen} replaces it")
        for r in old_ready[keep_old:]:
            self._cancel(tx, dep, r, f"generation {gen} is ready")

    def _keep_rank(self, r: Replica) -> tuple[int, int, int]:
        rec = self.mirror.jobs.get(r.job_id)
        placed = rec is not None and rec.state.running
        return (0 if r.ready else 1, 0 if placed else 1, r.job_id)

    def _ready(self, dep: Deployment, role: str, gen: int) -> int:
        return sum(
            1
            for r in dep.replicas.values()
            if r.pool == role and r.generation == gen and r.ready and not r.retiring
        )

    def _submit(self, tx: Tx, dep: Deployment, pool: PoolSpec) -> bool:
        spec = dep.spec
        python = spec.runtime_python or self.runtime_python
        command = [python, "-m", "phalanx.serve.replica"]
        command += ["--deployment", dep.name, "--pool", pool.role]
        command += ["--generation", str(dep.generation)]
        job = m.JobSpec(
            name=f"serve:{dep.name}:{pool.role}:{dep.generation}",
            command=command,
            launcher="node",
            nodes=1,
            gpus_per_node=pool.gpus_per_replica,
            cpus_per_task=pool.cpus_per_replica,
            mem_mb=pool.mem_mb,
            team=dep.team,
            qos=spec.qos or "normal",
            workdir=REPLICA_WORKDIR,
            requeue=True,  # preempted or its node lost: queued again, same replica
            restart_on_failure=False,  # its engine died: the controller replaces it
            preempt_signal="SIGTERM",  # the wrapper reports not-ready and stops the engine
        )
        try:
            who = self._owner(tx, dep)
            answer = jobs.submit(self.mirror, tx, who, job)
        except HeadError as e:
            self._note_failure(tx, dep, pool.role, f"cannot submit a replica: {e.detail}")
            return False
        job_id = answer.job_ids[0]
        r = Replica(job_id, dep.name, pool.role, dep.generation, pool.slots)
        dep.replicas[job_id] = r
        self._replica_jobs.add(job_id)
        ss.add_replica(tx.conn, r)
        return True

    def _cancel(self, tx: Tx, dep: Deployment, r: Replica, why: str) -> None:
        r.retiring, r.ready = True, False
        rec = self.mirror.jobs.get(r.job_id)
        if rec is not None and rec.stopping is None:
            lifecycle.cancel(self.mirror, tx, rec, tx.now, f"serving ({dep.name}: {why})")
        if dep.name in self.deployments and r.job_id in dep.replicas:
            ss.put_replica(tx.conn, r)

    def _owner(self, tx: Tx, dep: Deployment) -> Principal:
        """The deployment's owner as a submitter (their allowance and teams, as now)."""
        user = store.user_row(tx.conn, dep.owner)
        if user is None:
            raise HeadError(409, f"the deployment's owner {dep.owner!r} no longer exists")
        if user.disabled:
            raise HeadError(409, f"the deployment's owner {dep.owner!r} is disabled")
        member = store.memberships_of(tx.conn, dep.owner)
        qos = store.split_list(user.qos)
        return Principal(
            kind="api",
            token_id=0,
            user=dep.owner,
            admin=bool(user.admin),
            teams=frozenset(t for t, _ in member),
            admin_of=frozenset(t for t, a in member if a),
            default_team=user.default_team,
            qos=None if qos is None else frozenset(qos),
        )

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
        replicas = sorted(dep.replicas.values(), key=lambda r: r.job_id)
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
                    ready=self._ready(dep, p.role, dep.generation),
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
        )


def _replica_info(r: Replica, rec: JobRecord) -> ReplicaInfo:
    return ReplicaInfo(
        job_id=r.job_id,
        pool=r.pool,  # type: ignore[arg-type]  # a PoolRole, as stored
        generation=r.generation,
        state=rec.state.value,
        url=r.url,
        ready=r.ready and not r.retiring,
    )


def _check_spec(spec: DeploymentSpec) -> None:
    for p in spec.pools:
        if p.gpus_per_replica < 1:
            raise HeadError(
                422, f"pools[{p.role}].gpus_per_replica: replicas are GPU jobs; give at least 1"
            )
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
