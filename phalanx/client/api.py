"""`PhalanxClient`: one typed method per endpoint of the head's REST API (sync, over httpx)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Literal, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from phalanx.api.models import (
    CancelRequest,
    DrainRequest,
    Health,
    JobDetail,
    JobInfo,
    JobList,
    JobSpec,
    LogChunk,
    NodeInfo,
    NodeList,
    SubmitResponse,
    TeamInfo,
    TeamList,
    TeamSpec,
    TokenCreate,
    TokenIssued,
    TokenList,
    UserCreate,
    UserInfo,
    UserList,
    WhoAmI,
)

M = TypeVar("M", bound=BaseModel)
Params = Mapping[str, str | int | float | bool]


class ApiError(Exception):
    """A request to the head failed: `status` is the HTTP status (None when the head could
    not be reached) and `detail` the server's explanation, ready to show to a user."""

    def __init__(self, status: int | None, detail: str) -> None:
        super().__init__(detail if status is None else f"{detail} (HTTP {status})")
        self.status = status
        self.detail = detail


def _detail(response: httpx.Response) -> str:
    """The server's `detail`, flattened to one line (FastAPI's 422 gives a list of errors)."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        text = response.text.strip().splitlines()
        return text[0][:300] if text else response.reason_phrase or "no detail"
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(p) for p in item.get("loc", []) if p != "body")
                parts.append(f"{loc}: {item.get('msg', item)}" if loc else str(item.get("msg")))
            else:
                parts.append(str(item))
        return "; ".join(parts) or "invalid request"
    return str(body)[:300]


class PhalanxClient:
    """A session with one head. Every method returns the wire model of its endpoint
    (phalanx.api.models) or raises ApiError."""

    def __init__(self, url: str, token: str | None, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise ApiError(None, f"invalid head URL {url!r}: {exc}") from None

    def __enter__(self) -> PhalanxClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    # ------------------------------------------------------------------ plumbing
    def _request(
        self,
        method: str,
        path: str,
        *,
        body: BaseModel | None = None,
        params: Params | None = None,
    ) -> httpx.Response:
        payload: Any = None if body is None else body.model_dump(mode="json")
        try:
            response = self._http.request(method, path, json=payload, params=params)
        except httpx.TimeoutException:
            raise ApiError(None, f"the head at {self.url} did not answer in time") from None
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise ApiError(None, f"invalid head URL {self.url!r}: {exc}") from None
        except httpx.TransportError as exc:
            raise ApiError(None, f"cannot reach head at {self.url}: {exc}") from None
        if response.status_code >= 400:
            raise ApiError(response.status_code, _detail(response))
        return response

    def _call(
        self,
        model: type[M],
        method: str,
        path: str,
        *,
        body: BaseModel | None = None,
        params: Params | None = None,
    ) -> M:
        response = self._request(method, path, body=body, params=params)
        try:
            return model.model_validate_json(response.content)
        except ValidationError as exc:
            first = exc.errors()[0] if exc.errors() else {"msg": str(exc)}
            raise ApiError(
                response.status_code,
                f"unexpected answer from {method} {path} (not a {model.__name__}): "
                f"{first.get('msg')} at {'.'.join(str(p) for p in first.get('loc', ()))}",
            ) from None

    # ------------------------------------------------------------------ service
    def health(self) -> Health:
        """`GET /healthz` (needs no token)."""
        return self._call(Health, "GET", "/healthz")

    def whoami(self) -> WhoAmI:
        """The user this token belongs to, its role and teams."""
        return self._call(WhoAmI, "GET", "/v1/whoami")

    # ------------------------------------------------------------------ jobs
    def submit(self, spec: JobSpec) -> SubmitResponse:
        """Submit a job (or an array): the new job ids and the head's warnings."""
        return self._call(SubmitResponse, "POST", "/v1/jobs", body=spec)

    def jobs(
        self,
        *,
        active: bool | None = None,
        ended: bool | None = None,
        user: str | None = None,
        team: str | None = None,
        states: Iterable[str] | None = None,
        since: float | None = None,
        limit: int | None = None,
    ) -> JobList:
        """List jobs: `active=True` for the queue, `ended=True` (+ `since`) for history."""
        params: dict[str, str | int | float | bool] = {}
        if active is not None:
            params["active"] = "true" if active else "false"
        if ended is not None:
            params["ended"] = "true" if ended else "false"
        if user:
            params["user"] = user
        if team:
            params["team"] = team
        state_list = list(states or [])
        if state_list:
            params["state"] = ",".join(state_list)
        if since is not None:
            params["since"] = since
        if limit is not None:
            params["limit"] = limit
        return self._call(JobList, "GET", "/v1/jobs", params=params)

    def job(self, job_id: int) -> JobDetail:
        """One job: its state, spec and event log."""
        return self._call(JobDetail, "GET", f"/v1/jobs/{job_id}")

    def cancel(self, job_id: int, signal: str | None = None) -> JobInfo:
        """Cancel a job (or, with `signal`, only send it that signal, as `scancel -s`)."""
        return self._call(
            JobInfo, "POST", f"/v1/jobs/{job_id}/cancel", body=CancelRequest(signal=signal)
        )

    def logs(
        self,
        job_id: int,
        rank: int = 0,
        stream: Literal["stdout", "stderr"] = "stdout",
        offset: int = 0,
    ) -> LogChunk:
        """A chunk of one rank's log from byte `offset` (the head proxies the agent)."""
        params = {"rank": rank, "stream": stream, "offset": offset}
        return self._call(LogChunk, "GET", f"/v1/jobs/{job_id}/logs", params=params)

    # ------------------------------------------------------------------ nodes
    def nodes(self) -> NodeList:
        """Every node with its state, GPUs, heartbeat and jobs."""
        return self._call(NodeList, "GET", "/v1/nodes")

    def drain(self, name: str, reason: str) -> NodeInfo:
        """Stop placing new jobs on a node (running jobs finish)."""
        body = DrainRequest(reason=reason)
        return self._call(NodeInfo, "POST", f"/v1/nodes/{name}/drain", body=body)

    def resume(self, name: str) -> NodeInfo:
        """Put a drained node back in service."""
        return self._call(NodeInfo, "POST", f"/v1/nodes/{name}/resume")

    # ------------------------------------------------------------------ admin
    def users(self) -> UserList:
        """Every user (admin)."""
        return self._call(UserList, "GET", "/v1/users")

    def create_user(self, user: UserCreate) -> UserInfo:
        """Create a user (admin)."""
        return self._call(UserInfo, "POST", "/v1/users", body=user)

    def create_token(self, user: str, description: str = "") -> TokenIssued:
        """Issue an API token for `user`; the secret is in the answer only."""
        body = TokenCreate(user=user, description=description)
        return self._call(TokenIssued, "POST", "/v1/tokens", body=body)

    def tokens(self) -> TokenList:
        """Every token (hashes are never shown) (admin)."""
        return self._call(TokenList, "GET", "/v1/tokens")

    def revoke_token(self, token_id: int) -> None:
        """Revoke a token by id: it stops working at once (admin)."""
        self._request("DELETE", f"/v1/tokens/{token_id}")

    def create_join_token(self) -> TokenIssued:
        """Issue a token agents use to join the cluster (admin)."""
        return self._call(TokenIssued, "POST", "/v1/join-tokens")

    def teams(self) -> TeamList:
        """Every team with its quota, cohort and GPUs in use."""
        return self._call(TeamList, "GET", "/v1/teams")

    def set_team(self, team: TeamSpec) -> TeamInfo:
        """Create or update a team (admin)."""
        return self._call(TeamInfo, "PUT", f"/v1/teams/{team.name}", body=team)
