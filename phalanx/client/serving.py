"""The serving routes of the head's REST API (`/v1/serve/…`), over a PhalanxClient."""

from __future__ import annotations

from urllib.parse import quote

from phalanx.api.serving import (
    AutoscalerClaim,
    AutoscalerLease,
    DeploymentInfo,
    DeploymentList,
    DeploymentSpec,
    Endpoints,
    PoolRole,
    ScaleRequest,
)
from phalanx.client.api import PhalanxClient

BASE = "/v1/serve/deployments"


class ServeClient:
    """`phalanx serve …` and the router call these; errors raise ApiError as the client's."""

    def __init__(self, client: PhalanxClient) -> None:
        self.client = client

    def apply(self, spec: DeploymentSpec) -> DeploymentInfo:
        return self.client._call(DeploymentInfo, "POST", BASE, body=spec)

    def list(self) -> DeploymentList:
        return self.client._call(DeploymentList, "GET", BASE)

    def get(self, name: str) -> DeploymentInfo:
        return self.client._call(DeploymentInfo, "GET", f"{BASE}/{quote(name, safe='')}")

    def scale(
        self,
        name: str,
        pool: PoolRole,
        replicas: int,
        *,
        reason: str | None = None,
        autoscaler: str | None = None,
    ) -> DeploymentInfo:
        """Set a pool's count; an autoscaler names itself (it must hold the lease)."""
        body = ScaleRequest(
            pool=pool,
            replicas=replicas,
            reason=reason[:512] if reason is not None else None,
            autoscaler=autoscaler,
        )
        path = f"{BASE}/{quote(name, safe='')}/scale"
        return self.client._call(DeploymentInfo, "POST", path, body=body)

    def claim_autoscaler(self, name: str, holder: str, ttl_s: float) -> AutoscalerLease:
        """Take or renew the deployment's autoscaler lease (ApiError 409: another holds it)."""
        path = f"{BASE}/{quote(name, safe='')}/autoscaler"
        body = AutoscalerClaim(holder=holder, ttl_s=ttl_s)
        return self.client._call(AutoscalerLease, "POST", path, body=body)

    def release_autoscaler(self, name: str, holder: str) -> None:
        path = f"{BASE}/{quote(name, safe='')}/autoscaler/{quote(holder, safe='')}"
        self.client._request("DELETE", path)

    def delete(self, name: str) -> None:
        self.client._request("DELETE", f"{BASE}/{quote(name, safe='')}")

    def endpoints(self, name: str) -> Endpoints:
        return self.client._call(Endpoints, "GET", f"{BASE}/{quote(name, safe='')}/endpoints")
