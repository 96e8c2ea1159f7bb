"""Heartbeats first: an overloaded head turns users' submits and reads away for a moment.

Heartbeats and everything else share the head's one event loop (and its control thread)
with no priority: a flood of submits or listings takes the loop from the fleet, heartbeats
wait, and a head that waits too long loses track of live nodes (head/overload.py). So while
the head's measured backlog is past `Settings.shed_backlog_s`, `POST /v1/jobs` and reads of
the REST API (`GET`/`HEAD /v1/…`) are answered at once with 503 and `Retry-After` (the
backlog, rounded up): the answer costs the head almost nothing, and the CLI and
`phalanx.client` already wait and try again on a 503 (as they do for a head restarting).
What agents send (`/v1/agent/…`, telemetry), what jobs send (progress, requeue), users'
changes to existing jobs (cancel, hold, update), `/healthz` and `/metrics` are never shed.
Counted in `phalanx_requests_shed_total`; the backlog itself is
`phalanx_head_backlog_seconds`.
"""

from __future__ import annotations

import math

from prometheus_client import Counter, Gauge
from starlette.types import ASGIApp, Receive, Scope, Send

from phalanx.api.asgi import json_error
from phalanx.head.service import Head

SUBMIT_PATH = "/v1/jobs"
READS = ("GET", "HEAD")
NEVER = "/v1/agent/"


def sheddable(method: str, path: str) -> bool:
    """Whether a request may be turned away while the head is behind: a submit or a read
    of the REST API, not an agent's."""
    if method == "POST":
        return path == SUBMIT_PATH
    return method in READS and path.startswith("/v1/") and not path.startswith(NEVER)


class ShedGate:
    """Plain ASGI in front of the API (after the heartbeat fast path): 503 + Retry-After
    for a sheddable request while the head's backlog is past the setting."""

    def __init__(self, app: ASGIApp, head: Head) -> None:
        self.app = app
        self.settings = head.mirror.settings
        self.backlog = head.control.backlog
        registry = head.metrics.registry
        self.shed = Counter(
            "phalanx_requests_shed",
            "Submits and reads answered 503 (Retry-After) because the head was behind on "
            "its work, so that heartbeats went first (phalanx head --shed-backlog).",
            registry=registry,
        )
        backlog = Gauge(
            "phalanx_head_backlog_seconds",
            "How late the head may hear a heartbeat sent now: its event loop's lag, the "
            "oldest heartbeat being handled, its control thread's queue (head/overload.py).",
            registry=registry,
        )
        backlog.set_function(self.backlog.behind_s)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.settings.shed_backlog_s
        if limit > 0 and scope["type"] == "http" and sheddable(scope["method"], scope["path"]):
            behind = self.backlog.behind_s()
            if behind > limit:
                self.shed.inc()
                retry = str(max(1, math.ceil(behind)))
                detail = (
                    f"the head is {behind:.1f} s behind on its work and serves the nodes' "
                    f"heartbeats first: try again in {retry} s"
                )
                await json_error(503, detail, {"Retry-After": retry})(scope, receive, send)
                return
        await self.app(scope, receive, send)
