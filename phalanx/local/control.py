"""Talking to a running `phalanx up` from another terminal (`phalanx local …`): it lists its
processes in STATE_DIR/up.json, and takes requests (kill a node, start one, add one) as
files in STATE_DIR/control/, answering each with a reply file. Files, not a socket: only
the state dir's owner can write there, and nothing listens on the network."""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATUS_FILE = "up.json"
CONTROL_DIR = "control"
ACTIONS = ("kill-node", "start-node", "add-node", "kill-head")
REPLY_TIMEOUT_S = 30.0


class ControlError(Exception):
    """No `phalanx up` runs on the state dir, or it did not answer; the message says which."""


@dataclass(frozen=True)
class Request:
    """What a `phalanx local` command asks of `up`."""

    path: Path  # the request file (its reply goes beside it)
    action: str
    node: str | None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace `path` atomically (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def write_status(state_dir: Path, status: dict[str, Any]) -> None:
    """What `up` runs (its pid, the head's URL, each process), for `phalanx local ps`."""
    _write_json(state_dir / STATUS_FILE, {"up_pid": os.getpid(), **status})


def clear_status(state_dir: Path) -> None:
    (state_dir / STATUS_FILE).unlink(missing_ok=True)


def read_status(state_dir: Path) -> dict[str, Any]:
    """The running `up`'s status; ControlError if no `up` runs on `state_dir`."""
    path = state_dir / STATUS_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ControlError(_not_running(state_dir)) from None
    except (OSError, ValueError) as exc:
        raise ControlError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict) or not _alive(data.get("up_pid")):
        raise ControlError(_not_running(state_dir))
    return data


def _not_running(state_dir: Path) -> str:
    return (
        f"no `phalanx up` is running on the state dir {state_dir} (start one, or pass the "
        "--state-dir it uses)"
    )


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ask(
    state_dir: Path, action: str, node: str | None = None, timeout_s: float = REPLY_TIMEOUT_S
) -> str:
    """Ask the `up` running on `state_dir` to do `action`; its answer, or ControlError with
    its refusal or because it did not answer in time."""
    read_status(state_dir)
    folder = state_dir / CONTROL_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    name = uuid.uuid4().hex
    reply = folder / f"{name}.reply"
    _write_json(folder / f"{name}.request", {"action": action, "node": node})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            data = json.loads(reply.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            time.sleep(0.1)
            continue
        reply.unlink(missing_ok=True)
        if not data.get("ok"):
            raise ControlError(str(data.get("message")))
        return str(data.get("message"))
    (folder / f"{name}.request").unlink(missing_ok=True)
    raise ControlError(f"`phalanx up` on {state_dir} did not answer within {timeout_s:.0f}s")


def pending(state_dir: Path) -> list[Request]:
    """Requests waiting for `up`, oldest first (a malformed one is answered at once)."""
    folder = state_dir / CONTROL_DIR
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("*.request"), key=lambda p: p.stat().st_mtime):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            action, node = data["action"], data.get("node")
            if action not in ACTIONS or not (node is None or isinstance(node, str)):
                raise ValueError(action)
        except (OSError, ValueError, KeyError, TypeError):
            answer(Request(path, "?", None), False, "malformed request")
            continue
        out.append(Request(path, action, node))
    return out


def answer(request: Request, ok: bool, message: str) -> None:
    """Reply to `request` (and remove it)."""
    _write_json(request.path.with_suffix(".reply"), {"ok": ok, "message": message})
    request.path.unlink(missing_ok=True)
