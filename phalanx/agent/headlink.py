"""Talking to the head: register, then heartbeat (long poll) and apply each desired state."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import random
import ssl
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from phalanx.api import version
from phalanx.api.models import (
    Heartbeat,
    NodeHealth,
    Peer,
    PeerHeadView,
    RegisterRequest,
    RegisterResponse,
)
from phalanx.api.quorum import ride_quorum

from .admission import InvalidDesiredState, Refused, parse_desired
from .gpus import GpuProvider
from .guard import LeaseFile
from .health import HealthMonitor
from .reconcile import Reconciler
from .reportdelta import ReportStream
from .tlsserve import AgentTLS

log = logging.getLogger(__name__)

_BACKOFF_MIN_S, _BACKOFF_MAX_S = 0.5, 10.0
_MAX_WAIT_S = 30.0  # Heartbeat.wait_s upper bound


class JoinRefused(RuntimeError):
    """The head refused this agent (bad join token, invalid settings): retrying won't help."""


class HeadSeen:
    """What this agent tells its peers during a head outage (GET /v1/peer/head): how long
    ago the head last answered it. Peers prove themselves with the head's peer secret (the
    current one and the one before, across a head restart); jobs never see it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.heard: float | None = None  # time.monotonic() of the head's last answer
        # What that answer said: the head, restarted, still hears its nodes back
        # (DesiredState.catching_up, head/rejoin.py).
        self.catching_up = False
        self.secrets: list[str] = []

    def learn(self, secret: str) -> None:
        if secret and secret not in self.secrets:
            self.secrets = [secret, *self.secrets[:1]]

    def accepts(self, token: str) -> bool:
        return any(hmac.compare_digest(token.encode(), s.encode()) for s in self.secrets)

    def view(self) -> PeerHeadView:
        age = None if self.heard is None else max(0.0, time.monotonic() - self.heard)
        return PeerHeadView(name=self.name, head_age_s=age, head_catching_up=self.catching_up)


class HeadLink:
    """The agent's side of the agent ↔ head protocol (docs/control-plane.md).

    Sends a heartbeat at once when `changed` is set (a process started or exited, a
    master port was picked), cancelling the pending long poll; otherwise holds one long
    poll of `heartbeat_s`. Head unreachable: retry with backoff, one log line per change.

    Fencing: when no request sent in the last `lease_s` was answered, a timer kills every
    job process on the node (even while a request hangs); the head marks the node down
    only a lease after the last heartbeat it received, and requeues its jobs later still.
    The deadline also goes to `<state-dir>/lease` for the lease guard (guard.py), which
    fences in the agent's place should it be frozen or dead.
    """

    def __init__(
        self,
        head_url: str,
        join_token: str,
        request: RegisterRequest,
        reconciler: Reconciler,
        gpus: GpuProvider,
        *,
        changed: asyncio.Event,
        stop: asyncio.Event,
        heartbeat_s: float,
        secrets: set[str],
        health: HealthMonitor | None = None,
        verify: ssl.SSLContext | bool = True,
        agent_tls: AgentTLS | None = None,
        credential_file: Path | None = None,
        seen: HeadSeen | None = None,
        max_outage_s: float = 720.0,
        lease_until: float | None = None,
    ) -> None:
        # `head_url` may list several heads (a leader and its standbys), comma-separated:
        # the agent talks to one and moves to the next when it cannot be reached or is a
        # standby (503).
        self.head_urls = [u.strip().rstrip("/") for u in head_url.split(",") if u.strip()]
        self.head_url = self.head_urls[0]
        self._misses = 0  # heads tried in a row without an answer
        self.join_token = join_token
        self.request = request
        self.reconciler = reconciler
        self.gpus = gpus
        self.changed = changed
        self.stop = stop
        self.heartbeat_s = heartbeat_s
        self.lease_s = 3 * heartbeat_s
        self.secrets = secrets
        self.health = health  # GPU fault events (acked by the head) and check results
        self.verify = verify  # how the head's TLS certificate is checked (its pinned CA)
        self.agent_tls = agent_tls  # the agent API's TLS, whose certificate the head signs
        self.survivals = reconciler.survivals  # exceptions this loop caught and survived
        self._refused: list[Refused] = []  # jobs of the last answer too invalid to read
        self.node_token: str | None = None
        # The node credential kept across agent restarts (0600 in the state dir): a
        # restarted agent registers again as itself with it, where a join token would be
        # refused while the node is still alive at the head.
        self.credential_file = credential_file
        self._own = _read_credential(credential_file)
        if self._own is not None:
            self.secrets.add(self._own)
        self.version = 0
        # Delta heartbeats: reports numbered, each only what changed since the one the
        # head acknowledged (reportdelta.py).
        self.reports = ReportStream()
        self._reachable = True
        self._last_ok = time.monotonic()  # when the last answered request was SENT
        if lease_until is not None:
            # The previous run of this agent left jobs for this one to adopt: they run on
            # the lease the head gave it, not a fresh one (adopt.py).
            self._last_ok = lease_until - self.lease_s
        self._lease_lost = False
        self._backoff = _BACKOFF_MIN_S
        # For the lease guard, which fences should this process be frozen or killed.
        self._lease_file = LeaseFile(reconciler.ctx.state_dir)
        # Riding out a head outage (docs/fault-tolerance.md#head-outages): the peers to ask,
        # the head's requeue margin and longest outage, and how far the peers' answers have
        # moved the lease deadline on since the head last answered.
        self.seen = seen if seen is not None else HeadSeen(request.name)
        self.peers: list[Peer] = []
        self.margin_s = 0.0
        self.max_outage_s = max_outage_s  # this agent's own cap
        self.head_max_outage_s = 0.0  # the head's (0: an older head; fence at the lease)
        self._ride_until = 0.0  # monotonic; 0: not riding
        self._rounds = 0  # peer checks since the head last answered
        # Why this agent rides past its lease, each logged once per outage: "out" (no peer
        # hears the head), "catching up" (peers hear a restarted head still catching up).
        self._rides_logged: set[str] = set()
        self._asked = 0.0  # the deadline whose peers were asked

    async def run(self) -> None:
        """Register and heartbeat until `stop` is set."""
        # Peers' APIs serve TLS with certificates the head's CA signed: the same pinned CA.
        self._peer_client = httpx.AsyncClient(
            timeout=httpx.Timeout(self._query_s()), verify=self.verify
        )
        lease = asyncio.create_task(self._watch_lease())
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(10.0), verify=self.verify) as client:
                while not self.stop.is_set():
                    try:
                        if self.node_token is None:
                            await self._register(client)
                        else:
                            await self._beat(client)
                    except JoinRefused:
                        raise
                    except Exception:  # a bug must not end the agent (and fence its jobs)
                        self.survivals.record("heartbeat", "talking to the head")
                        await self._pause(min(self.heartbeat_s, _BACKOFF_MAX_S))
        finally:
            lease.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lease
            await self._peer_client.aclose()

    async def last_beat(self) -> None:
        """Exiting for an upgrade, jobs left running: one last heartbeat (no long poll),
        so the head has this node's latest process statuses and the agent that adopts the
        jobs gets a whole lease to register in. Best effort; its answer is not applied."""
        if self.node_token is None or self._lease_lost:
            return
        beat = Heartbeat(
            name=self.request.name,
            version=self.version,
            wait_s=0.0,
            processes=self.reconciler.process_statuses(),
            master_ports=self.reconciler.master_ports(),
            # Health as before (an empty one would read as passing checks: undrain).
            health=self.health.snapshot() if self.health is not None else NodeHealth(),
        )
        sent = time.monotonic()
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(2.0), verify=self.verify) as c:
                r = await c.post(
                    f"{self.head_url}/v1/agent/heartbeat",
                    content=beat.model_dump_json(),
                    headers=_headers(self.node_token),
                )
        except httpx.HTTPError:
            return
        if r.status_code == 200 and _skew(r, self.head_url) is None:
            self._last_ok = max(self._last_ok, sent)
            self._lease_file.renew(self._deadline())

    async def _register(self, client: httpx.AsyncClient) -> None:
        sent = time.monotonic()
        own = self._own
        try:
            r = await client.post(
                f"{self.head_url}/v1/agent/register",
                content=self.request.model_dump_json(),
                headers=_headers(own or self.join_token),
            )
        except httpx.HTTPError as e:
            return await self._next_head(f"cannot reach the head at {self.head_url}: {e}")
        skew = _skew(r, self.head_url)
        if skew is not None:
            raise JoinRefused(f"the head refused to register this agent: {skew}")
        if r.status_code == 503:
            return await self._next_head(f"the head at {self.head_url}: {_detail(r)}")
        if own is not None and r.status_code in (401, 403):
            log.info("the head no longer accepts this node's saved credential; joining anew")
            self._forget_own()
            return None
        if r.status_code == 409 and "alive" in _detail(r):
            # Our own earlier self (a restart without its saved credential) may still hold
            # the name until its lease runs out: keep trying.
            return await self._failed(f"the head refused to register this agent: {_detail(r)}")
        if 400 <= r.status_code < 500:
            raise JoinRefused(f"the head refused to register this agent: {_detail(r)}")
        if r.status_code != 200:
            return await self._failed(f"head answered {r.status_code} to register")
        reg = RegisterResponse.model_validate_json(r.content)
        if self.agent_tls is not None:
            if reg.agent_cert is None:
                raise JoinRefused(
                    "the head did not sign this agent's API certificate (it serves an "
                    "operator's certificate, or plain HTTP): start the agent without --ca-file, "
                    "so its API serves plain HTTP, or let the head serve with its own CA"
                )
            try:
                self.agent_tls.install(reg.agent_cert)
            except (OSError, ssl.SSLError) as e:
                raise JoinRefused(f"cannot serve the certificate the head signed: {e}") from None
        self._misses = 0
        self.node_token = reg.node_token
        self.secrets.add(reg.node_token)
        self._own = reg.node_token
        if self.credential_file is not None:
            _write_credential(self.credential_file, reg.node_token)
        self.heartbeat_s, self.lease_s = reg.heartbeat_s, reg.lease_s
        self.reports.reset()  # the head forgets a node's reports when it registers
        self._ok(sent)
        log.info("registered with the head at %s as %s", self.head_url, self.request.name)
        self.changed.set()  # report at once

    async def _beat(self, client: httpx.AsyncClient) -> None:
        desired = self.reconciler.desired()
        if desired is not None:
            # Finish deferred launches.
            await asyncio.to_thread(self.reconciler.apply, desired, self._refused)
        self.changed.clear()
        wait_s = min(self.heartbeat_s, _MAX_WAIT_S)
        if self._deadline() - time.monotonic() < wait_s + max(0.25, wait_s / 2):
            # The lease would run out before a long poll is answered (the first request
            # to a head back from an outage, sent close to the deadline): only the answer
            # renews the lease, so ask for it at once.
            wait_s = 0.0
        health = self.health.snapshot() if self.health is not None else NodeHealth()
        telemetry = await asyncio.to_thread(self.gpus.telemetry)
        report = partial(
            self.reports.report,
            name=self.request.name,
            version=self.version,
            wait_s=wait_s,
            processes=self.reconciler.process_statuses(),
            ports=self.reconciler.master_ports(),
            health=health,
        )
        try:
            beat = report(gpus=telemetry)
        except ValidationError:  # a reading out of bounds must not silence the node
            self.survivals.record("heartbeat", "building the heartbeat; sent without telemetry")
            beat = report(gpus=[])
        assert self.node_token is not None
        sent = time.monotonic()
        post = asyncio.ensure_future(
            client.post(
                f"{self.head_url}/v1/agent/heartbeat",
                content=beat.model_dump_json(),
                headers=_headers(self.node_token),
                timeout=wait_s + 10.0,
            )
        )
        if not await self._answered_first(post):
            post.cancel()  # news to tell (or stopping): drop the long poll, send again
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await post
            return
        try:
            r = post.result()
        except httpx.HTTPError as e:
            return await self._next_head(f"cannot reach the head at {self.head_url}: {e}")
        skew = _skew(r, self.head_url)
        if skew is not None:  # a head upgraded to another major under us: nothing to do
            return await self._failed(skew)
        if r.status_code == 503:
            return await self._next_head(f"the head at {self.head_url}: {_detail(r)}")
        self._misses = 0
        if r.status_code in (401, 403):
            log.warning("the head no longer knows this node's token; registering again")
            self.node_token = None
            self._forget_own()
            return
        if r.status_code == 422 and beat.delta is not None:
            # A head that predates delta reports refuses them (their null process list):
            # full reports from now on, until a head acknowledges one.
            log.info("the head at %s refused a delta report; sending full reports", self.head_url)
            self.reports.reset()
            return None
        if r.status_code != 200:
            return await self._failed(f"head answered {r.status_code}: {_detail(r)}")
        try:
            # Job by job: an invalid job is refused alone (reported LaunchFailed).
            state, refused = parse_desired(r.content)
        except InvalidDesiredState as e:
            return await self._failed(f"head sent an invalid desired state: {e}")
        for job in refused:
            if job not in self._refused:
                log.error("job %d.%d refused: %s", job.job_id, job.epoch, job.why)
        self._refused = refused
        if self.health is not None:
            self.health.ack(state.health_ack)  # events the head handled are not sent again
        new = state.version != self.version or desired is None
        self.heartbeat_s, self.lease_s = state.heartbeat_s, state.lease_s
        self.peers, self.margin_s = list(state.peers), state.requeue_margin_s
        self.head_max_outage_s = state.max_outage_s
        if state.peer_secret:
            self.seen.learn(state.peer_secret)
            self.secrets.add(state.peer_secret)  # never in a job's environment
        self.seen.catching_up = state.catching_up
        self._ok(sent)
        self.reports.answered(state.report_ack, state.full_report)
        await asyncio.to_thread(self.reconciler.apply, state, refused)
        self.version = state.version
        if not new and not state.full_report:  # asked for a full report: send it at once
            # The head answered early with nothing new (no long poll): keep the pace.
            await self._pause(max(0.0, self.heartbeat_s - (time.monotonic() - sent)))

    async def _answered_first(self, post: asyncio.Future[httpx.Response]) -> bool:
        """Wait for the answer, news to report, or stop; True if the answer came first."""
        news = asyncio.ensure_future(self.changed.wait())
        stop = asyncio.ensure_future(self.stop.wait())
        waiting: set[asyncio.Future[Any]] = {post, news, stop}
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        for t in (news, stop):
            t.cancel()
        return post in done

    async def _pause(self, seconds: float) -> None:
        """Sleep, waking early for news or stop."""
        with contextlib.suppress(TimeoutError):
            news = asyncio.ensure_future(self.changed.wait())
            stop = asyncio.ensure_future(self.stop.wait())
            try:
                await asyncio.wait(
                    {news, stop}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                news.cancel()
                stop.cancel()

    async def _next_head(self, why: str) -> None:
        """This head did not take the request: with several heads, try the next one at
        once; after a whole round of them without an answer, fail as usual (back off)."""
        self._misses += 1
        if len(self.head_urls) > 1:
            before = self.head_url
            self.head_url = self.head_urls[(self.head_urls.index(before) + 1) % len(self.head_urls)]
            self.reports.reset()  # another head: it holds none of this node's reports
            if self._misses == 1:
                log.warning("%s; trying the head at %s", why, self.head_url)
            if self._misses % len(self.head_urls):
                return
        await self._failed(why)

    async def _failed(self, why: str) -> None:
        """Log the change to unreachable once, mind the lease, back off."""
        if self._reachable:
            log.warning(
                "%s; retrying (jobs keep running until the head has been silent for the %gs lease)",
                why,
                self.lease_s,
            )
            self._reachable = False
            self._backoff = _BACKOFF_MIN_S
        self._check_lease()
        # While the lease holds, retry at least every heartbeat: a head back from a short
        # outage must hear from us before the lease runs out, or the jobs are fenced.
        cap = _BACKOFF_MAX_S if self._lease_lost else min(_BACKOFF_MAX_S, self.heartbeat_s)
        # Jittered: thousands of agents that lost a head at once must not reconnect to the
        # restarted one in lockstep (head/rejoin.py).
        await self._pause(min(self._backoff, cap) * random.uniform(0.5, 1.0))
        self._backoff = min(self._backoff * 2, cap)

    def _ok(self, sent: float) -> None:
        """The head answered a request sent at `sent` (monotonic): the lease runs from
        there, never from the answer, so this node's deadline is never later than the
        head's (which runs from the request's arrival)."""
        if not self._reachable:
            log.info("the head at %s is reachable again", self.head_url)
        self._reachable = True
        self._last_ok = max(self._last_ok, sent)
        self.seen.heard = time.monotonic()
        self._rounds = 0
        if self._rides_logged:
            log.warning("the head answered again after an outage: jobs kept running")
            self._rides_logged.clear()
        self._lease_file.renew(self._deadline())  # before anything may start
        # An answer to a request sent more than a lease ago does not lift a fence: the
        # head may have given up on this node meanwhile; the next answer will.
        if self._lease_lost and time.monotonic() - self._last_ok <= self.lease_s:
            self._lease_lost = False
            self.reconciler.resume()
            log.warning("the head answered again: jobs run as it says (fenced epochs stay dead)")

    def _deadline(self) -> float:
        """When the lease runs out: a lease after the last answered request was sent, or
        later while the peers agree that the head is out (`_ask_peers`)."""
        return max(self._last_ok + self.lease_s, self._ride_until)

    def _query_s(self) -> float:
        """How long a peer check may take: it ends well inside the head's requeue margin."""
        return min(0.75, self.lease_s / 8)

    def _may_ride(self) -> bool:
        cap = min(self.max_outage_s, self.head_max_outage_s)
        return bool(self.peers) and cap > self.lease_s and self.seen.heard is not None

    async def _watch_lease(self) -> None:
        """Fence at the lease deadline, also while a request hangs (a head that accepts
        connections but never answers, or is stopped). Shortly before it, ask the peers
        whether the head is out; if it is, the deadline moves on (`_ask_peers`)."""
        while not self.stop.is_set():
            early = self._query_s() if self._may_ride() and not self._lease_lost else 0.0
            deadline = self._deadline()
            if early and time.monotonic() >= deadline - early and self._asked != deadline:
                self._asked = deadline  # once per deadline
                await self._ask_peers()
                if self._deadline() == deadline:
                    early = 0.0  # not moved: fence at this deadline
                # else: moved on; sleep to the check before the new deadline (waking at the
                # deadline itself would ask too late, with the lease already run out)
            self._check_lease()
            # Sleep to the deadline (or to the check before it), re-read at least every
            # second (lease_s may change); while fenced, poll briefly so the deadline of a
            # renewed lease is not missed.
            left = self._deadline() - early - time.monotonic()
            await asyncio.sleep(min(max(left, 0.05), 1.0))

    async def _ask_peers(self) -> None:
        """The lease is about to run out. Ask every peer at once how long ago the head
        answered it. One that heard from the head since this node last did (by more than a
        heartbeat: long polls end at different times) means this node alone is cut off:
        fence at the deadline, before the head requeues. Too few answers: this node is
        isolated; fence too. Enough answers and none heard the head: the head is out (a
        restart, a pause, a failover); keep the jobs and move the deadline on, first into
        half of the head's requeue margin (a second check then, when a slow long poll can
        no longer pass for silence), then by half a lease at a time, up to the longest
        outage. The head requeues a silent node's jobs early only while enough of its peers
        are heard (head/peers.py), so this node hears of it in time."""
        peers, heard = list(self.peers), self.seen.heard
        assert heard is not None
        answers = await asyncio.gather(*(self._ask(p) for p in peers))
        slack = self.heartbeat_s + max(0.25, self.heartbeat_s / 4)
        now = time.monotonic()
        fresh = [(p.name, last - heard) for p, last, _ in answers if isinstance(last, float)]
        fresh = [(name, after) for name, after in fresh if after > slack]
        # A peer the head answered lately, saying it is still hearing its nodes back after
        # a restart (head/rejoin.py): it judges no silence of this node meanwhile, and
        # requeues a lease and its margin after it stops, so riding half a lease past this
        # answer (at most a heartbeat old) ends before that.
        recent = min(slack, self.lease_s / 2)
        busy = [
            p.name
            for p, last, catching in answers
            if catching
            and isinstance(last, float)
            and last - heard > slack
            and now - last <= recent
        ]
        answered = sum(1 for _, last, _ in answers if last is not False)
        deadline = self._deadline()
        cap = self._last_ok + min(self.max_outage_s, self.head_max_outage_s)
        if busy:
            self.changed.set()  # try the head again at once, as below
            until = min(now + self.lease_s / 2, cap)
            if until > deadline:
                self._ride(
                    until,
                    "catching up",
                    f"no answer from the head for {now - self._last_ok:.1f}s, but peer "
                    f"{busy[0]} heard it say it is still hearing its nodes back after a "
                    "restart: jobs keep running while it gets to this node (at most "
                    f"{cap - self._last_ok:g}s without it)",
                )
                return
            why = f"the head has been out for the longest outage ({cap - self._last_ok:g}s)"
        elif fresh:
            name, after = fresh[0]
            why = f"peer {name} heard from the head {after:.1f}s after this node last did "
            why += "(trying the head again now)"
            # The head answers others: it may just be back (a restart, a standby taking
            # over) while this node still waits on a request to a dead head, or to retry.
            # Try it at once, to be heard before the deadline; the first agents back must
            # not make the others fence for nothing. Unheard by then, this node fences.
            self.changed.set()
        elif answered < ride_quorum(len(peers)):
            why = f"only {answered} of {len(peers)} peer(s) answered"
        else:
            # The first step stays inside the head's requeue margin: the check at its end
            # is the one that tells a slow long poll from silence (with no margin to spare,
            # this check decides).
            second = self._last_ok + self.lease_s + self.margin_s / 2
            until = second if self._rounds == 0 and second > deadline else now + self.lease_s / 2
            until = min(until, cap)
            self._rounds += 1
            if until > deadline:
                self._ride(
                    until,
                    "out",
                    f"no answer from the head for {now - self._last_ok:.1f}s, and none of "
                    f"{answered} peer(s) heard from it either: the head is out; jobs keep "
                    f"running (at most {cap - self._last_ok:g}s without it)",
                )
                return
            why = f"the head has been out for the longest outage ({cap - self._last_ok:g}s)"
        log.warning("lease ends in %.1fs and will not be extended: %s", deadline - now, why)

    def _ride(self, until: float, why: str, message: str) -> None:
        """Keep the jobs past the lease, to `until` (the guard's lease file too); say why
        once per outage."""
        self._ride_until = until
        self._lease_file.renew(until)
        if why not in self._rides_logged:
            self._rides_logged.add(why)
            log.warning("%s", message)

    async def _ask(self, peer: Peer) -> tuple[Peer, float | bool | None, bool]:
        """(peer, when the head last answered it by this node's clock, whether that answer
        said the head was catching up after a restart); None: never; False: no valid
        answer in time."""
        secret = self.seen.secrets[0] if self.seen.secrets else ""
        try:
            r = await asyncio.wait_for(
                self._peer_client.get(
                    f"{peer.agent_url.rstrip('/')}/v1/peer/head",
                    headers={"Authorization": f"Bearer {secret}"},
                ),
                self._query_s(),
            )
            view = PeerHeadView.model_validate_json(r.content) if r.status_code == 200 else None
        except (httpx.HTTPError, TimeoutError, ValidationError):
            view = None
        if view is None:
            return peer, False, False
        age = view.head_age_s
        return peer, None if age is None else time.monotonic() - age, view.head_catching_up

    def _check_lease(self) -> None:
        if not self._lease_lost and time.monotonic() > self._deadline():
            self._lease_lost = True
            self.on_lease_lost()

    def on_lease_lost(self) -> None:
        """The head has not answered for longer than the lease: it may already be placing
        this node's jobs elsewhere. Fence: SIGKILL every job process group here at once (no
        grace; the jobs restart from their checkpoints), report the ranks lost, and start
        nothing until the head answers again."""
        now = time.monotonic()
        silent = now - self._last_ok
        # The wall time of the deadline: ranks the guard killed since then read as lost too.
        since = time.time() - (now - self._deadline())
        killed = self.reconciler.fence(since)
        log.log(
            logging.ERROR if killed else logging.WARNING,
            "fenced: no answer from the head for %.1fs (lease %gs); killed %d job process "
            "group(s) with SIGKILL, reported lost when the head answers; starting nothing "
            "until it does",
            silent,
            self.lease_s,
            killed,
        )

    def _forget_own(self) -> None:
        self._own = None
        if self.credential_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.credential_file.unlink()


def _read_credential(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def _write_credential(path: Path, token: str) -> None:
    """Write the node credential readable by the agent's user only (0600 from the start)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)


def _headers(token: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        **version.headers(),
    }


def _skew(r: httpx.Response, head_url: str) -> str | None:
    """Why this head's API version cannot talk to this agent's (None: it can)."""
    return version.mismatch(r.headers.get(version.HEADER), me="agent", them=f"head at {head_url}")


def _detail(r: httpx.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return r.text[:200]
    return str(body.get("detail", body)) if isinstance(body, dict) else str(body)[:200]
