"""The prefill → decode hand-off of disaggregated deployments (docs/serving-disagg.md).

A disaggregated deployment runs two pools of the same engine and model: prefill replicas
process prompts, decode replicas generate. For each request the router picks one of each
and calls `Handoff.prefill(...)`, which runs the prompt on the prefill replica, moves its
KV cache to the decode replica, and returns the request body to send to the decode
replica, which then generates without processing the prompt again:

- **llama.cpp** (`llama-server`): the KV cache of one *slot* is saved to a file and
  restored into a slot of the decode replica (`POST /slots/{id}?action=save|restore`).
  Both replicas are started with the same `-np` and a `--slot-save-path` on storage they
  share; the router leases slots itself (`id_slot` pins a request to one), so a restored
  slot is never taken by another request before its decode runs. The prefill request is
  the client's own request (same path, same body: the same chat template and tokens) with
  no generation (`max_tokens: 0` / `n_predict: 0`) and `cache_prompt`; the decode request
  is the client's request pinned to the restored slot with `cache_prompt`, so llama-server
  reuses the restored prompt and evaluates only its last token. The prefill slot is free
  again once its KV is restored (it waits, holding the KV in memory, while no decode slot
  is free: back-pressure, and no file waits on disk); the decode slot once the router says
  the decode request has ended (`Prepared.release`). Hand-off files are named by request
  (a uuid), never reused, and live from save to restore: `sweep` (called by the replica
  wrapper every few seconds with `FILE_TTL_S`) removes them, and the router removes each at
  once where it sees the folder (`handoff_dir`).
- **vLLM**: the two-step `kv_transfer_params` protocol of its NixlConnector: the prefill
  request asks for `do_remote_decode` and one token, its answer carries the parameters
  (engine id, block ids, host, port) with which the decode replica pulls the KV blocks
  from the prefill replica over NIXL. vLLM schedules its own sequences: no slot leases.

Failures (an engine answering an error, a replica unreachable or dying mid-way, no free
slot within `slot_wait_s`) raise `HandoffError`, with every lease released; the router
answers 502 (or retries elsewhere). A request the hand-off cannot carry (several prompts,
`n` > 1, an unknown path) raises `HandoffError` with `status` 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from phalanx.api.serving import Endpoint

log = logging.getLogger(__name__)

Post = Callable[[str, str, dict[str, Any]], Awaitable[tuple[int, dict[str, Any]]]]
#      (replica base url, path, JSON body) -> (HTTP status, JSON answer); the router's own
#      upstream client, already carrying the engine key.

# Hand-off files: `phalanx-handoff-<32 hex>.kv`, a bare name (llama-server refuses path
# separators and resolves it under its --slot-save-path); `sweep` removes only these.
FILE_PREFIX: Final = "phalanx-handoff-"
FILE_SUFFIX: Final = ".kv"
# A hand-off file is read back within milliseconds of being written (save, then restore at
# once); one older than this was left behind (a router died between the two, a restore
# failed) — the replica wrapper sweeps with it. A restore slower than this fails (502).
FILE_TTL_S: Final = 60.0

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
NATIVE = "/completion"  # llama-server's own completion endpoint
PATHS: Final = {"llama.cpp": (CHAT, COMPLETIONS, NATIVE), "vllm": (CHAT, COMPLETIONS)}

# vLLM's NixlConnector: what a prefill request asks for (vLLM's own disaggregation proxy
# sends exactly these) — keep the KV for a remote decode, nothing to pull.
VLLM_PREFILL_PARAMS: Final[dict[str, Any]] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


class HandoffError(Exception):
    """The hand-off failed; `status` is what the router should answer (502: a replica
    failed or answered an error; 503: no free slot in time; 400: a request the hand-off
    cannot carry)."""

    def __init__(self, message: str, *, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class HandoffTimings:
    """Where a hand-off's time went (its share of the request's TTFT)."""

    wait_ms: float  # waiting for a free prefill and decode slot
    prefill_ms: float  # the prefill request on the prefill replica
    transfer_ms: float  # saving and restoring the KV (llama.cpp; vLLM pulls at decode)
    prompt_tokens: int  # as the prefill replica counted them (0 when it did not say)


async def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Prepared:
    body: dict[str, Any]  # what to send to the decode replica at `path`
    release: Callable[[], Awaitable[None]]  # call once the decode request has ended
    timings: HandoffTimings = field(default_factory=lambda: HandoffTimings(0.0, 0.0, 0.0, 0))


class _Slots:
    """The slot ids 0..count-1 of one llama-server replica that no request holds."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.free: asyncio.Queue[int] = asyncio.Queue()
        for slot in range(count):
            self.free.put_nowait(slot)

    @property
    def busy(self) -> int:
        return self.count - self.free.qsize()


class _Lease:
    def __init__(self, slots: _Slots, slot: int) -> None:
        self._slots = slots
        self.slot = slot
        self._held = True

    def release(self) -> None:
        if self._held:  # once, whoever calls it how often
            self._held = False
            self._slots.free.put_nowait(self.slot)

    async def release_async(self) -> None:
        self.release()


class Handoff:
    """One per router (per deployment): the slot leases of its replicas and the hand-off
    protocol of its engine.

    `slot_wait_s` bounds the wait for a free slot on a replica; `step_timeout_s` bounds
    each request to an engine; `handoff_dir`, where the router shares the replicas' hand-
    off folder, lets it delete each file as soon as it is restored (else `sweep` does)."""

    def __init__(
        self,
        engine: str,
        *,
        slot_wait_s: float = 60.0,
        step_timeout_s: float = 300.0,
        handoff_dir: Path | None = None,
    ) -> None:
        if engine not in PATHS:
            raise ValueError(f"no prefill/decode hand-off for engine {engine!r}")
        self.engine = engine
        self.slot_wait_s = slot_wait_s
        self.step_timeout_s = step_timeout_s
        self.handoff_dir = handoff_dir
        self._replicas: dict[str, _Slots] = {}

    # --- slots ---------------------------------------------------------------------------

    def set_replicas(self, endpoints: Sequence[Endpoint]) -> None:
        """The deployment's ready replicas (the router calls it on every refresh). A
        replica that left keeps its leases until they are released; one that came back
        with the same slot count keeps its state (its slots may still be held)."""
        current = {e.url: e.slots for e in endpoints}
        for url, slots in current.items():
            known = self._replicas.get(url)
            if known is None or known.count != slots:
                self._replicas[url] = _Slots(slots)
        for url in [u for u, s in self._replicas.items() if u not in current and not s.busy]:
            del self._replicas[url]

    def busy_slots(self, url: str) -> int:
        """How many slots of the replica at `url` are leased now (0 for an unknown one)."""
        slots = self._replicas.get(url)
        return slots.busy if slots else 0

    def _slots(self, endpoint: Endpoint) -> _Slots:
        slots = self._replicas.get(endpoint.url)
        if slots is None or slots.count != endpoint.slots:
            slots = self._replicas[endpoint.url] = _Slots(endpoint.slots)
        return slots

    async def _lease(self, endpoint: Endpoint, role: str) -> _Lease:
        slots = self._slots(endpoint)
        try:
            async with asyncio.timeout(self.slot_wait_s):
                slot = await slots.free.get()
        except TimeoutError:
            raise HandoffError(
                f"no free slot on {role} replica {endpoint.url} within {self.slot_wait_s:g} s "
                f"(all {slots.count} busy)",
                status=503,
            ) from None
        return _Lease(slots, slot)

    # --- the hand-off --------------------------------------------------------------------

    async def prefill(
        self, post: Post, prefill: Endpoint, decode: Endpoint, path: str, body: dict[str, Any]
    ) -> Prepared:
        """Prefill `body` (an OpenAI request for `path`) on `prefill` and move its KV to
        `decode`; returns the body to send to `decode` at `path`, and the release to call
        once that request has ended. Raises HandoffError."""
        if path not in PATHS[self.engine]:
            raise HandoffError(
                f"{self.engine} hand-off serves {', '.join(PATHS[self.engine])}, not {path}",
                status=400,
            )
        _check_single(path, body)
        if self.engine == "llama.cpp" and prefill.slots != decode.slots:
            # llama-server refuses to restore a slot saved by a server with another -np.
            raise HandoffError(
                f"prefill replica {prefill.url} has {prefill.slots} slots, decode replica "
                f"{decode.url} {decode.slots}: llama.cpp restores a slot only into a server "
                "with as many"
            )
        if self.engine == "vllm":
            return await self._vllm(post, prefill, path, body)
        return await self._llama(post, prefill, decode, path, body)

    async def _call(
        self, post: Post, url: str, path: str, body: dict[str, Any], what: str
    ) -> dict[str, Any]:
        # A request that fails without an answer is sent once more: llama-server closes a
        # kept-alive connection after a streamed answer without saying so, and a pooled
        # client's next request on it fails before reaching the engine. Every step may be
        # repeated: the slot is leased, the file name is the request's, a restore overwrites.
        for attempt in (1, 2):
            try:
                async with asyncio.timeout(self.step_timeout_s):
                    status, answer = await post(url, path, body)
                break
            except TimeoutError:
                raise HandoffError(
                    f"{what} on {url}: no answer within {self.step_timeout_s:g} s"
                ) from None
            except HandoffError:
                raise
            except Exception as exc:  # the replica is unreachable, died, or answered garbage
                if attempt == 1:
                    log.debug("%s on %s failed (%s): once more", what, url, _describe(exc))
                    continue
                raise HandoffError(f"{what} on {url} failed: {_describe(exc)}") from exc
        if status != 200:
            raise HandoffError(f"{what} on {url} answered {status}: {_engine_message(answer)}")
        if not isinstance(answer, dict):
            raise HandoffError(f"{what} on {url} answered no JSON object")
        return answer

    async def _llama(
        self, post: Post, prefill: Endpoint, decode: Endpoint, path: str, body: dict[str, Any]
    ) -> Prepared:
        # The prefill slot is held until its KV is restored on the decode side: while no
        # decode slot is free the KV waits in the prefill replica's memory (back-pressure
        # on the prefill pool), and a hand-off file lives only from save to restore.
        name = f"{FILE_PREFIX}{uuid.uuid4().hex}{FILE_SUFFIX}"
        started = time.monotonic()
        lease = await self._lease(prefill, "prefill")
        decode_lease: _Lease | None = None
        try:
            got_prefill = time.monotonic()
            answer = await self._call(
                post, prefill.url, path, _no_generation(path, body, lease.slot), "prefill"
            )
            prefilled = time.monotonic()
            decode_lease = await self._lease(decode, "decode")
            got_decode = time.monotonic()
            saved = await self._call(
                post,
                prefill.url,
                f"/slots/{lease.slot}?action=save",
                {"filename": name},
                "saving the prefilled slot",
            )
            n_saved = saved.get("n_saved")
            if not isinstance(n_saved, int) or n_saved <= 0:
                raise HandoffError(f"saving the prefilled slot on {prefill.url} saved no tokens")
            restored = await self._call(
                post,
                decode.url,
                f"/slots/{decode_lease.slot}?action=restore",
                {"filename": name},
                "restoring the prefilled slot",
            )
            if restored.get("n_restored") != n_saved:
                raise HandoffError(
                    f"restoring on {decode.url} restored {restored.get('n_restored')!r} "
                    f"of {n_saved} tokens"
                )
        except BaseException:
            if decode_lease is not None:
                decode_lease.release()
            raise
        finally:
            lease.release()
            self._forget(name)
        done = time.monotonic()
        timings = HandoffTimings(
            wait_ms=1000 * ((got_prefill - started) + (got_decode - prefilled)),
            prefill_ms=1000 * (prefilled - got_prefill),
            transfer_ms=1000 * (done - got_decode),
            prompt_tokens=_prompt_tokens(answer),
        )
        pinned = {**body, "id_slot": decode_lease.slot, "cache_prompt": True}
        return Prepared(pinned, decode_lease.release_async, timings)

    def _forget(self, name: str) -> None:
        if self.handoff_dir is not None:
            with contextlib.suppress(OSError):
                (self.handoff_dir / name).unlink(missing_ok=True)

    async def _vllm(
        self, post: Post, prefill: Endpoint, path: str, body: dict[str, Any]
    ) -> Prepared:
        started = time.monotonic()
        ask = {
            **body,
            "kv_transfer_params": dict(VLLM_PREFILL_PARAMS),
            "stream": False,
            "max_tokens": 1,
        }
        ask.pop("stream_options", None)
        if "max_completion_tokens" in ask:
            ask["max_completion_tokens"] = 1
        answer = await self._call(post, prefill.url, path, ask, "prefill")
        params = answer.get("kv_transfer_params")
        if not isinstance(params, dict) or not params:
            raise HandoffError(
                f"prefill on {prefill.url} returned no kv_transfer_params (is the replica "
                "started with --kv-transfer-config and the NixlConnector?)"
            )
        timings = HandoffTimings(
            wait_ms=0.0,
            prefill_ms=1000 * (time.monotonic() - started),
            transfer_ms=0.0,
            prompt_tokens=_prompt_tokens(answer),
        )
        return Prepared({**body, "kv_transfer_params": params}, _nothing, timings)


def _check_single(path: str, body: dict[str, Any]) -> None:
    """One prompt, one sequence: what one slot (one KV transfer) can carry."""
    n = body.get("n", 1)
    if n not in (1, None):
        raise HandoffError("a disaggregated deployment serves n = 1 only", status=400)
    if path == CHAT:
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            raise HandoffError("'messages' must be a non-empty list", status=400)
        return
    prompt = body.get("prompt")
    if isinstance(prompt, str) and prompt:
        return
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):
            return  # one prompt as token ids
        if len(prompt) == 1 and isinstance(prompt[0], str | list):
            return
        raise HandoffError("a disaggregated deployment serves one prompt per request", status=400)
    raise HandoffError("'prompt' must be a non-empty string or list of tokens", status=400)


def _no_generation(path: str, body: dict[str, Any], slot: int) -> dict[str, Any]:
    """The client's own request on the prefill slot, processing the prompt only: the same
    path and fields give the same chat template and tokens as the decode request."""
    ask = {**body, "id_slot": slot, "cache_prompt": True, "stream": False}
    ask.pop("stream_options", None)
    if path == NATIVE:
        ask["n_predict"] = 0
    else:
        ask["max_tokens"] = 0
        if "max_completion_tokens" in ask:
            ask["max_completion_tokens"] = 0
    return ask


def _prompt_tokens(answer: dict[str, Any]) -> int:
    usage = answer.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
        return int(usage["prompt_tokens"])
    evaluated = answer.get("tokens_evaluated")  # llama-server's /completion
    return evaluated if isinstance(evaluated, int) else 0


def _engine_message(answer: Any) -> str:
    if isinstance(answer, dict):
        error = answer.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:300]
        if isinstance(error, str):
            return error[:300]
    return repr(answer)[:300]


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


# --- stale hand-off files ----------------------------------------------------------------


def _handoff_files(folder: Path) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.startswith(FILE_PREFIX) and entry.name.endswith(FILE_SUFFIX):
                    yield entry
    except FileNotFoundError:
        return


def sweep(folder: Path | str, older_than_s: float, *, now: float | None = None) -> int:
    """Remove the hand-off files in `folder` last written more than `older_than_s`
    seconds ago (a request whose decode never restored them: a router that died, a
    decode replica that failed); returns how many. Touches nothing else in the folder."""
    cutoff = (time.time() if now is None else now) - older_than_s
    removed = 0
    for entry in _handoff_files(Path(folder)):
        try:
            if entry.is_file(follow_symlinks=False) and entry.stat().st_mtime < cutoff:
                os.unlink(entry.path)
                removed += 1
        except FileNotFoundError:
            continue  # another sweeper (a replica sharing the folder) took it
        except OSError as exc:
            log.warning("hand-off sweep: cannot remove %s: %s", entry.path, exc)
    return removed
