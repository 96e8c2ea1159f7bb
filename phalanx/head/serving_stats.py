"""Serving metrics in the head: the routers' summaries (`POST /v1/serve/deployments/{name}/
stats`, the router's token, every ~5 s), kept in memory — the latest per router, stale after
30 s — and shown in `GET /v1/serve/deployments/{name}`, `phalanx serve show`, the
dashboard, and as per-deployment gauges on the head's /metrics (docs/serving-metrics.md).

Nothing here is stored: after a head restart the routers' next reports fill it again.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from phalanx.api.models import ErrorBody
from phalanx.api.serving import RouterStatsInfo, RouterStatsReport
from phalanx.head.auth import Principal
from phalanx.head.service import Head

# ----------------------------------------------------------------------------- REST
_bearer = HTTPBearer(auto_error=False)
Creds = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
Name = Annotated[str, Path(min_length=1, max_length=63, pattern=r"^[a-z]([a-z0-9-]*[a-z0-9])?$")]
RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "no token, or an unknown one"},
    404: {"model": ErrorBody, "description": "no such deployment (or not yours to see)"},
    422: {"model": ErrorBody, "description": "the report is invalid"},
}


async def _user(request: Request, creds: Creds) -> Principal:
    head: Head = request.app.state.head
    return Head.require_user(head.authenticate(creds.credentials if creds else None))


router = APIRouter()


@router.post(
    "/v1/serve/deployments/{name}/stats", response_model=RouterStatsInfo, responses=RESPONSES
)
def report_stats(
    request: Request,
    who: Annotated[Principal, Depends(_user)],
    name: Name,
    report: RouterStatsReport,
) -> RouterStatsInfo:
    """A router's summary of the deployment (its token: one that may read the
    deployment's endpoints — its owner's, its team admin's or an admin's). The head keeps
    each router's latest for `GET /v1/serve/deployments/{name}` and /metrics."""
    head: Head = request.app.state.head
    serving = head.serving
    info = serving.get(who, name)  # 404 unless the token may see it
    pools = {p.role for p in info.spec.pools}
    report = report.model_copy(update={"pools": [p for p in report.pools if p.role in pools]})
    kept = serving.stats.record(name, report)
    with head.control.lock:
        head.control.changes += 1  # the dashboard's serving page follows it
    return kept
