"""The web dashboard the head serves at /ui/ (docs: README's "Web dashboard" section).

Server-rendered HTML (Jinja2) with two small vendored libraries (htmx with its SSE
extension, uPlot; static/vendor/VENDORED.md): no build step and no CDN. Same tokens as
the API (session.py), pages paginated and filtered on the server (listings.py,
cluster.py), live updates over SSE (live.py).

Seams left for the telemetry work to fill at merge:
- series.gpu_series(head, rec): the job page's GPU utilisation chart's only data source;
  today one point (each GPU's latest reading), tomorrow the job's stored series in the
  same shape.
- usage_pages (`/ui/accounting`, `/ui/idle`): the usage report and the idle-GPU flags and
  policies of head/usage.py; the GPU grid, the job page and the overview mark flagged GPUs.
- ControlThread.changes: the counter the live streams watch; anything else that changes
  what a page shows without a control transaction bumps it (as progress reports do).
"""

from __future__ import annotations

from fastapi import FastAPI

from phalanx.head.dashboard import actions, jobpage, live, pages, serving_pages, usage_pages
from phalanx.head.service import Head


def install(app: FastAPI, head: Head) -> None:
    """Serve the dashboard from `app` (head/app.py's create_app)."""
    app.state.dashboard_feed = live.ChangeFeed(head.control)
    app.include_router(actions.router)
    app.include_router(pages.router)
    app.include_router(jobpage.router)
    app.include_router(usage_pages.router)
    app.include_router(serving_pages.router)
