"""Signing in and out, the admins' node actions (drain, resume), and the static files.

Every POST but the login itself needs the session and its CSRF token (session.actor);
the login checks the Origin like every POST. Node actions are admins' only: a plain
user's page shows none, and a POST of one, forged or not, is refused (403)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from phalanx.head.auth import AuthError
from phalanx.head.control import HeadError
from phalanx.head.dashboard.pages import base
from phalanx.head.dashboard.render import HEADERS, STATIC, page
from phalanx.head.dashboard.session import (
    COOKIE,
    LOGIN_PATH,
    Acting,
    check_origin,
    form_of,
    head_of,
    sign_in,
)

NodeName = Annotated[str, Path(max_length=128, pattern=r"^[A-Za-z0-9_.@+-]+$")]
MAX_REASON = 500

router = APIRouter(include_in_schema=False)  # a browser's pages, not the REST API


def _next(value: str | None) -> str:
    """Where to go after signing in: one of our own pages, never another site."""
    if value and value.startswith("/ui/") and not value.startswith("//") and "\\" not in value:
        return value
    return "/ui/"


@router.get("/")
@router.get("/ui")
def root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@router.get("/ui/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/ui/") -> HTMLResponse:
    return page("login.html", error=None, next=_next(next[:2048]))


@router.post("/ui/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    check_origin(request)
    form = await form_of(request)
    target = _next(form.get("next", "")[:2048])
    head = head_of(request)
    try:
        who = sign_in(head, form.get("token", ""))
    except AuthError as e:
        return page("login.html", 401, error=str(e), next=target)
    answer = RedirectResponse(target, status_code=303, headers=HEADERS)
    max_age = None if who.expires is None else max(1, int(who.expires - head.now()))
    answer.set_cookie(
        COOKIE,
        form.get("token", "").strip(),
        max_age=max_age,
        path="/ui",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return answer


@router.post("/ui/logout")
def logout(seen: Acting) -> RedirectResponse:
    answer = RedirectResponse(LOGIN_PATH, status_code=303, headers=HEADERS)
    answer.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
    return answer


def _admin_only(seen: Acting) -> None:
    if not seen.admin:
        raise HTTPException(403, "only admins drain or resume nodes")


@router.post("/ui/nodes/{name}/drain")
def drain(request: Request, name: NodeName, seen: Acting) -> Response:
    _admin_only(seen)
    form: dict[str, str] = request.state.form
    reason = form.get("reason", "").strip() or f"drained by {seen.name} from the dashboard"
    if len(reason) > MAX_REASON or not reason.isprintable():
        raise HTTPException(422, f"the reason must be 1 to {MAX_REASON} printable characters")
    return _node_action(request, seen, name, reason)


@router.post("/ui/nodes/{name}/resume")
def resume(request: Request, name: NodeName, seen: Acting) -> Response:
    _admin_only(seen)
    return _node_action(request, seen, name, None)


def _node_action(request: Request, seen: Acting, name: str, reason: str | None) -> Response:
    head = head_of(request)
    try:
        head.set_drain(name, reason)
    except HeadError as e:
        context = base(request, seen, "nodes")
        return page("error.html", e.status, **context, code=e.status, message=e.detail)
    back = request.headers.get("referer", "")
    host = request.headers.get("host", "")
    for scheme in ("http://", "https://"):
        prefix = f"{scheme}{host}"
        if back.startswith(prefix + "/ui/nodes"):
            return RedirectResponse(back[len(prefix) :], status_code=303, headers=HEADERS)
    return RedirectResponse("/ui/nodes", status_code=303, headers=HEADERS)


@router.get("/ui/static/{name:path}")
def static(name: str) -> Response:
    """Our CSS and script and the vendored libraries; pages link them with their content's
    hash (render.static_url), so a browser may keep them a day."""
    found = STATIC.get(name)
    if found is None:
        raise HTTPException(404, "no such file")
    body, kind = found
    headers = {"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"}
    return Response(body, media_type=kind, headers=headers)
