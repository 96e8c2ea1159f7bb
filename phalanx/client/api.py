"""`PhalanxClient`: one typed method per endpoint of the head's REST API (sync, over httpx)."""

from __future__ import annotations

import json
import logging
import socket
import ssl
import time
import uuid
from collections.abc import Generator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from phalanx.api import version
from phalanx.api.metrics import MetricsTokenCreate
from phalanx.api.models import (
    CancelRequest,
    DrainRequest,
    ExecFrame,
    ExecRequest,
    FaultInjection,
    Health,
    JobDetail,
    JobInfo,
    JobList,
    JobSpec,
    JobTable,
    JobUpdate,
    JoinTokenCreate,
    LogChunk,
    NodeInfo,
    NodeList,
    PriorityList,
    ShareList,
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
    UserUpdate,
    WhoAmI,
)
from phalanx.api.telemetry import JobStats
from phalanx.api.usage import (
    IdleGpuList,
    IdlePolicyInfo,
    IdlePolicyList,
    IdlePolicySpec,
    UsageReport,
)
from phalanx.tls import CA_FILE_ENV, TLSError, client_context

log = logging.getLogger("phalanx.client")
M = TypeVar("M", bound=BaseModel)
Params = Mapping[str, str | int | float | bool]
IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_JOB_IDS = 400  # ids in one `GET /v1/jobs?ids=…` (the head bounds them the same)
# Answers that mean "nothing was done, ask again (maybe another head)": a standby or a
# restarting head (503), a proxy in front of a head that is down (502, 504).
_TRY_AGAIN = frozenset({502, 503, 504})
# Methods safe to send again after the head may have received them (GET reads; PUT and
# DELETE are idempotent). A POST moves to the next head only if it never left (connect
# error) or the head refused it unread (503); a keyed submit is safe anyway.
_RESENDABLE = frozenset({"GET", "HEAD", "PUT", "DELETE"})
_FIRST_PAUSE_S = 0.1  # between submit attempts, doubling up to 2 s
# A client that has never reached any head (a typo'd --head, a head not started) gives up
# on a submit after this long, not after submit_retry_s: a head restart is over sooner.
FIRST_CONTACT_RETRY_S = 3.0


class ApiError(Exception):
    """A request to the head failed: `status` is the HTTP status (None when the head could
    not be reached) and `detail` the server's explanation, ready to show to a user.

    The message is the detail alone: the head's details name the problem in words, and a
    status code is noise to the person reading it. A server fault (5xx but 503, whose
    detail says which head is the leader), which no detail explains, keeps its status."""

    def __init__(self, status: int | None, detail: str) -> None:
        server_fault = status is not None and status >= 500 and status != 503
        super().__init__(f"the head failed (HTTP {status}): {detail}" if server_fault else detail)
        self.status = status
        self.detail = detail


class HeadUnreachable(ApiError):
    """No head answered (connection refused, timed out, or cut mid-answer): status None.
    `unknown_host`: no head's name could even be resolved (a typo, not an outage)."""

    def __init__(self, detail: str, unknown_host: bool = False) -> None:
        super().__init__(None, detail)
        self.unknown_host = unknown_host


def _unresolvable(exc: BaseException) -> bool:
    """Whether a transport error is a failed name lookup (socket.gaierror underneath)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, socket.gaierror):
            return True
        seen = seen.__cause__ or seen.__context__
    return "Name or service not known" in str(exc) or "nodename nor servname" in str(exc)


def new_idempotency_key() -> str:
    """A fresh random key for one submit (32 hex digits)."""
    return uuid.uuid4().hex


_TLS_HINT = (
    f" (pin the head's CA: set {CA_FILE_ENV} to its STATE_DIR/tls/ca.crt, or put "
    '"ca" in the client config)'
)


def _untrusted(exc: httpx.TransportError) -> bool:
    """Whether the head's TLS certificate failed verification."""
    cause = exc.__cause__ or exc.__context__
    return isinstance(cause, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(
        exc
    )


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
    """A session with a head. Every method returns the wire model of its endpoint
    (phalanx.api.models) or raises ApiError.

    `url` may name several heads (a list, or one string with commas: a leader and its
    standbys, docs/high-availability.md): a request goes to the one that answered last,
    and moves on to the next when a head cannot be reached or answers 503 (a standby).
    `submit` also retries for up to `submit_retry_s` while no head can take it (a head
    restarting or failing over), with the same idempotency key, so it is created once.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        token: str | None,
        *,
        timeout: float = 30.0,
        submit_retry_s: float = 30.0,
        ca: str | None = None,
    ) -> None:
        self.urls = _head_urls(url)
        self.submit_retry_s = submit_retry_s
        self._current = 0
        self.answered = False  # some head has answered this client (it exists, the URL is right)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers.update(version.headers())
        try:
            verify = client_context(ca)
        except TLSError as exc:
            raise ApiError(None, str(exc)) from None
        self._http = httpx.Client(headers=headers, timeout=timeout, verify=verify)

    @property
    def url(self) -> str:
        """The head URL in use: the one that answered last (the first to begin with)."""
        return self.urls[self._current]

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
        headers: Mapping[str, str] | None = None,
        resendable: bool = False,
        sparse: bool = False,
    ) -> httpx.Response:
        """One request, to each head in turn from the one that answered last (see class)."""
        # `sparse`: only the fields the caller set (a PATCH changes what it names).
        payload: Any = None if body is None else body.model_dump(mode="json", exclude_unset=sparse)
        resendable = resendable or method in _RESENDABLE
        problems: list[str] = []
        unknown_hosts = 0
        refused: httpx.Response | None = None
        for step in range(len(self.urls)):
            index = (self._current + step) % len(self.urls)
            url = self.urls[index]
            try:
                response = self._http.request(
                    method, url + path, json=payload, params=params, headers=headers
                )
            except httpx.TimeoutException as exc:
                problems.append(f"the head at {url} did not answer in time")
                if not (resendable or isinstance(exc, httpx.ConnectTimeout)):
                    raise HeadUnreachable(problems[-1]) from None
                continue
            except httpx.TransportError as exc:
                if _untrusted(exc):  # a setting to fix, not an outage to wait out
                    msg = f"the head at {url} is not trusted: {exc}{_TLS_HINT}"
                    raise ApiError(None, msg) from None
                if _unresolvable(exc):
                    unknown_hosts += 1
                    problems.append(
                        f"cannot reach head at {url}: unknown host {exc.request.url.host!r}"
                    )
                else:
                    problems.append(f"cannot reach head at {url}: {exc}")
                if not (resendable or isinstance(exc, httpx.ConnectError)):
                    # It may have been received: sending it again could repeat it.
                    raise HeadUnreachable(problems[-1]) from None
                continue
            self.answered = True
            skew = version.mismatch(
                response.headers.get(version.HEADER), me="client", them=f"head at {url}"
            )
            if skew is not None:
                raise ApiError(response.status_code, skew)
            if response.status_code == 503:
                refused = response  # a standby or a restarting head: it did nothing
                continue
            self._current = index
            if response.status_code >= 400:
                raise ApiError(response.status_code, _detail(response))
            return response
        if refused is not None:
            raise ApiError(refused.status_code, _detail(refused))
        raise HeadUnreachable("; ".join(problems), unknown_host=unknown_hosts == len(self.urls))

    def _call(
        self,
        model: type[M],
        method: str,
        path: str,
        *,
        body: BaseModel | None = None,
        params: Params | None = None,
        headers: Mapping[str, str] | None = None,
        resendable: bool = False,
        sparse: bool = False,
    ) -> M:
        response = self._request(
            method,
            path,
            body=body,
            params=params,
            headers=headers,
            resendable=resendable,
            sparse=sparse,
        )
        try:
            # Fields this client does not know are ignored, also inside the JobSpec of a
            # JobDetail: a head one minor API version ahead may add some.
            return model.model_validate_json(response.content, extra="ignore")
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
    def submit(self, spec: JobSpec, *, idempotency_key: str | None = None) -> SubmitResponse:
        """Submit a job (or an array): the new job ids and the head's warnings.

        Sends an idempotency key (a new random one unless given) and, while no head can
        take the submit (unreachable, restarting, a standby: 502/503/504), tries again
        with the same key, backing off, for up to `submit_retry_s`: a submit whose answer
        was lost is answered with the job it created, never a second job.
        """
        key = idempotency_key or new_idempotency_key()
        headers = {IDEMPOTENCY_HEADER: key}
        started = time.monotonic()
        deadline = started + self.submit_retry_s
        pause = _FIRST_PAUSE_S
        while True:
            try:
                return self._call(
                    SubmitResponse, "POST", "/v1/jobs", body=spec, headers=headers, resendable=True
                )
            except ApiError as exc:
                unreachable = isinstance(exc, HeadUnreachable)
                if isinstance(exc, HeadUnreachable) and exc.unknown_host:
                    raise  # a name that does not resolve will not start to in seconds
                if unreachable and not self.answered:
                    deadline = min(deadline, started + FIRST_CONTACT_RETRY_S)
                again = unreachable or exc.status in _TRY_AGAIN
                if not again or time.monotonic() + pause > deadline:
                    raise
                if pause == _FIRST_PAUSE_S:  # once per submit: the CLI shows it on stderr
                    log.warning(
                        "%s; trying the submit again for up to %.0fs (it will not run twice)",
                        exc.detail,
                        deadline - started,
                    )
            time.sleep(pause)
            pause = min(pause * 2, 2.0)

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
        array: int | None = None,
    ) -> JobList:
        """List jobs: `active=True` for the queue, `ended=True` (+ `since`) for history;
        `array`: only that array's tasks."""
        params = _job_filters(active, ended, user, team, states, since, limit)
        if array is not None:
            params["array"] = array
        return self._call(JobList, "GET", "/v1/jobs", params=params)

    def job_table(
        self,
        *,
        active: bool | None = None,
        ended: bool | None = None,
        user: str | None = None,
        team: str | None = None,
        states: Iterable[str] | None = None,
        since: float | None = None,
        limit: int | None = None,
        ids: Iterable[int] | None = None,
    ) -> JobTable:
        """`jobs()` as rows of values (JobTable): far cheaper for thousands of jobs; `ids`:
        only these jobs (an array's id: all its tasks; at most MAX_JOB_IDS)."""
        params = _job_filters(active, ended, user, team, states, since, limit)
        params["format"] = "table"
        if ids is not None:
            wanted = list(ids)
            if not 1 <= len(wanted) <= MAX_JOB_IDS:
                raise ValueError(f"give 1 to {MAX_JOB_IDS} job ids, not {len(wanted)}")
            params["ids"] = ",".join(str(i) for i in wanted)
        return self._call(JobTable, "GET", "/v1/jobs", params=params)

    def job(self, job: int | str) -> JobDetail:
        """One job (`123`, or `"123_4"` for an array task): its state, spec and event log."""
        return self._call(JobDetail, "GET", f"/v1/jobs/{_ref(job)}")

    def job_stats(
        self, job: int | str, resolution: str | None = None, series: bool = True
    ) -> JobStats:
        """A job's GPU efficiency (`phalanx jobstats`): per-GPU utilisation, memory and
        energy, idle GPUs, CPU and memory use, MFU and tokens/s, notes; `resolution` of
        the series: raw, minute or hour (None: by the job's length)."""
        params: dict[str, str | int | float | bool] = {"series": series}
        if resolution is not None:
            params["resolution"] = resolution
        return self._call(JobStats, "GET", f"/v1/jobs/{_ref(job)}/stats", params=params)

    def cancel(
        self,
        job: int | str,
        signal: str | None = None,
        scope: Literal["all", "steps", "batch"] | None = None,
    ) -> JobInfo:
        """Cancel a job, an array task (`"123_4"`) or a whole array (its id); with `signal`,
        only send it that signal, as `scancel -s`: to every process (`scope` None or
        "all"), a batch job's srun steps ("steps") or its script ("batch"). Answers with
        the job named."""
        # Only what is set goes on the wire: a head that predates `scope` takes the rest.
        body = (
            CancelRequest(signal=signal)
            if scope is None
            else CancelRequest(signal=signal, scope=scope)
        )
        return self._call(JobInfo, "POST", f"/v1/jobs/{_ref(job)}/cancel", body=body, sparse=True)

    def hold(self, job: int | str) -> JobList:
        """Keep pending jobs from starting (`scontrol hold`); the jobs held."""
        return self._call(JobList, "POST", f"/v1/jobs/{_ref(job)}/hold")

    def release(self, job: int | str) -> JobList:
        """Let held jobs start (`scontrol release`); the jobs released."""
        return self._call(JobList, "POST", f"/v1/jobs/{_ref(job)}/release")

    def requeue(self, job: int | str) -> JobList:
        """Stop running jobs and queue them again (`scontrol requeue`); the jobs requeued."""
        return self._call(JobList, "POST", f"/v1/jobs/{_ref(job)}/requeue")

    def update(self, job: int | str, change: JobUpdate) -> JobList:
        """Change jobs' time limit, QOS, priority or dependencies (`scontrol update`)."""
        return self._call(JobList, "PATCH", f"/v1/jobs/{_ref(job)}", body=change, sparse=True)

    def logs(
        self,
        job_id: int | str,
        rank: int = 0,
        stream: Literal["stdout", "stderr"] = "stdout",
        offset: int = 0,
    ) -> LogChunk:
        """A chunk of one rank's log from byte `offset` (the head proxies the agent)."""
        params = {"rank": rank, "stream": stream, "offset": offset}
        return self._call(LogChunk, "GET", f"/v1/jobs/{_ref(job_id)}/logs", params=params)

    def priority(self) -> PriorityList:
        """Queued jobs in the scheduler's order, with QOS priority, fair share and age."""
        return self._call(PriorityList, "GET", "/v1/priority")

    def shares(self) -> ShareList:
        """Every team's quota, use and fair-share standing."""
        return self._call(ShareList, "GET", "/v1/shares")

    def exec(self, job_id: int, request: ExecRequest) -> Generator[ExecFrame, None, None]:
        """Run a command beside a running rank (`phalanx exec`): its frames as they stream
        in (output, keepalives; the last is `exit`). Sent once, to the head that answered
        last (a command must not run twice). Closing the iterator early (Ctrl-C) closes the
        stream, which kills the command. Raises ApiError when it is refused or cut off."""
        url = f"{self.url}/v1/jobs/{job_id}/exec"
        # The head relays a line at least every few seconds (keepalives): a minute of
        # silence means the head or the path to it is gone.
        timeout = httpx.Timeout(30.0, read=60.0)
        try:
            with self._http.stream(
                "POST",
                url,
                content=request.model_dump_json(),
                headers={"Content-Type": "application/json"},
                timeout=timeout,
            ) as response:
                skew = version.mismatch(
                    response.headers.get(version.HEADER), me="client", them=f"head at {self.url}"
                )
                if skew is not None:
                    raise ApiError(response.status_code, skew)
                if response.status_code >= 400:
                    response.read()
                    raise ApiError(response.status_code, _detail(response))
                for line in response.iter_lines():
                    if line.strip():
                        yield _frame(line)
        except httpx.TimeoutException:
            raise HeadUnreachable(f"the head at {self.url} went silent during the exec") from None
        except httpx.TransportError as exc:
            if _untrusted(exc):
                raise ApiError(
                    None, f"the head at {self.url} is not trusted: {exc}{_TLS_HINT}"
                ) from None
            raise HeadUnreachable(f"lost the head at {self.url}: {exc}") from None

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

    def inject_fault(self, node: str, fault: FaultInjection) -> None:
        """Make a node with fake GPUs report `fault` as if NVML had seen it (admin; the
        head answers 409 for a node with real GPUs, 422 for a GPU it does not have)."""
        self._request("POST", f"/v1/nodes/{quote(node, safe='')}/faults", body=fault)

    # ------------------------------------------------------------------ admin
    def users(self) -> UserList:
        """Every user (admin)."""
        return self._call(UserList, "GET", "/v1/users")

    def create_user(self, user: UserCreate) -> UserInfo:
        """Create a user (admin)."""
        return self._call(UserInfo, "POST", "/v1/users", body=user)

    def set_user(self, name: str, update: UserUpdate) -> UserInfo:
        """Change what `update` names of a user: its Unix uid/gid, its QOS allowance (admin)."""
        path = f"/v1/users/{quote(name, safe='')}"
        return self._call(UserInfo, "PATCH", path, body=update, sparse=True)

    def create_token(
        self, user: str, description: str = "", expires_s: float | None = None
    ) -> TokenIssued:
        """Issue an API token for `user` (a user: for themself); the secret is in the answer
        only. It expires in `expires_s` (None: the head's default), never after the token
        that asks for it."""
        body = TokenCreate(user=user, description=description, expires_s=expires_s)
        return self._call(TokenIssued, "POST", "/v1/tokens", body=body)

    def create_metrics_token(
        self, description: str = "", expires_s: float | None = None
    ) -> TokenIssued:
        """Issue a scrape-only token (admin): it reads /metrics and /v1/metrics/gpus and
        nothing else. It expires in `expires_s` (None: the head's default for API tokens)."""
        body = MetricsTokenCreate(description=description, expires_s=expires_s)
        return self._call(TokenIssued, "POST", "/v1/metrics/tokens", body=body)

    def metrics_text(self, path: str = "/metrics", params: Params | None = None) -> str:
        """A Prometheus exposition of the head (`/metrics`, `/v1/metrics/gpus`) as text."""
        return self._request("GET", path, params=params).text

    def tokens(self, everyone: bool = True) -> TokenList:
        """Tokens (hashes are never shown): an admin's answer has every token (`everyone`
        False: their own), a user's their own."""
        params = None if everyone else {"all": "false"}
        return self._call(TokenList, "GET", "/v1/tokens", params=params)

    def revoke_token(self, token_id: int, force: bool = False) -> None:
        """Revoke a token by id (and those minted from it): it stops working at once (an
        admin any, a user their own). The head refuses (409) to revoke the last working
        admin token unless `force`."""
        self._request("DELETE", f"/v1/tokens/{token_id}", params=_force(force))

    def disable_user(self, name: str, force: bool = False) -> UserInfo:
        """Disable a user: their tokens are refused at once (admin)."""
        path = f"/v1/users/{quote(name, safe='')}/disable"
        return self._call(UserInfo, "POST", path, params=_force(force))

    def enable_user(self, name: str) -> UserInfo:
        """Enable a disabled user again (admin)."""
        return self._call(UserInfo, "POST", f"/v1/users/{quote(name, safe='')}/enable")

    def delete_user(self, name: str, force: bool = False) -> None:
        """Delete a user without live jobs; their tokens are revoked (admin)."""
        self._request("DELETE", f"/v1/users/{quote(name, safe='')}", params=_force(force))

    def delete_team(self, name: str) -> None:
        """Delete a team without live jobs (admin)."""
        self._request("DELETE", f"/v1/teams/{quote(name, safe='')}")

    def remove_node(self, name: str) -> None:
        """Forget a node that is down and holds no job (admin)."""
        self._request("DELETE", f"/v1/nodes/{quote(name, safe='')}")

    def create_join_token(self, spec: JoinTokenCreate | None = None) -> TokenIssued:
        """Issue a token agents use to join the cluster (admin): single use or not, its
        life, the node names and addresses it may register."""
        return self._call(TokenIssued, "POST", "/v1/join-tokens", body=spec or JoinTokenCreate())

    def replace_node(self, name: str) -> NodeInfo:
        """Revoke a node's credential and free its name for a new node (admin)."""
        return self._call(NodeInfo, "POST", f"/v1/nodes/{quote(name, safe='')}/replace")

    def teams(self) -> TeamList:
        """Every team with its quota, cohort and GPUs in use."""
        return self._call(TeamList, "GET", "/v1/teams")

    def set_team(self, team: TeamSpec) -> TeamInfo:
        """Create or update a team (admin)."""
        return self._call(TeamInfo, "PUT", f"/v1/teams/{team.name}", body=team)

    # ------------------------------------------------------------------ usage
    def usage_report(self, params: Params, csv: bool = False) -> UsageReport | str:
        """`GET /v1/reports/usage` (`params`: by, per, since, until); the CSV text if
        `csv`."""
        if csv:
            query = {**params, "format": "csv"}
            return self._request("GET", "/v1/reports/usage", params=query).text
        return self._call(UsageReport, "GET", "/v1/reports/usage", params=params)

    def idle_gpus(self, job: int | None = None) -> IdleGpuList:
        """GPUs flagged idle (of one job, or every one the token may see)."""
        path = "/v1/idle-gpus" if job is None else f"/v1/jobs/{job}/idle-gpus"
        return self._call(IdleGpuList, "GET", path)

    def idle_policies(self) -> IdlePolicyList:
        return self._call(IdlePolicyList, "GET", "/v1/idle-policies")

    def set_idle_policy(self, team: str, policy: IdlePolicySpec | None) -> IdlePolicyInfo:
        """Set a team's idle-GPU policy (None: back to the default) (admin)."""
        path = f"/v1/teams/{quote(team, safe='')}/idle-policy"
        if policy is None:
            return self._call(IdlePolicyInfo, "DELETE", path)
        return self._call(IdlePolicyInfo, "PUT", path, body=policy)


def _force(force: bool) -> dict[str, str] | None:
    return {"force": "true"} if force else None


def _frame(line: str) -> ExecFrame:
    try:
        return ExecFrame.model_validate_json(line, extra="ignore")
    except ValidationError:
        raise ApiError(None, f"unexpected line in an exec's answer: {line[:100]!r}") from None


def _head_urls(url: str | Sequence[str]) -> tuple[str, ...]:
    """Head URLs from one string (commas between several) or a list; ApiError if bad."""
    items = url.split(",") if isinstance(url, str) else list(url)
    urls = tuple(item.strip().rstrip("/") for item in items)
    if not urls or not all(urls):
        raise ApiError(None, f"invalid head URL {url!r}: expected URL or URL1,URL2,…")
    for one in urls:
        authority = one.partition("://")[2].partition("/")[0]
        if authority.startswith("[") and "]" not in authority:
            raise ApiError(
                None,
                f"invalid head URL {one!r}: an IPv6 address needs its closing ']' "
                "(e.g. https://[::1]:8265)",
            )
        try:
            parsed = httpx.URL(one)
        except httpx.InvalidURL as exc:
            raise ApiError(None, f"invalid head URL {one!r}: {exc}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ApiError(None, f"invalid head URL {one!r}: expected http(s)://HOST:PORT")
    return urls


def _ref(job: int | str) -> str:
    """A job as a path segment: `123` or `123_4` (anything else is refused by the head)."""
    return quote(str(job), safe="")


def _job_filters(
    active: bool | None,
    ended: bool | None,
    user: str | None,
    team: str | None,
    states: Iterable[str] | None,
    since: float | None,
    limit: int | None,
) -> dict[str, str | int | float | bool]:
    """The query of `GET /v1/jobs` for these filters."""
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
    return params
