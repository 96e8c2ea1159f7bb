"""Disaggregated deployments (a prefill pool and a decode pool): the policy picks a prefill
replica, least-load a decode replica; disagg's `Handoff` (phalanx/serve/handoff.py)
prefills on the one and moves the KV to the other; the router then sends the returned body
to the decode replica itself (streamed or not, as the client asked) and releases the
hand-off once that request has ended."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from starlette.types import Receive, Scope, Send

from phalanx.serve.handoff import Handoff, HandoffError
from phalanx.serve.router.answers import ApiError, answer
from phalanx.serve.router.policies import LeastLoad, RouteRequest
from phalanx.serve.router.upstream import UpstreamError

if TYPE_CHECKING:
    from phalanx.serve.router.app import Router


class Disagg:
    def __init__(self, router: Router) -> None:
        self.router = router
        self._handoff: Handoff | None = None
        self._decode_policy = LeastLoad()
        self._replicas_seen: object = None

    def handoff(self) -> Handoff:
        eps = self.router.replicas.endpoints
        engine = eps.engine if eps else "llama.cpp"
        if self._handoff is None or self._handoff.engine != engine:
            if engine == "custom":
                raise ApiError(
                    501, "a custom engine has no prefill → decode hand-off", "server_error"
                )
            self._handoff = Handoff(engine)
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
                prefill, uncached = router.choose(prefills, hashes)
                chosen = self._decode_policy.choose([r.load() for r in decodes], RouteRequest())
                decode = next(r for r in decodes if r.endpoint is chosen)
                prefill.in_flight += 1
                prefill.prefilling += 1
                prefill.prefill_blocks += uncached
                router.stats.started("prefill")
                started = time.perf_counter()
                try:
                    prepared = await handoff.prefill(
                        self.post, prefill.endpoint, decode.endpoint, path, body
                    )
                except HandoffError as e:
                    router.stats.ended("prefill", False)
                    if e.status != 502:  # a request it cannot carry, or no free slot
                        raise ApiError(
                            e.status,
                            f"hand-off: {e}",
                            "server_error" if e.status >= 500 else "invalid_request_error",
                        ) from None
                    # Either replica may have failed: try another pair without both.
                    reason = f"hand-off: {e}"
                    tried.update((prefill.endpoint.url, decode.endpoint.url))
                    router.metrics.errors.labels("hand-off").inc()
                    router.on_replica_error()
                    continue
                finally:
                    prefill.in_flight -= 1
                    prefill.prefilling -= 1
                    prefill.prefill_blocks -= uncached
                router.stats.ended("prefill", True, time.perf_counter() - started)
                router.metrics.handoff.observe(time.perf_counter() - started)
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
        await answer(send, error.status, error.body())
