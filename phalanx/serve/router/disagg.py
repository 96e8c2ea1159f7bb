"""Disaggregated deployments (a prefill pool and a decode pool): the policy picks a prefill
replica, least-load a decode replica; disagg's `Handoff` (phalanx/serve/handoff.py)
prefills on the one and moves the KV to the other; the router then sends the returned body
to the decode replica itself (streamed or not, as the client asked) and releases the
hand-off once that request has ended."""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from starlette.types import Receive, Scope, Send

from phalanx.api.serving import Endpoint
from phalanx.serve.router.policies import LeastLoad, RouteRequest
from phalanx.serve.router.upstream import UpstreamError

if TYPE_CHECKING:
    from phalanx.serve.router.app import Router

Post = Callable[[str, str, dict[str, Any]], Awaitable[tuple[int, dict[str, Any]]]]


class PreparedLike(Protocol):
    @property
    def body(self) -> dict[str, Any]: ...
    @property
    def release(self) -> Callable[[], Awaitable[None]]: ...


class HandoffLike(Protocol):
    """disagg's `Handoff` as serving.md fixes it."""

    def set_replicas(self, endpoints: Sequence[Endpoint]) -> None: ...

    async def prefill(
        self, post: Post, prefill: Endpoint, decode: Endpoint, path: str, body: dict[str, Any]
    ) -> PreparedLike: ...


class Disagg:
    def __init__(self, router: Router) -> None:
        self.router = router
        self._handoff: HandoffLike | None = None
        self._handoff_error: type[Exception] = Exception
        self._engine: str | None = None
        self._decode_policy = LeastLoad()
        self._replicas_seen: object = None

    def handoff(self) -> HandoffLike:
        eps = self.router.replicas.endpoints
        engine = eps.engine if eps else "llama.cpp"
        if self._handoff is None or self._engine != engine:
            from phalanx.serve.router.app import ApiError

            try:
                module = importlib.import_module("phalanx.serve.handoff")
            except ImportError:
                raise ApiError(
                    501, "disaggregated serving needs phalanx.serve.handoff", "server_error"
                ) from None
            self._handoff = module.Handoff(engine)
            self._handoff_error = module.HandoffError
            self._engine = engine
            self._replicas_seen = None
        if eps is not None and self._replicas_seen is not eps:
            self._handoff.set_replicas(eps.endpoints)
            self._replicas_seen = eps
        return self._handoff

    async def post(self, url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The router's upstream client for the hand-off (carries the engine key)."""
        replica = self.router.replicas.by_url(url)
        if replica is None:
            raise UpstreamError(f"{url} is not a replica of the deployment")
        response = await replica.upstream.request("POST", path, json.dumps(body).encode())
        data = await response.read()
        try:
            answer = json.loads(data) if data else {}
        except ValueError:
            answer = {"error": data[:500].decode("utf-8", "replace")}
        return response.status, answer if isinstance(answer, dict) else {"answer": answer}

    async def complete(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        path: str,
        body: dict[str, Any],
        stream: bool,
        hashes: tuple[bytes, ...],
        received: float,
    ) -> None:
        from phalanx.serve.router.app import ApiError, _answer

        router = self.router
        handoff = self.handoff()
        tried: set[str] = set()
        reason = "no prefill or decode replica is ready"
        router.stats.queued("prefill", 1)
        queued = True
        try:
            for _ in range(router.config.retries + 1):
                prefills = router.replicas.routable("prefill", tried)
                decodes = router.replicas.routable("decode", tried)
                if not prefills or not decodes:
                    break
                prefill = router.pick(prefills, hashes)
                chosen = self._decode_policy.choose([r.load() for r in decodes], RouteRequest())
                decode = next(r for r in decodes if r.endpoint is chosen)
                prefill.in_flight += 1
                router.stats.started("prefill")
                started = time.perf_counter()
                try:
                    prepared = await handoff.prefill(
                        self.post, prefill.endpoint, decode.endpoint, path, body
                    )
                except (self._handoff_error, UpstreamError) as e:
                    reason = f"hand-off: {e}"
                    tried.update((prefill.endpoint.url, decode.endpoint.url))
                    router.stats.ended("prefill", False)
                    router._replica_failed(prefill, reason)
                    continue
                finally:
                    prefill.in_flight -= 1
                router.stats.ended("prefill", True, time.perf_counter() - started)
                router.stats.queued("prefill", -1)
                queued = False
                try:
                    raw = json.dumps(prepared.body).encode()
                    await router.route(
                        receive, send, path, raw, stream, (), received, "decode", decode
                    )
                finally:
                    await prepared.release()
                return
        finally:
            if queued:
                router.stats.queued("prefill", -1)
        error = ApiError(502, f"no replica could answer: {reason}", "server_error")
        await _answer(send, error.status, error.body())
