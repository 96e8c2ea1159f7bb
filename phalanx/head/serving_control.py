"""The serving controller: one pass over a deployment brings its replica jobs to its spec
(on the control thread, in its transaction; head/serving.py decides when).

Per pool: replicas whose jobs ended are forgotten — one that ended on its own is a failure
of its pool, whose replacement waits an exponential backoff after the first; a replica
whose job is not serving is not ready; too few replicas of the current generation are
submitted, too many retired (the least useful first); older generations go as the new
one gets ready (those not ready at once), so a rolling update never has fewer ready
replicas than wanted while capacity allows.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from phalanx.api import models as m
from phalanx.api.serving import DeploymentSpec, PoolSpec
from phalanx.core import JobState
from phalanx.head import jobs, lifecycle, store
from phalanx.head import serving_store as ss
from phalanx.head.auth import Principal
from phalanx.head.control import HeadError
from phalanx.head.mirror import Mirror, Tx
from phalanx.head.records import JobRecord
from phalanx.head.serving_store import Deployment, Replica

MAX_BACKOFF_S = 300.0
# A preempted replica's notice → kill: its wrapper drains (≤ 3.5 s) and stops its engine.
PREEMPT_GRACE_S = 15
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


def serves(rec: JobRecord) -> bool:
    """Whether a replica's job may serve: running, not stopping, not noticed (a preempted
    replica is not ready from its notice on)."""
    return rec.state is JobState.RUNNING and rec.stopping is None


class Controller:
    """Passes over deployments; `replica_jobs`: the job ids of every replica (shared with
    head/serving.py, which reads it to recognise replicas' moves and tokens)."""

    def __init__(self, mirror: Mirror, runtime_python: str, replica_jobs: set[int]) -> None:
        self.mirror = mirror
        self.runtime_python = runtime_python
        self.replica_jobs = replica_jobs

    def due(self, dep: Deployment, now: float) -> bool:
        """Whether a controller pass would change something of `dep` (under the lock)."""
        roles = {p.role for p in dep.spec.pools}
        for r in dep.replicas.values():
            rec = self.mirror.jobs.get(r.job_id)
            if rec is None or ((r.ready or r.url) and not serves(rec)):
                return True
            if not r.retiring and (r.generation != dep.generation or r.pool not in roles):
                return True
        for p in dep.spec.pools:
            live = sum(
                1
                for r in dep.replicas.values()
                if r.pool == p.role and r.generation == dep.generation and not r.retiring
            )
            if live > p.replicas:
                return True
            if live < p.replicas:
                until = dep.pool_health(p.role).backoff_until
                if until is None or now >= until:
                    return True
        return False

    def reconcile(self, tx: Tx, dep: Deployment) -> None:
        """Bring `dep`'s replicas to its spec (on the control thread, in `tx`)."""
        self._observe(tx, dep)
        roles = {p.role for p in dep.spec.pools}
        for pool in dep.spec.pools:
            self._keep_pool(tx, dep, pool)
        # Pools the spec no longer has: gone once every pool it has is ready.
        if all(self.ready(dep, p.role, dep.generation) >= p.replicas for p in dep.spec.pools):
            for r in list(dep.replicas.values()):
                if r.pool not in roles and not r.retiring:
                    self.cancel(tx, dep, r, f"pool {r.pool} left the spec")

    def _observe(self, tx: Tx, dep: Deployment) -> None:
        """Forget replicas whose jobs ended (one that ended on its own is a failure of its
        pool); one whose job is not running is not ready."""
        for r in list(dep.replicas.values()):
            rec = self.mirror.jobs.get(r.job_id)
            if rec is None:
                del dep.replicas[r.job_id]
                self.replica_jobs.discard(r.job_id)
                ss.drop_replica(tx.conn, r.job_id)
                if not r.retiring:
                    self._failed(tx, dep, r)
                continue
            if (r.ready or r.url) and not serves(rec):
                r.ready, r.url = False, None
                ss.put_replica(tx.conn, r)

    def _failed(self, tx: Tx, dep: Deployment, r: Replica) -> None:
        tx.flush()
        ended = store.job(tx.conn, r.job_id)
        if ended is None:
            return  # its submit was rolled back: it never ran, nothing failed
        how = f"ended {ended.state.value} (exit {ended.exit_code or '?'})"
        # Why, in the words `phalanx show` uses: the move that stopped it ("rank 0 on n1
        # exited with code 1", a node failure), else the reason it ended with.
        stops = [
            e.message
            for e in store.job_events(tx.conn, r.job_id)
            if e.to_state == "CG" or e.kind == "nodefail"
        ]
        why = stops[-1] if stops else ended.reason_message or ended.reason
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
                self.cancel(tx, dep, r, f"scaled to {desired}")
        # 3. Older generations: those not ready go now; ready ones as new ones get ready.
        ready_new = sum(1 for r in current if r.ready)
        keep_old = max(0, desired - ready_new)
        old_ready = sorted((r for r in old if r.ready), key=lambda r: -r.job_id)
        for r in old:
            if not r.ready:
                self.cancel(tx, dep, r, f"generation {gen} replaces it")
        for r in old_ready[keep_old:]:
            self.cancel(tx, dep, r, f"generation {gen} is ready")

    def _keep_rank(self, r: Replica) -> tuple[int, int, int]:
        rec = self.mirror.jobs.get(r.job_id)
        placed = rec is not None and rec.state.running
        return (0 if r.ready else 1, 0 if placed else 1, r.job_id)

    def ready(self, dep: Deployment, role: str, gen: int) -> int:
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
        try:
            job = self._job_spec(dep, pool, command)
        except ValidationError as e:  # apply checked what it could: note it, do not crash
            problem = m.validation_detail(e.errors(), limit=3)
            self._note_failure(tx, dep, pool.role, f"cannot submit a replica: {problem}")
            return False
        try:
            who = self._owner(tx, dep)
            answer = jobs.submit(self.mirror, tx, who, job)
        except HeadError as e:
            self._note_failure(tx, dep, pool.role, f"cannot submit a replica: {e.detail}")
            return False
        job_id = answer.job_ids[0]
        r = Replica(job_id, dep.name, pool.role, dep.generation, pool.slots)
        dep.replicas[job_id] = r
        self.replica_jobs.add(job_id)
        ss.add_replica(tx.conn, r)
        return True

    @staticmethod
    def _job_spec(dep: Deployment, pool: PoolSpec, command: list[str]) -> m.JobSpec:
        spec = dep.spec
        return m.JobSpec(
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
            preempt_grace_s=PREEMPT_GRACE_S,
        )

    def cancel(self, tx: Tx, dep: Deployment, r: Replica, why: str) -> None:
        r.retiring, r.ready = True, False
        rec = self.mirror.jobs.get(r.job_id)
        if rec is not None and rec.stopping is None:
            lifecycle.cancel(self.mirror, tx, rec, tx.now, f"serving ({dep.name}: {why})")
        if r.job_id in dep.replicas:  # (delete drops its row right after)
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
