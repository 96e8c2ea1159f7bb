"""The head as one object: auth, job and node operations, agent protocol and views."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import secrets
import ssl
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from prometheus_client import Counter
from pydantic import ValidationError

from phalanx.api import models as m
from phalanx.core import DrainCause
from phalanx.head import (
    answers,
    auth,
    intervals,
    jobcontrol,
    jobs,
    leases,
    lifecycle,
    nodestates,
    reports,
    store,
    views,
)
from phalanx.head.auth import AuthError, Forbidden, Principal
from phalanx.head.certs import AgentSigner
from phalanx.head.control import ControlThread, HeadError, _core_team
from phalanx.head.metrics import HeadMetrics
from phalanx.head.mirror import Tx
from phalanx.head.records import QOS_PRIORITY, JobRecord, NodeRecord
from phalanx.head.scheduling import pending_reason
from phalanx.head.serving import Serving
from phalanx.head.serving_metrics import ServingCollector
from phalanx.head.telemetry import GpuSamples
from phalanx.head.tsdb import TelemetryStore, retention
from phalanx.head.usage import Usage
from phalanx.head.utilhistory import UtilHistory
from phalanx.tls import TLSError


class Head:
    def __init__(self, control: ControlThread) -> None:
        self.control = control
        self.mirror = control.mirror
        self._principals: dict[str, Principal] = {}
        # Long polls held per node, each its own future (`_hold`).
        self._wakers: dict[str, list[asyncio.Future[None]]] = {}
        # Each node's peers as answered, (peer list, registrations, (name, URL) pairs).
        self._peer_pairs: dict[str, tuple[list[str], int, tuple[tuple[str, str], ...]]] = {}
        self._registrations = 0
        self._unlaunchable_jobs: set[tuple[int, int]] = set()  # (job id, epoch) failed so
        self.loop: asyncio.AbstractEventLoop | None = None
        # Signs agents' API certificates (a head serving TLS with its own CA), and how the
        # head checks them when it calls an agent (log reads, fault injection).
        self.signer: AgentSigner | None = None
        self.agent_verify: ssl.SSLContext | bool = True
        self.now: Callable[[], float] = control.clock.time  # token expiry, node liveness
        self.samples = GpuSamples()  # each node's latest GPU telemetry (memory only)
        self.tsdb = TelemetryStore(
            control.engine, control.clock.time, self.samples, retention(control.mirror.settings)
        )  # GPU telemetry and progress history, stored off the control thread (head/tsdb.py)
        self.usage = Usage(control, self.samples)  # idle GPUs and accounting (head/usage.py)
        self.serving = Serving(control)  # serving deployments (head/serving.py)
        self.metrics = HeadMetrics(self.mirror, control.lock)  # Prometheus (head/metrics.py)
        self.metrics.registry.register(ServingCollector(self.serving))  # per deployment
        self.metrics.usage = self.usage  # the idle-GPU series
        control.on_committed.append(self.metrics.observe)
        self.beats = Counter(
            "phalanx_heartbeats",
            "Agent heartbeats by kind: full reports, deltas, lease renewals (deltas with no "
            "news), deltas refused (base unknown: a full report asked), stale reports.",
            ("kind",),
            registry=self.metrics.registry,
        )
        self._beat_kinds = {
            k: self.beats.labels(k) for k in ("full", "delta", "lease", "refused", "stale")
        }
        # The overview's utilisation chart, minute by minute (head/utilhistory.py).
        holders = self.metrics.gpu_holders
        self.util_history = UtilHistory(lambda node: frozenset(holders.current().get(node, ())))
        self.samples.subscribe(self.util_history.add)
        control.on_commit = self._on_commit
        # What agents accept from each other when they ask one another about the head during
        # an outage (docs/fault-tolerance.md#head-outages). Each head has its own; agents
        # also accept the one before, so a restarted head's agents still understand those
        # that have not heard from it yet. Never given to jobs.
        self.peer_secret = secrets.token_urlsafe(32)

    # ------------------------------------------------------------------ auth
    def authenticate(self, token: str | None) -> Principal:
        if not token:
            raise AuthError("missing token: send `Authorization: Bearer TOKEN`")
        hashed = auth.token_hash(token)
        principal = self._principals.get(hashed)
        if principal is None:
            principal = self._load_principal(hashed)
            self._principals[hashed] = principal
        if principal.expires is not None and self.now() >= principal.expires:
            raise AuthError("expired token: ask for a new one (`phalanx token create`)")
        return principal

    def _load_principal(self, hashed: str) -> Principal:
        with self.control.engine.connect() as conn:
            row = store.token_by_hash(conn, hashed)
            if row is None:
                raise AuthError("unknown or revoked token")
            if row.kind != "api":
                return Principal(
                    kind=row.kind,
                    token_id=row.id,
                    node=row.node,
                    expires=row.expires,
                    single_use=bool(row.single_use),
                    bind_nodes=tuple(store.split_list(row.bind_nodes) or ()),
                    bind_addresses=tuple(store.split_list(row.bind_addresses) or ()),
                )
            user = store.user_row(conn, row.user)
            if user is None:
                raise AuthError("the token's user no longer exists")
            if user.disabled:
                raise AuthError(f"user {row.user!r} is disabled: ask an admin")
            member = store.memberships_of(conn, row.user)
            qos = store.split_list(user.qos)
            return Principal(
                kind="api",
                token_id=row.id,
                user=row.user,
                admin=bool(user.admin),
                teams=frozenset(t for t, _ in member),
                admin_of=frozenset(t for t, a in member if a),
                default_team=user.default_team,
                expires=row.expires,
                qos=None if qos is None else frozenset(qos),
            )

    def forget_principals(self, node: str | None = None, token_id: int | None = None) -> None:
        """Forget cached principals: all of them, or (given `node`) node `node`'s
        credentials and the token `token_id`."""
        if node is None:
            self._principals.clear()
            return
        for hashed, p in list(self._principals.items()):
            if (p.kind == "node" and p.node == node) or (
                token_id is not None and p.token_id == token_id
            ):
                self._principals.pop(hashed, None)

    @staticmethod
    def require_user(who: Principal) -> Principal:
        if who.kind != "api":
            raise Forbidden("this endpoint needs a user's API token")
        return who

    @staticmethod
    def require_admin(who: Principal) -> Principal:
        if who.kind != "api" or not who.admin:
            raise Forbidden("this needs an admin token")
        return who

    # ------------------------------------------------------------------ jobs
    def submit(self, who: Principal, spec: m.JobSpec) -> m.SubmitResponse:
        return self.control.call(lambda tx: jobs.submit(self.mirror, tx, who, spec))

    def control_jobs(self, fn: Callable[[Tx], list[JobRecord]]) -> m.JobList:
        """Run a job control (head.jobcontrol) and answer with the jobs it acted on."""
        recs = self.control.call(fn)
        with self.control.lock:
            addresses = self.mirror.addresses()
            wires = [r.wire(addresses, pending_reason(self.mirror, r)) for r in recs]
        with self.control.engine.connect() as conn:
            views.add_run_times(conn, wires, self.now())
        return m.JobList(jobs=[m.JobInfo.model_validate(w) for w in wires])

    def job_id(self, ref: str) -> int:
        """The id of the one job `ref` (`123`, `123_4`) names, live or ended (404: none)."""
        first, task = jobcontrol.parse_ref(ref)
        if task is None:
            return first
        with self.control.lock:
            found = jobcontrol.task_id(self.mirror, first, task)
        if found is None:
            with self.control.engine.connect() as conn:
                ended = store.array_task(conn, first, task)
            if ended is None:
                raise HeadError(404, f"no job {ref}")
            found = ended.id
        return found

    def job_info(self, rec: JobRecord, live_reason: bool = False) -> m.JobInfo:
        """A job's wire view with its run times over every run (views.add_run_times);
        `live_reason`: a pending job's reason from the last cycle."""
        with self.control.lock:
            reason = pending_reason(self.mirror, rec) if live_reason else None
            wire = rec.wire(self.mirror.addresses(), reason)
        with self.control.engine.connect() as conn:
            views.add_run_times(conn, [wire], self.now())
        return m.JobInfo.model_validate(wire)

    def list_jobs(
        self,
        who: Principal,
        active: bool,
        ended: bool,
        user: str | None,
        team: str | None,
        states: set[str] | None,
        since: float | None,
        limit: int,
        array: int | None = None,
        ids: set[int] | None = None,
    ) -> list[dict[str, Any]]:
        """The jobs `who` may see that match, as JobInfo's JSON-ready dicts (see
        JobRecord.wire): live ones from the mirror, ended ones from the database; `ids`:
        only these jobs (an array's id names all its tasks)."""
        out: list[dict[str, Any]] = []
        if active or not ended:
            with self.control.lock:
                addresses = self.mirror.addresses()
                for rec in self.mirror.jobs.values():
                    if array is not None and rec.array_job_id != array:
                        continue
                    if ids is not None and rec.id not in ids and rec.array_job_id not in ids:
                        continue
                    if _visible(who, rec) and _matches(rec, user, team, states):
                        out.append(rec.wire(addresses, pending_reason(self.mirror, rec)))
                        if len(out) >= limit:
                            break
        if ended:
            teams = None if who.admin else who.teams | who.admin_of
            scope = None if who.admin else who.user
            with self.control.lock:
                addresses = self.mirror.addresses()
            with self.control.engine.connect() as conn:
                for rec in store.ended_jobs(conn, since, scope, teams, limit, array, ids):
                    if _visible(who, rec) and _matches(rec, user, team, states):
                        out.append(rec.wire(addresses))
        out = out[:limit]
        with self.control.engine.connect() as conn:
            views.add_run_times(conn, out, self.now())
        return out

    def job_record(self, who: Principal, job_id: int) -> JobRecord:
        with self.control.lock:
            rec = self.mirror.jobs.get(job_id)
        if rec is None:
            with self.control.engine.connect() as conn:
                rec = store.job(conn, job_id)
        if rec is None:
            raise HeadError(404, f"no job {job_id}")
        if not _visible(who, rec):
            raise HeadError(403, f"job {job_id} belongs to {rec.user} (team {rec.team})")
        return rec

    def private_job_record(self, who: Principal, job_id: int) -> JobRecord:
        """A job whose private parts (environment, logs) `who` may read: the owner's, a
        team admin's, an admin's; a teammate gets 403."""
        rec = self.job_record(who, job_id)
        if not who.may_see_job(rec.user, rec.team):
            raise HeadError(
                403,
                f"job {job_id}'s logs and environment are {rec.user}'s (and team {rec.team}'s "
                "admins'); teammates see its metadata only",
            )
        return rec

    def job_detail(self, who: Principal, job_id: int) -> m.JobDetail:
        rec = self.job_record(who, job_id)
        with self.control.engine.connect() as conn:
            events = store.job_events(conn, job_id)
        info = self.job_info(rec, live_reason=True)
        now = self.now()
        with self.control.lock:
            progress = [rec.progress[r] for r in sorted(rec.progress)]
            placement = list(rec.placement) if rec.state.holds_gpus else []
            inventory = {
                n: list(self.mirror.nodes[n].gpus) for n, _ in placement if n in self.mirror.nodes
            }
        gpus = self.samples.of_job(placement, inventory, now)
        spec, hidden = rec.spec, False
        if (spec.env or spec.notify_url) and not who.may_see_job(rec.user, rec.team):
            # A webhook URL is a secret as much as a variable is (chat hooks carry a key).
            private: dict[str, Any] = {"env": {}, "notify_url": None, "notify_on": None}
            spec, hidden = spec.model_copy(update=private), True
        return m.JobDetail(
            job=info, spec=spec, events=events, progress=progress, gpus=gpus, env_hidden=hidden
        )

    def check_step_token(self, job_id: int, token: str | None) -> None:
        with self.control.lock:
            rec = self.mirror.jobs.get(job_id)
            expected = rec.step_token if rec is not None else None
        if not token or expected is None:
            raise AuthError("progress needs the running job's PHALANX_STEP_TOKEN")
        if not auth.same_secret(token, expected):
            raise AuthError("not this job's step token")

    def record_progress(self, job_id: int, token: str, report: m.JobProgress) -> None:
        """A running job's own report, authenticated by its step token (PHALANX_STEP_TOKEN)."""
        self.check_step_token(job_id, token)
        with self.control.lock:
            rec = self.mirror.jobs.get(job_id)
            if rec is not None:
                rec.progress[report.rank] = report
                rec.progress_at[report.rank] = self.now()
                self.metrics.progress(rec, report)
                self.control.changes += 1  # the dashboard's charts follow it
        self.tsdb.progress(job_id, report)

    def log_source(self, rec: JobRecord, rank: int) -> NodeRecord:
        """The node that holds rank `rank`'s logs."""
        n = len(rec.placement)
        if not n and rec.state.terminal:
            # 404, not the 409 of a job still queued: `logs -f` waits out a 409 for the job
            # to start, and this one never will.
            if rec.epoch == 0:
                raise HeadError(
                    404,
                    f"job {rec.id} ended ({rec.state.value}) without ever running, so it has "
                    "no logs",
                )
            raise HeadError(
                404,
                f"job {rec.id} ended ({rec.state.value}) while queued for a restart; the head "
                "no longer knows which nodes hold its earlier runs' logs",
            )
        if not n:
            raise HeadError(409, f"job {rec.id} has not started, so it has no logs yet")
        if rec.spec.launcher == "batch":
            node_rank = 0 if rank == 0 else -1
        elif rec.spec.launcher == "node":
            node_rank = rank
        else:
            node_rank = rank // rec.spec.gpus_per_node
        if not 0 <= node_rank < n:
            raise HeadError(404, f"job {rec.id} has no rank {rank}")
        node = self.mirror.nodes.get(rec.placement[node_rank][0])
        if node is None:
            raise HeadError(404, f"the node of rank {rank} is gone")
        return node

    # ------------------------------------------------------------------ nodes
    def nodes(self) -> m.NodeList:
        return m.NodeList.model_validate({"nodes": self.node_rows()})

    def node_rows(self) -> list[dict[str, Any]]:
        """Every node as NodeInfo's JSON dict, by name. Only the node's own fields are read
        under the control lock (10,000 nodes: the loop waits milliseconds, not the whole
        listing); their GPU readings are added after it."""
        now = self.now()
        with self.control.lock:
            jobs, out = self.mirror.jobs, []
            for node in sorted(self.mirror.nodes.values(), key=lambda n: n.name):
                ids = sorted(self.mirror.node_jobs.get(node.name, set()))
                used = sum(
                    len(g)
                    for i in ids
                    if (rec := jobs.get(i)) is not None
                    for name, g in rec.placement
                    if name == node.name
                )
                out.append(node.wire(ids, used, now))
        readings = self.samples.latest_all()
        for row in out:
            reading = readings.get(row["name"])
            if reading is not None:
                row["gpu_telemetry"] = [g.model_dump() for g in reading.gpus]
                row["telemetry_age_s"] = max(0.0, now - reading.time)
        return out

    # ------------------------------------------------------------------ standing
    def priorities(self, who: Principal) -> m.PriorityList:
        """The queue in the scheduler's order (`phalanx priority`): the jobs `who` may see."""
        with self.control.lock:
            jobs = self.mirror.jobs
            visible = None if who.admin else {i for i, r in jobs.items() if _visible(who, r)}
            qos = {i: r.qos for i, r in jobs.items()}
            return views.priorities(self.mirror.core, self.now(), qos, visible)

    def shares(self) -> m.ShareList:
        """Every team's quota, use and fair-share standing (`phalanx share`)."""
        with self.control.lock:
            return views.shares(self.mirror.core, self.now())

    def set_drain(self, name: str, reason: str | None) -> m.NodeInfo:
        def op(tx: Tx) -> None:
            node = self.mirror.nodes.get(name)
            if node is None:
                raise HeadError(404, f"no node {name!r}")
            now = tx.now
            if reason is not None:
                nodestates.drain(self.mirror, tx, node, DrainCause.ADMIN, reason, now, "drain")
            else:
                nodestates.resume(self.mirror, tx, node, "back in service", now, "resume")

        self.control.call(op)
        return next(n for n in self.nodes().nodes if n.name == name)

    # ------------------------------------------------------------------ agents
    def register(
        self, who: Principal, req: m.RegisterRequest, peer: str | None = None
    ) -> m.RegisterResponse:
        """A node joins: with a join token (its bindings allow this name and address, and
        no live node holds the name), or again as itself with its own node credential (an
        agent restart). Either way it gets a fresh node credential; the old one is revoked."""
        if who.kind == "node":
            if who.node != req.name:
                raise Forbidden(f"this node credential is node {who.node!r}'s, not {req.name!r}")
        elif who.kind == "join":
            refusal = auth.binding_refusal(who, req.name, req.address, peer)
            if refusal is not None:
                raise Forbidden(refusal)
        else:
            raise Forbidden("agents register with a join token")
        token = auth.new_token("node")
        agent_cert = self._agent_cert(req)  # a bad request changes nothing

        def op(tx: Tx) -> None:
            now = tx.now
            old = self.mirror.nodes.get(req.name)
            if who.kind == "join":
                if old is not None and self._holds_name(old, now):
                    raise HeadError(
                        409,
                        f"node {req.name!r} is registered and alive (its last heartbeat "
                        f"{now - (old.last_heartbeat or now):.0f} s ago): a join token cannot "
                        "take over a live node's name; restart the agent with its state dir "
                        "(it re-registers with its own credential), wait until the node is "
                        f"down, or have an admin run `phalanx admin node replace {req.name}`",
                    )
                if who.single_use and not store.use_single_use_token(tx.conn, who.token_id):
                    raise HeadError(409, "this single-use join token was used already")
            nodestates.register(self.mirror, tx, req, now)
            self._registrations += 1  # its agent URL may be new: peers' pairs built again
            self.mirror.held.forget(req.name)  # a new agent run: its reports start afresh
            # Its address and agent URL are in the answers of every node it shares a job with.
            shared = (self.mirror.jobs.get(j) for j in self.mirror.node_jobs.get(req.name, ()))
            partners = {n for r in shared if r is not None for n, _ in r.placement}
            self.mirror.answers.forget({req.name, *partners})
            store.revoke_node_tokens(tx.conn, req.name)
            store.add_token(tx.conn, auth.token_hash(token), "node", None, req.name, "", now)

        self.control.call(op)
        # The node's old credential (and a spent single-use join token) revoked: forget
        # those, not every principal (a join storm would send every node's next heartbeat
        # to the database for its token: O(nodes²) lookups while 10,000 nodes join).
        self.forget_principals(node=req.name, token_id=who.token_id if who.single_use else None)
        self.samples.forget(req.name)  # a new node under the name: not its GPUs' readings
        s = self.mirror.settings
        return m.RegisterResponse(
            node_token=token,
            heartbeat_s=intervals.heartbeat_s(s, len(self.mirror.nodes)),
            lease_s=s.lease_s,
            agent_cert=agent_cert,
        )

    def _agent_cert(self, req: m.RegisterRequest) -> str | None:
        """The agent's API certificate, for its registered name and address only."""
        if req.csr is None or self.signer is None:
            return None
        try:
            return self.signer.sign(req.csr, list(dict.fromkeys([req.address, req.name])))
        except TLSError as e:
            raise HeadError(422, f"csr: {e}") from None

    def _holds_name(self, node: NodeRecord, now: float) -> bool:
        """Whether a registered node still holds its name: it heartbeat within the lease."""
        last = node.last_heartbeat
        return last is not None and now - last < self.mirror.settings.lease_s

    def replace_node(self, name: str) -> m.NodeInfo:
        """An admin frees a node's name: its credential is revoked (its agent can no longer
        heartbeat, so it fences itself) and it counts as silent, so a join token may
        register a new node under the name at once; its jobs are requeued as for a node
        that died."""

        def op(tx: Tx) -> None:
            node = self.mirror.nodes.get(name)
            if node is None:
                raise HeadError(404, f"no node {name!r}")
            store.revoke_node_tokens(tx.conn, name)
            node.last_heartbeat = tx.now - self.mirror.settings.lease_s - 1
            tx.event(tx.now, "node_replace", "credential revoked by an admin", node=name)
            tx.kick = True

        self.control.call(op)
        self.forget_principals()
        return next(n for n in self.nodes().nodes if n.name == name)

    async def heartbeat(self, who: Principal, hb: m.Heartbeat) -> bytes:
        """Apply an agent's report (full or delta: head/deltas.py) and answer its
        DesiredState as JSON, held while nothing changes for the node (long poll)."""
        if who.kind != "node":
            raise Forbidden("heartbeats need a node credential")
        if who.node != hb.name:
            raise Forbidden(f"this node credential is node {who.node!r}'s, not {hb.name!r}")
        # Until its lease is renewed or its report applied, and again while its answer is
        # built, this heartbeat is part of the head's backlog (head/overload.py).
        backlog = self.control.backlog
        with backlog.handling():
            kind = await self._take(hb)
        if kind == "refused":
            with backlog.handling():
                return await self._answer(hb.name, full_report=True)
        if hb.gpus:
            self.samples.observe(hb.name, hb.gpus, self.now())
        node = self.mirror.nodes[hb.name]
        if hb.wait_s > 0 and node.version == hb.version:
            await self._hold(hb.name, hb.wait_s)
        with backlog.handling():
            return await self._answer(hb.name)

    async def _take(self, hb: m.Heartbeat) -> str:
        """Renew the lease or apply the report: the kind of heartbeat it was (counted)."""
        if self._renew_lease(hb):
            kind = "lease"
        else:

            def op(tx: Tx) -> str:
                node = self.mirror.nodes.get(hb.name)
                if node is None:
                    raise HeadError(404, f"node {hb.name!r} is not registered")
                if self.mirror.held.stale(hb):  # a long poll the agent gave up on, late
                    reports.renew(self.mirror, tx, node, tx.now)
                    return "stale"
                full = self.mirror.held.resolve(hb)
                if full is None:  # a delta on a base the head does not hold: ask for all
                    reports.renew(self.mirror, tx, node, tx.now)
                    return "refused"
                reports.heartbeat(self.mirror, tx, node, full, tx.now)
                return "full" if hb.delta is None else "delta"

            kind = await self.control.run_async(op)
        self._beat_kinds[kind].inc()
        return kind

    async def _answer(self, name: str, full_report: bool = False) -> bytes:
        """`desired_json` for the event loop: a cached answer without the control lock; one
        to build waits for the lock in a worker thread, not on the loop."""
        body = self._cached_json(name, full_report)
        if body is None:
            body = await asyncio.to_thread(self.desired_json, name, full_report)
        return body

    def _renew_lease(self, hb: m.Heartbeat) -> bool:
        """A delta with no news renews the node's lease here, without the control thread
        or its lock (the kubelet's Lease, apart from its status); False: apply it as a
        report."""
        if hb.delta is None:
            return False
        # Never the control lock: the control thread may hold it through a long batch, and
        # every heartbeat would wait for it (head/leases.py: how this orders with the clock).
        mirror = self.mirror
        node = mirror.nodes.get(hb.name)
        return mirror.held.renew_lease(hb, lambda: leases.renew(mirror.leases, node, self.now()))

    def _on_commit(self, nodes: set[str]) -> None:
        loop = self.loop
        if loop is not None:
            loop.call_soon_threadsafe(self._wake, set(nodes))

    async def _hold(self, name: str, wait_s: float) -> None:
        """Hold a long poll until `name`'s desired state changes (`_wake`) or `wait_s`
        passes. A bare future and one timer: at 10,000 nodes an idle head holds 3,750 of
        these a second, and `asyncio.wait_for` on an Event (a task, an event and a waiter
        each) took its idle CPU from 47 % to 59 % of a core (bench/fleet.py, README.md)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        held = self._wakers.setdefault(name, [])
        held.append(waiter)
        timer = loop.call_later(wait_s, _release, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            if self._wakers.get(name) is held:
                with contextlib.suppress(ValueError):
                    held.remove(waiter)
                if not held:
                    del self._wakers[name]

    def _wake(self, nodes: Iterable[str]) -> None:
        for name in nodes:
            for waiter in self._wakers.pop(name, ()):
                _release(waiter)

    def desired(self, name: str) -> m.DesiredState:
        """`name`'s whole DesiredState (what `desired_json` answers, as a model)."""
        return m.DesiredState.model_validate_json(self.desired_json(name))

    def desired_json(self, name: str, full_report: bool = False) -> bytes:
        """`name`'s DesiredState as JSON: built once per change of what it is made of
        (head/answers.py), with this answer's acknowledgements and intervals in front.
        `full_report`: ask the agent for a full report next."""
        body = self._cached_json(name, full_report)
        if body is not None:
            return body
        with self.control.lock:
            node = self.mirror.nodes[name]
            key, names, peers = self._answer_key(name, node)
            body = self.mirror.answers.get(name, key)
            if body is None:
                body = self._desired_body(name, node.version, peers)
                self.mirror.answers.put(name, key, body)
            return self._complete(name, node, names, body, full_report)

    def _answer_key(
        self, name: str, node: NodeRecord
    ) -> tuple[Hashable, list[str], tuple[tuple[str, str], ...]]:
        """What `name`'s cached answer is keyed by (head/answers.py), its peers' names and
        (name, agent URL) pairs. Safe without the control lock: peer lists are replaced,
        never changed in place, and each value read is one the control thread stored."""
        nodes = self.mirror.nodes
        names = self.mirror.peer_lists.get(name, [])
        generation = self.mirror.answers.generation
        # The (name, URL) pairs of its peers, built once per peer list (lists are replaced
        # when picked again, every 5 s) and registration (a peer's URL may change).
        made = self._peer_pairs.get(name)
        if made is not None and made[0] is names and made[1] == self._registrations:
            peers = made[2]
        else:
            peers = tuple((p, n.agent_url) for p in names if (n := nodes.get(p)) is not None)
            self._peer_pairs[name] = (names, self._registrations, peers)
        return (node.version, generation, peers), names, peers

    def _cached_json(self, name: str, full_report: bool) -> bytes | None:
        """`name`'s answer from the cache, without the control lock (None: build it).

        A cache entry holds the body built, under the lock, for exactly the key read here
        (the node's version first): the answer is what the head would have said at the
        moment that version was current, as if this request had come a moment earlier —
        the same as an answer delayed on the network. A node whose jobs moved has a new
        version, so its old answer no longer matches."""
        node = self.mirror.nodes.get(name)
        if node is None:
            return None
        key, names, _ = self._answer_key(name, node)
        body = self.mirror.answers.get(name, key)
        if body is None:
            return None
        return self._complete(name, node, names, body, full_report)

    def _complete(
        self, name: str, node: NodeRecord, names: list[str], body: bytes, full_report: bool
    ) -> bytes:
        s = self.mirror.settings
        self.mirror.peers_sent[name] = names  # what the head checks should it go silent
        return answers.complete(
            body,
            heartbeat_s=intervals.heartbeat_s(s, len(self.mirror.nodes)),
            lease_s=s.lease_s,
            health_ack=node.health_seq,
            report_ack=self.mirror.held.ack(name),
            full_report=full_report,
            catching_up=self.control.rejoin.active,
        )

    def _desired_body(self, name: str, version: int, peers: tuple[tuple[str, str], ...]) -> bytes:
        """`name`'s DesiredState JSON without the per-answer fields (under the lock)."""
        s = self.mirror.settings
        assignments = []
        for job_id in sorted(self.mirror.node_jobs.get(name, set())):
            rec = self.mirror.jobs.get(job_id)
            if rec is None or rec.stopping is not None or not rec.state.running:
                continue
            try:
                assignments.append(self._assignment(rec, name))
            except ValidationError as e:  # stored before the API bounded it: fail it
                self._unlaunchable(rec, name, e)
        state = m.DesiredState(
            version=version,
            jobs=assignments,
            heartbeat_s=s.heartbeat_s,
            lease_s=s.lease_s,
            kill_grace_s=s.kill_grace_s,
            peers=[m.Peer(name=p, agent_url=url) for p, url in peers],
            peer_secret=self.peer_secret,
            requeue_margin_s=s.requeue_margin_s,
            max_outage_s=s.max_outage_s,
        )
        return state.model_dump_json(exclude=set(answers.PER_ANSWER)).encode()

    def _unlaunchable(self, rec: JobRecord, node: str, e: ValidationError) -> None:
        """A job no agent could accept (a NUL in its command, stored before the API refused
        one): leave it out of every desired state and fail it with LaunchFailed, once."""
        key = (rec.id, rec.epoch)
        if key in self._unlaunchable_jobs:
            return
        self._unlaunchable_jobs.add(key)
        problems = m.validation_detail(e.errors(), limit=5)

        def op(tx: Tx) -> None:
            live = self.mirror.jobs.get(key[0])
            if live is not None and live.epoch == key[1]:
                detail = f"its assignment on {node} is invalid: {problems}"
                lifecycle.launch_failed(self.mirror, tx, live, detail, tx.now, node=node)

        self.control.submit_op(op)

    def _assignment(self, rec: JobRecord, node: str) -> m.Assignment:
        names = [n for n, _ in rec.placement]
        nodes = [self.mirror.nodes[n] for n in names]
        spec = rec.spec
        env = dict(spec.env)
        if self.mirror.settings.public_url:
            env["PHALANX_HEAD"] = self.mirror.settings.public_url
        assert rec.step_token is not None
        return m.Assignment(
            job_id=rec.id,
            epoch=rec.epoch,
            name=rec.name,
            user=rec.user,
            launcher=spec.launcher,
            command=spec.command,
            script=spec.script,
            workdir=spec.workdir,
            env=env,
            gpus=list(rec.placement[names.index(node)][1]),
            node_rank=names.index(node),
            nodes=names,
            addresses=[n.address for n in nodes],
            agent_urls=[n.agent_url for n in nodes],
            gpus_per_node=spec.gpus_per_node,
            ntasks_per_node=spec.ntasks_per_node,
            cpus_per_task=spec.cpus_per_task,
            mem_mb=spec.mem_mb,
            master_addr=nodes[0].address,
            master_port=rec.master_port,
            restart_count=rec.restart_count,
            submit_dir=spec.workdir,
            output=spec.output,
            error=spec.error,
            array_job_id=rec.array_job_id,
            array_task_id=rec.array_task_id,
            time_limit_s=spec.time_limit_s,
            step_token=rec.step_token,
            account=rec.account,
            team=rec.team,
            checkpoint_dir=spec.checkpoint_dir or default_checkpoint_dir(spec.workdir, rec.id),
            preempt_signal=spec.preempt_signal,
            preempt_grace_s=(
                self.mirror.settings.preempt_grace_s
                if spec.preempt_grace_s is None
                else float(spec.preempt_grace_s)
            ),
            notices=list(rec.notices),
            **self._unix_account(rec.user),
            **_array_summary(spec.array if rec.array_job_id is not None else None),
        )

    def _unix_account(self, user: str) -> dict[str, int | None]:
        """The uid/gid an admin mapped `user` to; on a personal cluster (`phalanx up`) an
        unmapped user runs as the head's own account; otherwise none (the node looks the
        account up by the user's name)."""
        uid, gid = self.mirror.unix_accounts.get(user, (None, None))
        if uid is None and self.mirror.settings.users_map_to_self:
            uid, gid = os.getuid(), os.getgid()
        return {"uid": uid, "gid": gid}

    # ------------------------------------------------------------------ admin
    def whoami(self, who: Principal) -> m.WhoAmI:
        assert who.user is not None
        return m.WhoAmI(
            user=who.user,
            role=who.role,
            teams=sorted(who.teams),
            admin_of=sorted(who.admin_of),
            default_team=who.default_team,
        )

    def put_team(self, team: m.TeamSpec) -> m.TeamInfo:
        _check_qos_names(team.qos)

        def op(tx: Tx) -> None:
            store.put_team(tx.conn, team, tx.now)
            core_team = _core_team(team)
            self.mirror.teams[team.name] = core_team
            if team.qos is None:
                self.mirror.team_qos.pop(team.name, None)
            else:
                self.mirror.team_qos[team.name] = frozenset(team.qos)
            if self.mirror.core is not None:
                self.mirror.core_dirty = True  # quotas and cohorts changed: rebuild
            tx.kick = True

        self.control.call(op)
        return next(t for t in self.teams().teams if t.name == team.name)

    def teams(self) -> m.TeamList:
        with self.control.engine.connect() as conn:
            members = store.team_members(conn)
            specs = store.all_teams(conn)
        with self.control.lock:
            core = self.mirror.core
            usage = dict(core.usage) if core is not None else {}
        return m.TeamList(
            teams=[
                m.TeamInfo(
                    name=t.name,
                    quota_gpus=t.quota_gpus,
                    cohort=t.cohort,
                    borrowing_limit=t.borrowing_limit,
                    weight=t.weight,
                    qos=t.qos,
                    gpus_in_use=usage.get(t.name, 0),
                    members=members.get(t.name, []),
                )
                for t in specs
            ]
        )

    def add_user(self, req: m.UserCreate) -> m.UserInfo:
        def op(tx: Tx) -> None:
            if store.user_exists(tx.conn, req.name):
                raise HeadError(409, f"user {req.name!r} already exists")
            wanted = set(req.teams) | set(req.team_admin_of)
            if req.default_team:
                wanted.add(req.default_team)
            unknown = sorted(wanted - set(self.mirror.teams))
            if unknown:
                raise HeadError(422, f"unknown team(s): {', '.join(unknown)}")
            teams = list(req.teams)
            if req.default_team and req.default_team not in teams:
                teams.append(req.default_team)
            default = req.default_team or (teams[0] if teams else None)
            store.add_user(
                tx.conn,
                req.name,
                req.admin,
                teams,
                req.team_admin_of,
                default,
                tx.now,
                req.uid,
                req.gid,
            )
            self.mirror.unix_accounts[req.name] = (req.uid, req.gid)
            self.mirror.answers.invalidate_all()  # assignments carry the uid/gid

        self.control.call(op)
        self.forget_principals()
        return self.users_by_name()[req.name]

    def set_user(self, name: str, req: m.UserUpdate) -> m.UserInfo:
        """Change what the request names (a PATCH): the user's Unix uid/gid (jobs started
        from now on run as it; `clear`: back to the account named like the user), and the
        QOS it may use (null: its own allowance cleared, the team's applies)."""
        given = req.model_fields_set
        unix = bool(given & {"uid", "gid", "clear"})
        if req.clear and (req.uid is not None or req.gid is not None):
            raise HeadError(422, "clear the mapping or set a uid/gid, not both")
        if unix and not req.clear and req.uid is None:
            raise HeadError(422, "a Unix mapping needs a uid (--uid); --gid alone is not enough")
        if "qos" in given:
            _check_qos_names(req.qos)

        def op(tx: Tx) -> None:
            if not store.user_exists(tx.conn, name):
                raise HeadError(404, f"no user {name!r}")
            if unix:
                uid, gid = (None, None) if req.clear else (req.uid, req.gid)
                store.set_unix_account(tx.conn, name, uid, gid)
                self.mirror.unix_accounts[name] = (uid, gid)
                self.mirror.answers.invalidate_all()  # assignments carry the uid/gid
            if "qos" in given:
                store.set_user_qos(tx.conn, name, req.qos)

        self.control.call(op)
        self.forget_principals()  # principals carry the user's allowance
        return self.users_by_name()[name]

    def users_by_name(self) -> dict[str, m.UserInfo]:
        with self.control.engine.connect() as conn:
            return {u.name: u for u in store.users(conn)}

    def _expiry(self, minter: Principal, asked: float | None, default: float) -> float | None:
        """When a token `minter` mints expires: `asked` seconds from now, else `default`
        (0: never), never later than the minter's own expiry. Asking for more is refused
        (403); the default is capped."""
        now = self.now()
        if asked is not None:
            expires: float | None = now + asked
        else:
            expires = now + default if default > 0 else None
        limit = minter.expires
        if limit is None or (expires is not None and expires <= limit):
            return expires
        if asked is not None:
            raise Forbidden(
                f"a token cannot mint a token that outlives it: this one expires in "
                f"{max(0.0, limit - now):.0f} s, the new one would in {asked:.0f} s"
            )
        return limit

    def issue_token(
        self, minter: Principal, user: str, description: str, expires_s: float | None = None
    ) -> m.TokenIssued:
        """A user's API token, minted by `minter`'s token: it expires no later than that
        one, and a token a user mints for themself dies when the minting one is revoked (an
        admin's token rotated does not take the tokens it issued to others with it)."""
        expires = self._expiry(minter, expires_s, self.mirror.settings.api_token_ttl_s)
        token = auth.new_token("api")

        def op(tx: Tx) -> int:
            if not store.user_exists(tx.conn, user):
                raise HeadError(404, f"no user {user!r}")
            return store.add_token(
                tx.conn,
                auth.token_hash(token),
                "api",
                user,
                None,
                description,
                tx.now,
                expires=expires,
                parent_id=minter.token_id if minter.user == user else None,
            )

        token_id = self.control.call(op)
        return m.TokenIssued(id=token_id, token=token, user=user, kind="api", expires=expires)

    def issue_join_token(self, minter: Principal, req: m.JoinTokenCreate) -> m.TokenIssued:
        try:
            addresses = auth.check_cidrs(req.addresses)
        except ValueError as e:
            raise HeadError(422, f"addresses: {e}") from None
        expires = self._expiry(minter, req.expires_s, self.mirror.settings.join_token_ttl_s)
        token = auth.new_token("join")

        def op(tx: Tx) -> int:
            return store.add_token(
                tx.conn,
                auth.token_hash(token),
                "join",
                None,
                None,
                req.description or "agent join token",
                tx.now,
                expires=expires,
                single_use=req.single_use,
                bind_nodes=req.nodes,
                bind_addresses=addresses,
            )

        token_id = self.control.call(op)
        return m.TokenIssued(id=token_id, token=token, user=None, kind="join", expires=expires)

    def tokens(self, who: Principal, everyone: bool) -> m.TokenList:
        """Every token (an admin asking for all), else `who`'s own API tokens."""
        with self.control.engine.connect() as conn:
            return m.TokenList(tokens=store.tokens(conn, None if everyone else who.user))

    # ------------------------------------------------------------------ fault injection
    def fault_target(self, name: str) -> NodeRecord:
        """The node an admin injects a GPU fault on (`POST /v1/nodes/{name}/faults`; the
        route forwards it to the node's agent); 404 if there is no such node."""
        with self.control.lock:
            node = self.mirror.nodes.get(name)
        if node is None:
            raise HeadError(404, f"no node {name!r}")
        return node


def _check_qos_names(qos: list[str] | None) -> None:
    unknown = sorted(set(qos or ()) - set(QOS_PRIORITY))
    if unknown:
        known = ", ".join(QOS_PRIORITY)
        raise HeadError(422, f"unknown qos {', '.join(unknown)}; known: {known}")


def _visible(who: Principal, rec: JobRecord) -> bool:
    return who.admin or rec.user == who.user or rec.team in who.teams or rec.team in who.admin_of


def _matches(rec: JobRecord, user: str | None, team: str | None, states: set[str] | None) -> bool:
    return (
        (user is None or rec.user == user)
        and (team is None or rec.team == team)
        and (states is None or rec.state.value in states)
    )


def default_checkpoint_dir(workdir: str, job_id: int) -> str:
    """PHALANX_CHECKPOINT_DIR when the job names none: under its working directory (shared
    storage every node can reach, as the job's own files are), one per job, kept across
    restarts so a requeued run resumes from it."""
    return f"{workdir.rstrip('/')}/.phalanx/checkpoints/{job_id}"


def _array_summary(array: m.ArraySpec | None) -> dict[str, int]:
    """An array's SLURM_ARRAY_TASK_COUNT/_MIN/_MAX/_STEP for its tasks' assignments (the
    step: the indices' common difference, 1 when they have none)."""
    if array is None:
        return {}
    indices = array.indices
    gaps = {b - a for a, b in itertools.pairwise(indices)}
    return {
        "array_task_count": len(indices),
        "array_task_min": indices[0],
        "array_task_max": indices[-1],
        "array_task_step": gaps.pop() if len(gaps) == 1 else 1,
    }


def _release(waiter: asyncio.Future[None]) -> None:
    """End a held long poll (once: the timer and a wake may both come)."""
    if not waiter.done():
        waiter.set_result(None)
