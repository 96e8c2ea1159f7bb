"""Wire models of the head's Prometheus endpoints (head/metricsapi.py)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from phalanx.api.models import MAX_TOKEN_TTL_S, NoNul, Wire


class MetricsTokenCreate(Wire):
    """A scrape-only token: it reads `/metrics` and `/v1/metrics/gpus`, nothing else."""

    description: Annotated[str, StringConstraints(max_length=200), NoNul] = ""
    # Seconds until it expires (None: the head's default for API tokens); never past the
    # expiry of the admin token that mints it.
    expires_s: Annotated[float, Field(gt=0, le=MAX_TOKEN_TTL_S)] | None = None
