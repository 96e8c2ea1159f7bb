"""The router's OpenAI-compatible gateway as a plain ASGI app (no framework on the hot path):
`POST /v1/completions`, `POST /v1/chat/completions` (streamed or not), `GET /v1/models`,
`GET /health`, `GET /metrics`.

A request is authenticated (a Phalanx token the head vouches for, of the deployment's
audience), rate-limited per team, bounded (body size, JSON depth) and checked (a JSON
object, the served model, `stream` a bool), then sent — its bytes unchanged — to the
replica the policy picks. A replica that fails before anything was sent to the client
(cannot connect, 5xx, breaks off a whole answer or a stream before its first byte) is
marked down and the request goes to another one; once a byte has been streamed it never
goes again (the client gets an error event). Streams pass through byte for byte.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.types import Receive, Scope, Send

from phalanx.api.serving import Policy
from phalanx.serve.router.access import Audience, HeadUnreachable, RateLimits, TokenCache
from phalanx.serve.router.answers import JSON_TYPE, ApiError, answer
from phalanx.serve.router.checks import DEFAULT_MAX_BODY, DEFAULT_MAX_DEPTH, parse, read_body
from phalanx.serve.router.disagg import Disagg
from phalanx.serve.router.engine_metrics import EngineCollector, EnginePoller
from phalanx.serve.router.metrics import CONTENT_TYPE, RouterMetrics
from phalanx.serve.router.policies import RouteRequest, RoutingPolicy, make_policy
from phalanx.serve.router.prefix import PrefixIndex, block_hashes, prompt_text
from phalanx.serve.router.replicas import Replica, ReplicaSet
from phalanx.serve.router.stats import RouterStats, engine_tpot, stream_tokens
from phalanx.serve.router.upstream import UpstreamError

log = logging.getLogger("phalanx.serve.router")

COMPLETIONS = ("/v1/completions", "/v1/chat/completions")


@dataclass(frozen=True)
class RouterConfig:
    served_model_name: str
    max_body_bytes: int = DEFAULT_MAX_BODY
    max_json_depth: int = DEFAULT_MAX_DEPTH
    retries: int = 2  # other replicas tried after the first fails (before any byte)
    max_in_flight: int = 4096  # completions being answered at once; more get 503
    policy: Policy | None = None  # None: the deployment's own (Endpoints.policy)
    block_chars: int | None = None  # None: the deployment's own


@dataclass
class _Outcome:
    sent: bool  # something went to the client (no retry)
    ok: bool = True
    status: int = 200
    reason: str = ""
    ttft_s: float | None = None
    tpot_s: float | None = None


class _Prefill:
    """A request's prefill on its replica: counted (`prefilling`, `prefill_blocks`) from the
    send until `done` — the first token back, or the try over — and only once."""

    __slots__ = ("blocks", "replica")

    def __init__(self, replica: Replica, blocks: int) -> None:
        self.replica: Replica | None = replica
        self.blocks = blocks
        replica.prefilling += 1
        replica.prefill_blocks += blocks

    def done(self) -> None:
        if self.replica is not None:
            self.replica.prefilling -= 1
            self.replica.prefill_blocks -= self.blocks
            self.replica = None


class Router:
    """The ASGI app. `tokens` None: no authentication (only with --no-auth, for benches)."""

    def __init__(
        self,
        config: RouterConfig,
        replicas: ReplicaSet,
        *,
        tokens: TokenCache | None,
        audience: Callable[[], Audience],
        limits: RateLimits,
        stats: RouterStats | None = None,
        on_replica_error: Callable[[], None] = lambda: None,
        lifespan: Callable[[], Awaitable[Callable[[], Awaitable[None]]]] | None = None,
    ) -> None:
        self.config = config
        self.replicas = replicas
        self.index: PrefixIndex = replicas.index
        self.tokens = tokens
        self.audience = audience
        self.limits = limits
        self.stats = stats or RouterStats()
        self.on_replica_error = on_replica_error
        self._lifespan_hook = lifespan
        self.metrics = RouterMetrics(self._replica_rows)
        self.engines: EnginePoller | None = None  # the engines' /metrics (server.py sets it)
        self.metrics.registry.register(EngineCollector(lambda: self.engines))
        self._policy: RoutingPolicy | None = None
        self._active = 0  # completions being answered
        self.disagg = Disagg(self)
        self._req = {
            (route, code): self.metrics.requests.labels(route, str(code))
            for route in COMPLETIONS
            for code in (200, 400, 401, 403, 404, 413, 429, 502, 503)
        }

    # ------------------------------------------------------------------ state
    def policy(self) -> RoutingPolicy:
        eps = self.replicas.endpoints
        name = self.config.policy or (eps.policy if eps else "kv-aware")
        if self._policy is None or self._policy.name != name:
            self._policy = make_policy(name, self.index)
        return self._policy

    def block_chars(self) -> int:
        eps = self.replicas.endpoints
        return self.config.block_chars or (eps.block_chars if eps else 256)

    def _replica_rows(self) -> list[tuple[str, str, str, int, int, int, bool]]:
        now = self.replicas.clock()
        return [
            (
                r.endpoint.pool,
                r.name,
                r.endpoint.url,
                r.in_flight,
                r.requests,
                r.failures,
                r.down_until > now,
            )
            for r in self.replicas
        ]

    def _count(self, route: str, status: int) -> None:
        child = self._req.get((route, status))
        if child is None:
            child = self._req[(route, status)] = self.metrics.requests.labels(route, str(status))
        child.inc()

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
            return
        if kind != "http":
            return
        path, method = scope["path"], scope["method"]
        try:
            if path in COMPLETIONS:
                if method != "POST":
                    raise ApiError(405, f"{path} takes POST")
                await self._complete(scope, receive, send, path)
            elif path == "/health":
                ready = sum(self.replicas.ready(p) for p in self.replicas.pools)
                status = 200 if ready else 503
                body = json.dumps({"status": "ok" if ready else "no replica ready"}).encode()
                await answer(send, status, body)
            elif path == "/v1/models":
                await self._authorize(scope)
                model = {
                    "id": self.config.served_model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "phalanx",
                }
                await answer(send, 200, json.dumps({"object": "list", "data": [model]}).encode())
            elif path == "/metrics":
                await self._authorize(scope)
                await answer(send, 200, self.metrics.exposition(), CONTENT_TYPE)
            else:
                raise ApiError(404, f"no route {method} {path}", code="not_found")
        except ApiError as e:
            if path in COMPLETIONS:
                self._count(path, e.status)
            await answer(send, e.status, e.body(), JSON_TYPE, e.headers)
        except Exception:
            # A bug must not take the router down: log it, answer 500 if still possible.
            log.exception("%s %s failed", method, path)
            error = ApiError(500, "internal error in the router (logged)", "server_error")
            await answer(send, 500, error.body())

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        stop: Callable[[], Awaitable[None]] | None = None
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    if self._lifespan_hook is not None:
                        stop = await self._lifespan_hook()
                except Exception as e:
                    log.error("router startup failed: %s", e)
                    await send({"type": "lifespan.startup.failed", "message": str(e)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if stop is not None:
                    await stop()
                self.replicas.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # ------------------------------------------------------------------ requests
    async def _authorize(self, scope: Scope) -> str:
        """The caller's rate-limit team (401/403/503 as ApiError)."""
        if self.tokens is None:
            return "-"
        token = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, rest = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer" and rest.strip():
                    token = rest.strip()
                break
        if token is None:
            raise ApiError(
                401,
                "missing bearer token: send your Phalanx token as `Authorization: Bearer …`",
                "authentication_error",
                "missing_token",
                headers=((b"www-authenticate", b"Bearer"),),
            )
        try:
            who = await self.tokens.who(token)
        except HeadUnreachable as e:
            log.warning("cannot check a token: %s", e)
            raise ApiError(
                503,
                "cannot check the token now (the head does not answer)",
                "server_error",
                headers=((b"retry-after", b"2"),),
            ) from None
        if who is None:
            raise ApiError(
                401,
                "the token is not valid (unknown, expired or revoked)",
                "authentication_error",
                "invalid_token",
                headers=((b"www-authenticate", b"Bearer"),),
            )
        audience = self.audience()
        if not audience.allows(who):
            raise ApiError(
                403,
                f"user {who.user} may not use this deployment (its owner, its team's members "
                "and admins may)",
                "permission_error",
                "forbidden",
            )
        return audience.team_of(who)

    async def _complete(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        received = time.perf_counter()
        if self._active >= self.config.max_in_flight:
            # Bounded work (and memory): the engines' queues are the place to wait.
            raise ApiError(
                503,
                f"the router is answering {self._active} requests, its limit: retry shortly",
                "server_error",
                "overloaded",
                headers=((b"retry-after", b"1"),),
            )
        self._active += 1
        try:
            await self._complete_one(scope, receive, send, path, received)
        finally:
            self._active -= 1

    async def _complete_one(
        self, scope: Scope, receive: Receive, send: Send, path: str, received: float
    ) -> None:
        team = await self._authorize(scope)
        wait = self.limits.take(team)
        if wait is not None:
            raise ApiError(
                429,
                f"rate limit of team {team} reached: retry in {wait:.1f} s",
                "rate_limit_error",
                "rate_limit_exceeded",
                headers=((b"retry-after", str(max(1, math.ceil(wait))).encode()),),
            )
        raw = await read_body(scope, receive, self.config.max_body_bytes)
        obj, stream = parse(raw, path, self.config.served_model_name, self.config.max_json_depth)
        text = prompt_text(path, obj)
        bc = self.block_chars()
        hashes = block_hashes(text, bc) if len(text) >= bc else ()
        if "aggregated" not in self.replicas.pools and "prefill" in self.replicas.pools:
            await self.disagg.complete(scope, receive, send, path, obj, stream, hashes, received)
            return
        await self.route(receive, send, path, raw, stream, hashes, received, "aggregated")

    async def route(
        self,
        receive: Receive,
        send: Send,
        path: str,
        raw: bytes,
        stream: bool,
        hashes: tuple[bytes, ...],
        received: float,
        pool: str,
        target: Replica | None = None,
    ) -> None:
        """Send the request to the pool's replicas until one answers (or `retries` more
        have failed before answering); to `target` alone if given."""
        stats = self.stats
        stats.started(pool)
        self.metrics.in_flight.inc()
        tried: set[str] = set()
        outcome = _Outcome(False, False, 503, "no replica of the deployment is ready")
        try:
            for attempt in range(self.config.retries + 1 if target is None else 1):
                candidates = self.replicas.routable(pool, tried) if target is None else [target]
                if not candidates:
                    break
                replica, uncached = self.choose(candidates, hashes)
                if attempt:
                    self.metrics.retries.inc()
                tried.add(replica.endpoint.url)
                outcome = await self.exchange(
                    replica, receive, send, path, raw, stream, received, len(hashes), uncached
                )
                if outcome.sent:
                    break
                self._replica_failed(replica, outcome.reason)
        finally:
            self.metrics.in_flight.dec()
            if not outcome.sent:
                stats.ended(pool, False)
        if not outcome.sent:
            self._count(path, outcome.status)
            error = ApiError(
                outcome.status,
                f"no replica could answer: {outcome.reason}",
                "server_error",
                "upstream_error",
            )
            await answer(send, error.status, error.body())
            return
        self._count(path, outcome.status)
        stats.ended(pool, outcome.ok, outcome.ttft_s, outcome.tpot_s)
        e2e = time.perf_counter() - received
        self.metrics.e2e.observe(e2e)
        if outcome.ttft_s is not None:
            self.metrics.ttft.observe(outcome.ttft_s)
        if outcome.tpot_s is not None:
            self.metrics.tpot.observe(outcome.tpot_s)

    def choose(self, candidates: list[Replica], hashes: tuple[bytes, ...]) -> tuple[Replica, int]:
        """The policy's choice among `candidates` and how many of the prompt's blocks it has
        not cached; the prefix index learns the prompt went there (the engine will have it
        cached once it has prefilled it)."""
        if len(candidates) == 1:
            replica = candidates[0]
            self.policy()  # keeps round-robin's turn and the policy name current
        else:
            chosen = self.policy().choose([r.load() for r in candidates], RouteRequest(hashes))
            replica = next(r for r in candidates if r.endpoint is chosen)
        uncached = 0
        if hashes:
            url = replica.endpoint.url
            matched = self.index.matched(url, hashes)
            uncached = len(hashes) - matched
            self.metrics.blocks(len(hashes), matched)
            self.index.add(url, hashes)
        return replica, uncached

    def _replica_failed(self, replica: Replica, reason: str) -> None:
        log.warning("replica %s (%s) failed: %s", replica.name, replica.endpoint.url, reason)
        self.replicas.failed(replica)
        self.metrics.errors.labels(reason.split(":", 1)[0][:40]).inc()
        self.on_replica_error()

    async def exchange(
        self,
        replica: Replica,
        receive: Receive,
        send: Send,
        path: str,
        raw: bytes,
        stream: bool,
        received: float,
        blocks: int,
        uncached: int = 0,
    ) -> _Outcome:
        """One try on `replica`. Its load counts the request from here to the end, and its
        `uncached` blocks as prefill still to do until the first token (or the answer) is
        back — what the kv-aware policy weighs."""
        replica.in_flight += 1
        replica.active_blocks += blocks
        replica.requests += 1
        prefill = _Prefill(replica, uncached)
        try:
            if stream:
                return await self._stream(replica, receive, send, path, raw, received, prefill)
            return await self._whole(replica, send, path, raw, received)
        finally:
            prefill.done()
            replica.in_flight -= 1
            replica.active_blocks -= blocks

    async def _whole(
        self, replica: Replica, send: Send, path: str, raw: bytes, received: float
    ) -> _Outcome:
        try:
            response = await replica.upstream.request("POST", path, raw)
            data = await response.read()
        except UpstreamError as e:
            return _Outcome(False, False, 502, f"unreachable: {e}")
        if response.status >= 500:
            return _Outcome(False, False, 502, f"status {response.status}: {data[:200]!r}")
        ReplicaSet.succeeded(replica)
        headers = [
            (b"content-type", response.content_type),
            (b"content-length", str(len(data)).encode()),
            (b"x-phalanx-replica", replica.name.encode()),
        ]
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": data})
        ttft = time.perf_counter() - received
        return _Outcome(
            True,
            response.status < 400,
            response.status,
            ttft_s=ttft,
            tpot_s=engine_tpot(data) if response.status == 200 else None,
        )

    async def _stream(
        self,
        replica: Replica,
        receive: Receive,
        send: Send,
        path: str,
        raw: bytes,
        received: float,
        prefill: _Prefill,
    ) -> _Outcome:
        try:
            response = await replica.upstream.request(
                "POST", path, raw, accept=b"text/event-stream"
            )
            if response.status != 200:
                data = await response.read()
                if response.status >= 500:
                    return _Outcome(False, False, 502, f"status {response.status}: {data[:200]!r}")
        except UpstreamError as e:
            return _Outcome(False, False, 502, f"unreachable: {e}")
        if response.status != 200:  # the engine's own refusal (4xx): passed on as is
            await answer(send, response.status, data, response.content_type)
            return _Outcome(True, False, response.status)
        chunks = response.chunks()
        try:
            first = await anext(chunks)
        except StopAsyncIteration:
            return _Outcome(False, False, 502, "the replica's stream ended before any event")
        except UpstreamError as e:
            await chunks.aclose()
            return _Outcome(False, False, 502, f"stream broke: {e}")
        prefill.done()  # the first token is back: the replica is decoding it now
        ReplicaSet.succeeded(replica)
        # Watch for the client leaving (uvicorn's send then does nothing): stop the
        # replica's generation by dropping its connection.
        gone = asyncio.ensure_future(receive())
        headers = [
            (b"content-type", response.content_type),
            (b"cache-control", b"no-cache"),
            (b"x-phalanx-replica", replica.name.encode()),
        ]
        ok = True
        events = first.count(b"data:")
        last = first
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": first, "more_body": True})
            ttft = time.perf_counter() - received
            try:
                async for chunk in chunks:
                    if gone.done():
                        log.info(
                            "client left mid-stream (%s): dropping the replica's stream",
                            gone.result().get("type") if not gone.cancelled() else "?",
                        )
                        ok = False
                        break
                    events += chunk.count(b"data:")
                    last = chunk
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except UpstreamError as e:
                ok = False
                self._replica_failed(replica, f"stream broke: {e}")
                error = ApiError(502, f"the replica broke off the stream: {e}", "server_error")
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"data: " + error.body() + b"\n\n",
                        "more_body": True,
                    }
                )
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await chunks.aclose()
            gone.cancel()
        tokens = stream_tokens(last, events)
        e2e = time.perf_counter() - received
        tpot = (e2e - ttft) / (tokens - 1) if tokens > 1 else None
        return _Outcome(True, ok, 200, ttft_s=ttft, tpot_s=tpot)
