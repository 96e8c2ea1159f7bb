"""Jinja2 templates (package data, autoescaped), their filters, and the HTML answers'
security headers (a strict Content-Security-Policy: scripts only from the head itself)."""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import math
from importlib import resources
from typing import Any
from urllib.parse import urlencode

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse

from phalanx.head.dashboard import grid

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'; "
    "base-uri 'none'; object-src 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _when(t: float | None) -> str:
    if t is None:
        return "–"
    if math.isinf(t):
        return "when a job without a time limit ends"
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _duration(s: float | None) -> str:
    if s is None:
        return "–"
    s = int(max(0.0, s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _pct(v: float | None, digits: int = 0) -> str:
    return "–" if v is None else f"{v:.{digits}f}%"


def _num(v: float | None, digits: int = 3) -> str:
    return "–" if v is None else f"{v:.{digits}g}"


def _qs(query: dict[str, Any]) -> str:
    """A query string of the filters that are set (empty ones left out)."""
    return urlencode({k: v for k, v in query.items() if v not in ("", None)})


def static_files() -> dict[str, tuple[bytes, str]]:
    """name → (bytes, media type) of everything under static/ (vendored libraries, our CSS
    and script), read once: the dashboard serves only these names."""
    kinds = {".js": "text/javascript", ".css": "text/css", ".LICENSE": "text/plain"}
    out: dict[str, tuple[bytes, str]] = {}
    root = resources.files("phalanx.head.dashboard") / "static"
    for folder in (root, root / "vendor"):
        for item in folder.iterdir():
            if not item.is_file():
                continue
            suffix = next((k for k in kinds if item.name.endswith(k)), None)
            if suffix is None:
                continue
            prefix = "vendor/" if folder is not root else ""
            out[prefix + item.name] = (item.read_bytes(), kinds[suffix])
    return out


STATIC = static_files()
_VERSIONS = {name: hashlib.sha256(body).hexdigest()[:12] for name, (body, _) in STATIC.items()}


def static_url(name: str) -> str:
    """A static file's URL with its content's hash: a browser may cache it for long, and
    a head with a changed file is asked for the new one."""
    return f"/ui/static/{name}?v={_VERSIONS[name]}"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("phalanx.head.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = _when
    env.filters["duration"] = _duration
    env.filters["pct"] = _pct
    env.filters["num"] = _num
    env.filters["qs"] = _qs
    env.filters["gridcells"] = grid.cells_html
    env.globals["static"] = static_url
    return env


ENV = _environment()


def render(template: str, **context: Any) -> str:
    return ENV.get_template(template).render(**context)


GZIP_ABOVE = 64 * 1024  # bytes: smaller pages go as they are


def page(
    template: str, status: int = 200, request: Request | None = None, **context: Any
) -> HTMLResponse:
    """A whole page; gzipped when it is large and `request`'s browser accepts gzip (the
    GPU grid of a big cluster: ~200 bytes a GPU before, ~15 after)."""
    body = render(template, **context).encode()
    headers = dict(HEADERS)
    if (
        request is not None
        and len(body) > GZIP_ABOVE
        and "gzip" in request.headers.get("accept-encoding", "")
    ):
        body = gzip.compress(body, compresslevel=5)
        headers["Content-Encoding"] = "gzip"
        headers["Vary"] = "Accept-Encoding"
    return HTMLResponse(body, status_code=status, headers=headers)
