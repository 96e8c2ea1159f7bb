"""The router's calls to the head: the deployment's endpoints and audience (with the
router's own token), and a client token's identity (`GET /v1/whoami` with that token)."""

from __future__ import annotations

import httpx
from pydantic import ValidationError

from phalanx.api.models import WhoAmI
from phalanx.api.serving import DeploymentInfo, Endpoints, RouterStatsReport
from phalanx.serve.router.access import Audience, HeadUnreachable
from phalanx.tls import client_context


class HeadError(Exception):
    """The head answered, but not what the router needs (the message says what)."""


class HeadLink:
    def __init__(self, url: str, token: str, ca: str | None = None, timeout_s: float = 10.0):
        self.url = url.rstrip("/")
        self._token = token
        self._http = httpx.AsyncClient(
            base_url=self.url,
            timeout=timeout_s,
            verify=client_context(ca),
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=8),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _get(self, path: str, token: str) -> httpx.Response:
        try:
            return await self._http.get(path, headers={"Authorization": f"Bearer {token}"})
        except httpx.HTTPError as e:
            raise HeadUnreachable(f"the head at {self.url} did not answer: {e!r}") from None

    async def whoami(self, token: str) -> WhoAmI | None:
        """The token's user; None when the head refuses the token."""
        r = await self._get("/v1/whoami", token)
        if r.status_code in (401, 403):
            return None
        if r.status_code != 200:
            raise HeadUnreachable(f"GET /v1/whoami answered {r.status_code}")
        try:
            return WhoAmI.model_validate_json(r.content)
        except ValidationError:
            raise HeadUnreachable("GET /v1/whoami answered something unexpected") from None

    async def endpoints(self, name: str) -> Endpoints:
        return Endpoints.model_validate_json(
            await self._json(f"/v1/serve/deployments/{name}/endpoints")
        )

    async def audience(self, name: str) -> Audience:
        info = DeploymentInfo.model_validate_json(await self._json(f"/v1/serve/deployments/{name}"))
        return Audience(owner=info.owner, team=info.team or info.spec.team)

    async def deployment(self, name: str) -> DeploymentInfo:
        return DeploymentInfo.model_validate_json(await self._json(f"/v1/serve/deployments/{name}"))

    async def post_stats(self, name: str, report: RouterStatsReport) -> None:
        """The router's summary to the head (HeadError/HeadUnreachable when refused)."""
        path = f"/v1/serve/deployments/{name}/stats"
        try:
            r = await self._http.post(
                path,
                content=report.model_dump_json(),
                headers={
                    "Authorization": f"Bearer {self._token}",
                    "Content-Type": "application/json",
                },
            )
        except httpx.HTTPError as e:
            raise HeadUnreachable(f"the head at {self.url} did not answer: {e!r}") from None
        if r.status_code in (401, 403, 404, 422):
            raise HeadError(f"POST {path} answered {r.status_code}: {r.text[:300]}")
        if r.status_code != 200:
            raise HeadUnreachable(f"POST {path} answered {r.status_code}")

    async def _json(self, path: str) -> bytes:
        r = await self._get(path, self._token)
        if r.status_code == 404:
            raise HeadError(f"GET {path}: no such deployment (or this token may not see it)")
        if r.status_code in (401, 403):
            raise HeadError(f"GET {path}: the router's token is refused ({r.status_code})")
        if r.status_code != 200:
            raise HeadUnreachable(f"GET {path} answered {r.status_code}")
        return r.content
