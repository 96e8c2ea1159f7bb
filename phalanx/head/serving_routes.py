"""REST routes of serving deployments (`/v1/serve/…`; head/serving.py does the work).

Every route needs a user's API token, except a replica's own report and configuration,
which take its job's step token. A deployment is its owner's: the owner, its team's
admins and admins see and change it; to anyone else it does not exist (404).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from phalanx.api.models import ErrorBody
from phalanx.api.serving import (
    AutoscalerClaim,
    AutoscalerId,
    AutoscalerLease,
    DeploymentInfo,
    DeploymentList,
    DeploymentSpec,
    Endpoints,
    ReplicaConfig,
    ReplicaInfo,
    ReplicaReport,
    ScaleRequest,
)
from phalanx.head.auth import Principal
from phalanx.head.service import Head
from phalanx.head.serving import Serving

_bearer = HTTPBearer(auto_error=False)
Creds = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
Name = Annotated[str, Path(min_length=1, max_length=63, pattern=r"^[a-z]([a-z0-9-]*[a-z0-9])?$")]
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "no such deployment (or not yours to see)"}
}
CHANGED: dict[int | str, dict[str, Any]] = {
    **NOT_FOUND,
    403: {"model": ErrorBody, "description": "not a member of the team, or QOS not allowed"},
    409: {"model": ErrorBody, "description": "the name is another user's deployment"},
    422: {"model": ErrorBody, "description": "the spec or request is invalid"},
    429: {"model": ErrorBody, "description": "too many deployments"},
}
REPLICA: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "not the step token of a running replica job"},
    403: {"model": ErrorBody, "description": "the URL is not on the replica's node"},
    404: {"model": ErrorBody, "description": "that job is not a replica"},
}


def _serving(request: Request) -> Serving:
    head: Head = request.app.state.head
    return head.serving


async def _user(request: Request, creds: Creds) -> Principal:
    head: Head = request.app.state.head
    return Head.require_user(head.authenticate(creds.credentials if creds else None))


async def _replica_token(request: Request, creds: Creds) -> str:
    """A running replica job's step token, checked before the body is read."""
    token = creds.credentials if creds else None
    _serving(request).check_replica_token(token)
    assert token is not None
    return token


User = Annotated[Principal, Depends(_user)]
ReplicaToken = Annotated[str, Depends(_replica_token)]
router = APIRouter()


@router.post("/v1/serve/deployments", response_model=DeploymentInfo, responses=CHANGED)
def apply(request: Request, who: User, spec: DeploymentSpec) -> DeploymentInfo:
    """Create a deployment, or update it: a changed spec rolls out as a new generation
    (new replicas ready before old ones go); only replica counts changed: scaled; the same
    spec: nothing changes."""
    return _serving(request).apply(who, spec)


@router.get("/v1/serve/deployments", response_model=DeploymentList)
def list_deployments(request: Request, who: User) -> DeploymentList:
    """The deployments the caller may see (own; their teams' as team admin; all: admin)."""
    return _serving(request).visible(who)


@router.get("/v1/serve/deployments/{name}", response_model=DeploymentInfo, responses=NOT_FOUND)
def get_deployment(request: Request, who: User, name: Name) -> DeploymentInfo:
    return _serving(request).get(who, name)


@router.post("/v1/serve/deployments/{name}/scale", response_model=DeploymentInfo, responses=CHANGED)
def scale(request: Request, who: User, name: Name, req: ScaleRequest) -> DeploymentInfo:
    """Set a pool's replica count (within its min/max when it has them)."""
    return _serving(request).scale(who, name, req)


LEASED: dict[int | str, dict[str, Any]] = {
    **NOT_FOUND,
    409: {"model": ErrorBody, "description": "another autoscaler holds the lease"},
}


@router.post(
    "/v1/serve/deployments/{name}/autoscaler", response_model=AutoscalerLease, responses=LEASED
)
def claim_autoscaler(
    request: Request, who: User, name: Name, claim: AutoscalerClaim
) -> AutoscalerLease:
    """Take or renew the deployment's autoscaler lease (one autoscaler acts at a time;
    its scale requests name it in `autoscaler`)."""
    return _serving(request).claim_autoscaler(who, name, claim)


@router.delete("/v1/serve/deployments/{name}/autoscaler/{holder}", responses=NOT_FOUND)
def release_autoscaler(
    request: Request,
    who: User,
    name: Name,
    holder: Annotated[AutoscalerId, Path()],
) -> dict[str, str]:
    """Give the lease up (an autoscaler stopping) if `holder` holds it."""
    _serving(request).release_autoscaler(who, name, holder)
    return {"released": name}


@router.delete("/v1/serve/deployments/{name}", responses=NOT_FOUND)
def delete(request: Request, who: User, name: Name) -> dict[str, str]:
    """Delete the deployment; its replica jobs are cancelled."""
    _serving(request).delete(who, name)
    return {"deleted": name}


@router.get("/v1/serve/deployments/{name}/endpoints", response_model=Endpoints, responses=NOT_FOUND)
def endpoints(request: Request, who: User, name: Name) -> Endpoints:
    """The ready replicas and the engine key (what the router routes to)."""
    return _serving(request).endpoints(who, name)


@router.post("/v1/serve/replicas/self", response_model=ReplicaInfo, responses=REPLICA)
def report_self(request: Request, token: ReplicaToken, report: ReplicaReport) -> ReplicaInfo:
    """A replica's wrapper reports its engine's URL and readiness (its step token)."""
    return _serving(request).report(token, report)


@router.get("/v1/serve/replicas/self", response_model=ReplicaConfig, responses=REPLICA)
def replica_self(
    request: Request,
    token: ReplicaToken,
    job_id: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
) -> ReplicaConfig:
    """What a replica's wrapper starts: its deployment's spec, pool and engine key."""
    return _serving(request).replica_config(token, job_id)
