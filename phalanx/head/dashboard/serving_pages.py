"""The dashboard's Serving page: the deployments the viewer may see, each with its pools
(ready/desired), replicas (job, node, state, ready) and its routers' latest summaries
(requests/s, TTFT/TPOT, errors, queue, KV usage, cache hit rate, SLO attainment)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, StreamingResponse

from phalanx.head.dashboard.pages import base, stream
from phalanx.head.dashboard.render import page, render
from phalanx.head.dashboard.session import Seen, Viewer, head_of
from phalanx.head.service import Head

MAX_SHOWN = 200  # deployments on the page (name order); the REST API lists them all

router = APIRouter(include_in_schema=False)  # a browser's pages, not the REST API


def _serving(head: Head, seen: Viewer) -> str:
    deployments = head.serving.visible(seen.who).deployments
    return render(
        "_serving.html",
        deployments=deployments[:MAX_SHOWN],
        count=len(deployments),
        now=head.now(),
    )


@router.get("/ui/serving", response_class=HTMLResponse)
def serving(request: Request, seen: Seen) -> HTMLResponse:
    """The viewer's serving deployments (own; their teams' as team admin; all: admins)."""
    head = head_of(request)
    return page(
        "serving.html",
        request=request,
        **base(request, seen, "serving"),
        body=_serving(head, seen),
        live="/ui/live/serving",
    )


@router.get("/ui/live/serving")
def serving_live(request: Request, seen: Seen) -> StreamingResponse:
    head = head_of(request)
    return stream(request, "fragment", lambda: _serving(head, seen))
