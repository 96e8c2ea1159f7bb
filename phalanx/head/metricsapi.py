"""The head's Prometheus endpoints (an APIRouter included by head/app.py):

- `GET /metrics`: the head's counters, histograms and gauges (head/metrics.py);
- `GET /v1/metrics/gpus?shard=K&of=N`: the per-GPU series (head/gpuscrape.py);
- `POST /v1/metrics/tokens`: an admin mints a scrape-only token.

Who may scrape: admins' API tokens and scrape-only (`metrics`) tokens. The per-GPU series
carry job, user and team labels of every team, so a plain user's token gets 403 there as
on /metrics: a user sees their own jobs' GPUs in `phalanx show` (JobDetail.gpus). A
scrape-only token opens nothing else: every other route wants a user's API token.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from phalanx.api import gpumetrics
from phalanx.api import models as m
from phalanx.api.metrics import MetricsTokenCreate
from phalanx.head import auth, gpuscrape
from phalanx.head.auth import Forbidden, Principal
from phalanx.head.control import HeadError
from phalanx.head.mirror import Tx
from phalanx.head.service import Head
from phalanx.head.store import add_token

PROMETHEUS_TEXT: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {gpumetrics.CONTENT_TYPE: {}},
        "description": "Prometheus text exposition format 0.0.4",
    }
}


def _head(request: Request) -> Head:
    head: Head = request.app.state.head
    return head


def may_scrape(who: Principal) -> bool:
    """Scrape-only tokens and admins' API tokens."""
    return who.kind == "metrics" or (who.kind == "api" and who.admin)


_bearer = HTTPBearer(auto_error=False)


async def principal(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """Who calls (head/app.py's dependency of the same name, which imports this module)."""
    return _head(request).authenticate(creds.credentials if creds else None)


Who = Annotated[Principal, Depends(principal)]


async def scraper(who: Who) -> Principal:
    if not may_scrape(who):
        raise Forbidden("metrics need an admin token or a scrape-only token (--scope metrics)")
    return who


Scraper = Annotated[Principal, Depends(scraper)]


def router() -> APIRouter:
    """The routes, for head/app.py's create_app to include."""
    r = APIRouter()
    labels: dict[tuple[object, ...], str] = {}  # the per-GPU label sets (gpumetrics.render)

    @r.get("/metrics", response_class=Response, responses=PROMETHEUS_TEXT)
    async def metrics(request: Request, who: Scraper) -> Response:
        """The head's own series: job and node transition counters, wait and cycle
        histograms, GPU, node, job, queue and quota gauges (no per-job labels)."""
        head = _head(request)
        body = await asyncio.to_thread(head.metrics.exposition)
        return Response(body, media_type=gpumetrics.CONTENT_TYPE)

    @r.get("/v1/metrics/gpus", response_class=Response, responses=PROMETHEUS_TEXT)
    async def gpus(
        request: Request,
        who: Scraper,
        shard: Annotated[int, Query(ge=0, lt=gpuscrape.MAX_SHARDS)] = 0,
        of: Annotated[int, Query(ge=1, le=gpuscrape.MAX_SHARDS)] = 1,
    ) -> Response:
        """Every GPU's latest reading with node, gpu, uuid, job, user and team labels; with
        `of` > 1 only the nodes whose name hashes (CRC-32) to `shard` modulo `of`."""
        if shard >= of:
            raise HeadError(422, f"shard must be below of: got shard={shard} of={of}")
        head = _head(request)

        def build() -> bytes:
            rows = gpuscrape.gpu_rows(
                head.mirror, head.metrics.gpu_holders, head.samples, head.now(), shard, of
            )
            return gpumetrics.render(rows, labels).encode()

        body = await asyncio.to_thread(build)
        return Response(body, media_type=gpumetrics.CONTENT_TYPE)

    @r.post("/v1/metrics/tokens", status_code=201, response_model=m.TokenIssued)
    def create_token(
        request: Request,
        who: Who,
        body: MetricsTokenCreate | None = None,
    ) -> m.TokenIssued:
        """Mint a scrape-only token (admins): it reads /metrics and /v1/metrics/gpus."""
        head = _head(request)
        head.require_admin(who)
        req = body or MetricsTokenCreate()
        expires = head._expiry(who, req.expires_s, head.mirror.settings.api_token_ttl_s)
        token = auth.new_token("metrics")
        description = req.description or "metrics scrape token"

        def op(tx: Tx) -> int:
            return add_token(
                tx.conn,
                auth.token_hash(token),
                "metrics",
                None,
                None,
                description,
                tx.now,
                expires=expires,
            )

        token_id = head.control.call(op)
        return m.TokenIssued(id=token_id, token=token, user=None, kind="metrics", expires=expires)

    return r
