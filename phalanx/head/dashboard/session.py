"""Who is looking at the dashboard: the session cookie, CSRF tokens and form bodies.

The session cookie holds the user's API token itself (HttpOnly, SameSite=Strict, Secure
when the head serves TLS), not a server-side session id. Every request authenticates it
exactly as the REST API authenticates a bearer token (Head.authenticate), so a revoked or
expired token, or a disabled user, is refused at once; there is no session table to keep,
to lose in a head restart, or to share with a standby that takes over. JavaScript cannot
read the cookie (HttpOnly) and other sites cannot send it (SameSite=Strict).

State-changing requests (cancel, drain, resume, logout) are POSTs that must also carry a
CSRF token, in the form field `csrf` or the `X-CSRF-Token` header: an HMAC of the session's
token, so it needs no storage, cannot be computed without the token, and differs per
session. A POST whose Origin header names another site is refused as well.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import parse_qs, quote

from fastapi import Depends, HTTPException, Request

from phalanx.head.auth import AuthError, Principal
from phalanx.head.service import Head

COOKIE = "phalanx_session"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
MAX_TOKEN_CHARS = 256  # real tokens are ~50 characters; longer ones are not ours
MAX_FORM_BYTES = 16 * 1024  # the dashboard's forms carry a token and a reason at most
LOGIN_PATH = "/ui/login"


@dataclass(frozen=True, slots=True)
class Viewer:
    """A signed-in person: their principal, and the CSRF token of this session."""

    who: Principal
    csrf: str

    @property
    def name(self) -> str:
        return self.who.user or "?"

    @property
    def admin(self) -> bool:
        return self.who.admin


def csrf_token(token: str) -> str:
    """The CSRF token of the session whose cookie holds `token`."""
    return hmac.new(token.encode(), b"phalanx-dashboard-csrf-v1", hashlib.sha256).hexdigest()


def head_of(request: Request) -> Head:
    head: Head = request.app.state.head
    return head


def sign_in(head: Head, token: str) -> Principal:
    """The principal of a token typed into the login page; AuthError if it is not a working
    user's API token (node and join credentials do not open the dashboard)."""
    token = token.strip()
    if not token or len(token) > MAX_TOKEN_CHARS or not token.isprintable():
        raise AuthError("that is not a Phalanx API token")
    who = head.authenticate(token)
    if who.kind != "api":
        raise AuthError("that is a node or join credential: sign in with a user's API token")
    return who


def still_signed_in(request: Request) -> bool:
    """Whether the request's session still works (a long-lived stream asks before each
    update: a token revoked or expired meanwhile, or a disabled user, ends it)."""
    return _session(request) is not None


def _session(request: Request) -> Viewer | None:
    token = request.cookies.get(COOKIE)
    if not token:
        return None
    try:
        who = sign_in(head_of(request), token)
    except AuthError:
        return None
    return Viewer(who=who, csrf=csrf_token(token.strip()))


def _login_needed(request: Request) -> HTTPException:
    if request.method == "GET" and "hx-request" not in request.headers:
        target = request.url.path
        if request.url.query:
            target += "?" + request.url.query
        # Only our own paths are ever put back (never an absolute URL: no open redirect).
        location = (
            f"{LOGIN_PATH}?next={_quote(target)}" if target.startswith("/ui/") else LOGIN_PATH
        )
        return HTTPException(303, "sign in first", headers={"Location": location})
    return HTTPException(401, "sign in first: the dashboard session is missing or expired")


def _quote(path: str) -> str:
    return quote(path, safe="/")


async def viewer(request: Request) -> Viewer:
    """The signed-in viewer; a browser without a working session is sent to the login page
    (GET) or refused (401: everything else)."""
    found = _session(request)
    if found is None:
        raise _login_needed(request)
    return found


async def form_of(request: Request) -> dict[str, str]:
    """A small urlencoded form body, one value per field (the first); 413 past
    MAX_FORM_BYTES, 400 if it is not a form."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > MAX_FORM_BYTES):
        raise HTTPException(413, f"form larger than {MAX_FORM_BYTES} bytes")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise HTTPException(413, f"form larger than {MAX_FORM_BYTES} bytes")
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if body and kind != "application/x-www-form-urlencoded":
        raise HTTPException(400, "send the form as application/x-www-form-urlencoded")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=20)
    except (UnicodeDecodeError, ValueError):
        raise HTTPException(400, "the form is not valid UTF-8 urlencoded data") from None
    return {k: v[0] for k, v in fields.items()}


def check_origin(request: Request) -> None:
    """403 for a POST sent from another site (its Origin names another host)."""
    origin = request.headers.get("origin")
    if origin is None:  # not a browser, or a same-origin GET-style navigation
        return
    host = request.headers.get("host", "")
    if origin not in (f"http://{host}", f"https://{host}"):
        raise HTTPException(403, "cross-site request refused")


async def actor(request: Request, seen: Annotated[Viewer, Depends(viewer)]) -> Viewer:
    """The viewer of a state-changing POST: same-site, with this session's CSRF token."""
    check_origin(request)
    form = await form_of(request)
    request.state.form = form
    sent = request.headers.get(CSRF_HEADER) or form.get(CSRF_FIELD, "")
    if not sent or not hmac.compare_digest(sent.encode(), seen.csrf.encode()):
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")
    return seen


Seen = Annotated[Viewer, Depends(viewer)]
Acting = Annotated[Viewer, Depends(actor)]
