"""Talking to the head: register, then heartbeat (long poll) and apply each desired state."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import httpx
from pydantic import ValidationError

from phalanx.api import version
from phalanx.api.models import (
    DesiredState,
    Heartbeat,
    NodeHealth,
    RegisterRequest,
    RegisterResponse,
)

from .gpus import GpuProvider
from .guard import LeaseFile
from .health import HealthMonitor
from .reconcile import Reconciler

log = logging.getLogger(__name__)

_BACKOFF_MIN_S, _BACKOFF_MAX_S = 0.5, 10.0
_MAX_WAIT_S = 30.0  # Heartbeat.wait_s upper bound


class JoinRefused(RuntimeError):
    """The head refused this agent (bad join token, invalid settings): retrying won't help."""


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
        self.node_token: str | None = None
        self.version = 0
        self._reachable = True
        self._last_ok = time.monotonic()  # when the last answered request was SENT
        self._lease_lost = False
        self._backoff = _BACKOFF_MIN_S
        # For the lease guard, which fences should this process be frozen or killed.
        self._lease_file = LeaseFile(reconciler.ctx.state_dir)

    async def run(self) -> None:
        """Register and heartbeat until `stop` is set."""
        lease = asyncio.create_task(self._watch_lease())
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as client:
                while not self.stop.is_set():
                    if self.node_token is None:
                        await self._register(client)
                        continue
                    await self._beat(client)
        finally:
            lease.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lease

    async def _register(self, client: httpx.AsyncClient) -> None:
        sent = time.monotonic()
        try:
            r = await client.post(
                f"{self.head_url}/v1/agent/register",
                content=self.request.model_dump_json(),
                headers=_headers(self.join_token),
            )
        except httpx.HTTPError as e:
            return await self._next_head(f"cannot reach the head at {self.head_url}: {e}")
        skew = _skew(r, self.head_url)
        if skew is not None:
            raise JoinRefused(f"the head refused to register this agent: {skew}")
        if r.status_code == 503:
            return await self._next_head(f"the head at {self.head_url}: {_detail(r)}")
        if 400 <= r.status_code < 500:
            raise JoinRefused(f"the head refused to register this agent: {_detail(r)}")
        if r.status_code != 200:
            return await self._failed(f"head answered {r.status_code} to register")
        reg = RegisterResponse.model_validate_json(r.content)
        self._misses = 0
        self.node_token = reg.node_token
        self.secrets.add(reg.node_token)
        self.heartbeat_s, self.lease_s = reg.heartbeat_s, reg.lease_s
        self._ok(sent)
        log.info("registered with the head at %s as %s", self.head_url, self.request.name)
        self.changed.set()  # report at once

    async def _beat(self, client: httpx.AsyncClient) -> None:
        desired = self.reconciler.desired()
        if desired is not None:
            await asyncio.to_thread(self.reconciler.apply, desired)  # finish deferred launches
        self.changed.clear()
        wait_s = min(self.heartbeat_s, _MAX_WAIT_S)
        beat = Heartbeat(
            name=self.request.name,
            version=self.version,
            wait_s=wait_s,
            processes=self.reconciler.process_statuses(),
            master_ports=self.reconciler.master_ports(),
            gpus=await asyncio.to_thread(self.gpus.telemetry),
            health=self.health.snapshot() if self.health is not None else NodeHealth(),
        )
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
            return
        if r.status_code != 200:
            return await self._failed(f"head answered {r.status_code}: {_detail(r)}")
        try:
            state = DesiredState.model_validate_json(r.content)
        except ValidationError as e:
            return await self._failed(
                f"head sent an invalid desired state: {e.error_count()} error(s)"
            )
        if self.health is not None:
            self.health.ack(state.health_ack)  # events the head handled are not sent again
        new = state.version != self.version or desired is None
        self.heartbeat_s, self.lease_s = state.heartbeat_s, state.lease_s
        self._ok(sent)
        await asyncio.to_thread(self.reconciler.apply, state)
        self.version = state.version
        if not new:
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
        await self._pause(min(self._backoff, cap))
        self._backoff = min(self._backoff * 2, cap)

    def _ok(self, sent: float) -> None:
        """The head answered a request sent at `sent` (monotonic): the lease runs from
        there, never from the answer, so this node's deadline is never later than the
        head's (which runs from the request's arrival)."""
        if not self._reachable:
            log.info("the head at %s is reachable again", self.head_url)
        self._reachable = True
        self._last_ok = max(self._last_ok, sent)
        self._lease_file.renew(self._last_ok + self.lease_s)  # before anything may start
        # An answer to a request sent more than a lease ago does not lift a fence: the
        # head may have given up on this node meanwhile; the next answer will.
        if self._lease_lost and time.monotonic() - self._last_ok <= self.lease_s:
            self._lease_lost = False
            self.reconciler.resume()
            log.warning("the head answered again: jobs run as it says (fenced epochs stay dead)")

    async def _watch_lease(self) -> None:
        """Fence at the lease deadline, also while a request hangs (a head that accepts
        connections but never answers, or is stopped)."""
        while not self.stop.is_set():
            self._check_lease()
            # Sleep to the deadline, re-read at least every second (lease_s may change);
            # while fenced, poll briefly so the deadline of a renewed lease is not missed.
            left = self._last_ok + self.lease_s - time.monotonic()
            await asyncio.sleep(min(max(left, 0.05), 1.0))

    def _check_lease(self) -> None:
        if not self._lease_lost and time.monotonic() - self._last_ok > self.lease_s:
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
        since = time.time() - (now - (self._last_ok + self.lease_s))
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
