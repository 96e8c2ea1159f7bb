"""FastSubmit (POST /v1/jobs in front of FastAPI) on a failure that is not the user's."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest

from phalanx.head import jobs
from phalanx.head.app import FastSubmit


class _BrokenHead:
    """Fails inside authentication the way a bug would."""

    def authenticate(self, token: str | None) -> Any:
        raise RuntimeError("a bug in the head")

    def require_user(self, who: Any) -> Any:
        return who


async def _behind(scope: Any, receive: Any, send: Any) -> None:  # never reached for a submit
    raise AssertionError(f"{scope['method']} {scope['path']} went past FastSubmit")


def test_an_unexpected_error_answers_500_as_json_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = FastSubmit(_behind, _BrokenHead(), jobs.SubmitKeys())  # type: ignore[arg-type]

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://head") as client:
            return await client.post("/v1/jobs", json={}, headers={"Authorization": "Bearer x"})

    with caplog.at_level(logging.ERROR, logger="phalanx.head"):
        answer = asyncio.run(post())
    assert answer.status_code == 500
    assert answer.json() == {"detail": "internal server error (logged by the head)"}
    assert "POST /v1/jobs failed" in caplog.text and "a bug in the head" in caplog.text
