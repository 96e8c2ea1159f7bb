"""What a completion request must be before it goes to a replica: a bounded body, a JSON
object no deeper than the limit, the served model, `stream` a bool, a prompt or messages."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Receive, Scope

from phalanx.serve.router.answers import ApiError

DEFAULT_MAX_BODY = 4 * 1024 * 1024
DEFAULT_MAX_DEPTH = 32


def depth_ok(value: Any, limit: int) -> bool:
    """Whether `value` nests no deeper than `limit` lists/objects."""
    level: list[Any] = [value]
    for _ in range(limit + 1):
        nxt: list[Any] = []
        for v in level:
            if isinstance(v, dict):
                nxt.extend(v.values())
            elif isinstance(v, list):
                nxt.extend(v)
        if not nxt:
            return True
        level = nxt
    return False


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole body: 413 past `limit` bytes (declared or sent), 400 if the client left."""
    too_large = ApiError(413, f"the request body is larger than {limit} bytes", code="too_large")
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                if int(value) > limit:
                    raise too_large
            except ValueError:
                raise ApiError(400, "bad Content-Length") from None
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ApiError(400, "the client went away before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large
        parts.append(chunk)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def parse(raw: bytes, path: str, model_name: str, max_depth: int) -> tuple[dict[str, Any], bool]:
    """The body as a JSON object and its `stream` flag (400/404 as ApiError)."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        raise ApiError(400, "the body is not valid JSON", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    if not depth_ok(obj, max_depth):
        raise ApiError(400, f"the body nests deeper than {max_depth} levels")
    model = obj.get("model")
    if not isinstance(model, str):
        raise ApiError(400, "`model` must be a string", param="model")
    if model != model_name:
        raise ApiError(
            404,
            f"The model `{model[:200]}` does not exist.",
            code="model_not_found",
            param="model",
        )
    stream = obj.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "`stream` must be true or false", param="stream")
    if path == "/v1/chat/completions":
        if not isinstance(obj.get("messages"), list):
            raise ApiError(400, "`messages` must be a list", param="messages")
    elif not isinstance(obj.get("prompt"), str | list):
        raise ApiError(400, "`prompt` must be a string or a list", param="prompt")
    return obj, stream
