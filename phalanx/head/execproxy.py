"""`phalanx exec` through the head: who may exec into which rank, on which node, and the
agent's answer relayed to the caller as it streams (docs/control-plane.md#exec)."""

from __future__ import annotations

import logging
import posixpath
from collections.abc import AsyncIterator

import httpx
from fastapi.responses import StreamingResponse

from phalanx.api import models as m
from phalanx.core import JobState
from phalanx.head.auth import Principal
from phalanx.head.control import HeadError
from phalanx.head.service import Head

log = logging.getLogger("phalanx.head")

# The agent sends a line at least every 5 s (agent/execrun.py KEEPALIVE_S); silence for
# this long means the node or the path to it is gone.
READ_TIMEOUT_S = 30.0
# What the head relays at most: the agent's output limit, as JSON (escapes may grow text
# up to 6×), with room for the frames around it. A guard against a broken agent.
RELAY_LIMIT = 8 * m.MAX_EXEC_OUTPUT_BYTES


async def open_exec(
    head: Head, client: httpx.AsyncClient, who: Principal, job_id: int, req: m.ExecRequest
) -> StreamingResponse:
    """Start `req` beside its rank through that rank's agent; the agent's NDJSON stream.
    403 for someone else's job (as its logs), 409 unless the job is running, 404 for a rank
    it does not have, 502 when the node cannot be reached; the agent's 409/429 pass."""
    rec = head.private_job_record(who, job_id)
    with head.control.lock:
        live = head.mirror.jobs.get(job_id) is rec
        state, epoch = rec.state, rec.epoch
    if not live or state.terminal:
        raise HeadError(409, f"job {job_id} has ended ({state.value}): nothing runs to exec into")
    if state is JobState.PENDING:
        raise HeadError(409, f"job {job_id} has not started yet (PD): nothing runs to exec into")
    if not state.running:
        raise HeadError(409, f"job {job_id} is stopping ({state.value}): no new execs")
    node = head.log_source(rec, req.rank)
    if not node.state.heard:
        raise HeadError(502, f"node {node.name}, where rank {req.rank} runs, is down")
    launch = m.ExecLaunch(
        job_id=job_id, epoch=epoch, rank=req.rank, argv=req.argv, timeout_s=req.timeout_s
    )
    request = client.build_request(
        "POST",
        f"{node.agent_url}/v1/exec",
        content=launch.model_dump_json(),
        headers={
            "Authorization": f"Bearer {node.agent_secret}",
            "Content-Type": "application/json",
        },
        timeout=httpx.Timeout(10.0, read=READ_TIMEOUT_S),
    )
    try:
        answer = await client.send(request, stream=True)
    except httpx.HTTPError as e:
        raise HeadError(502, f"node {node.name} is unreachable: {e}") from None
    if answer.status_code != 200:
        await answer.aread()
        await answer.aclose()
        detail = _detail(answer)
        if answer.status_code in (409, 429):
            raise HeadError(answer.status_code, f"node {node.name}: {detail}")
        raise HeadError(502, f"node {node.name} answered {answer.status_code}: {detail}")
    # Who ran what goes in the job's event log (only the program's name: its arguments
    # may hold secrets, and teammates read the events).
    program = posixpath.basename(req.argv[0])[:200] or "?"
    log.info("exec into job %d rank %d by %s: %s", job_id, req.rank, who.user, program)
    message = f"{who.user} ran {program!r} beside rank {req.rank} on {node.name}"
    try:
        await head.control.run_async(lambda tx: tx.event(tx.now, "exec", message, job_id))
    except HeadError as e:  # the head is stopping: the exec still runs, the record is lost
        log.warning("exec into job %d: not recorded: %s", job_id, e.detail)
    return StreamingResponse(_relay(answer, node.name), media_type="application/x-ndjson")


async def _relay(answer: httpx.Response, node: str) -> AsyncIterator[bytes]:
    """The agent's lines as they come; a last `exit` frame saying so if the stream breaks.
    Closing it (the caller went away) closes the agent's stream, which kills the exec."""
    relayed = 0
    try:
        async for chunk in answer.aiter_raw():
            relayed += len(chunk)
            if relayed > RELAY_LIMIT:
                yield _broken(f"node {node} sent more than {RELAY_LIMIT} bytes; cut off")
                return
            yield chunk
    except httpx.HTTPError as e:
        yield _broken(f"lost the stream from node {node}: {e or type(e).__name__}")
    finally:
        await answer.aclose()


def _broken(why: str) -> bytes:
    # A newline first: the cut may have fallen inside a line.
    return b"\n" + m.ExecFrame(kind="exit", message=why).model_dump_json().encode() + b"\n"


def _detail(r: httpx.Response) -> str:
    """An agent's error `detail` (its text if it is not the usual JSON), one line."""
    try:
        detail = r.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return detail if isinstance(detail, str) else r.text[:200]
