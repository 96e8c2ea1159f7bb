"""The llama.cpp prefill → decode hand-off on real llama-server processes: a prefill
replica, a decode replica and an aggregated one (the reference), sharing a hand-off folder
as a disaggregated deployment's replicas do."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from phalanx.api.serving import DeploymentSpec, Endpoint, PoolSpec
from phalanx.local.cluster import free_port
from phalanx.serve.handoff import FILE_PREFIX, FILE_SUFFIX, Handoff, HandoffError, Post, sweep
from tests.serve.llama_servers import MODEL, Server, ask, make_post, start, wait_ready

MAX_TOKENS = 8


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    folder = tmp_path_factory.mktemp("llama")
    handoff = folder / "handoff"
    handoff.mkdir()
    started = {name: start(folder, name, handoff) for name in ("prefill", "decode", "agg")}
    try:
        wait_ready(*started.values())
        yield started
    finally:
        for server in started.values():
            server.stop()


def _request(path: str, text: str, *, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "temperature": 0, "stream": stream}
    if path == "/v1/chat/completions":
        body["messages"] = [
            {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
            {"role": "user", "content": text},
        ]
    else:
        body["prompt"] = text
    if path == "/completion":
        body["n_predict"] = MAX_TOKENS
    else:
        body["max_tokens"] = MAX_TOKENS
    if stream and path != "/completion":
        body["stream_options"] = {"include_usage": True}  # the last chunk has the timings
    return body


async def _disaggregated(
    handoff: Handoff,
    client: httpx.AsyncClient,
    servers: dict[str, Server],
    path: str,
    body: dict[str, Any],
    post: Post | None = None,
) -> tuple[str, dict[str, Any]]:
    prefill, decode = servers["prefill"], servers["decode"]
    prepared = await handoff.prefill(
        post or make_post(client),
        prefill.endpoint("prefill"),
        decode.endpoint("decode"),
        path,
        body,
    )
    try:
        return await ask(client, decode.url, path, prepared.body)
    finally:
        await prepared.release()


CASES = [
    ("/v1/completions", False, "The three most important rivers of Europe are the Danube, the"),
    ("/v1/completions", True, "A recipe for bread needs flour, water, salt and"),
    ("/v1/chat/completions", False, "What is the capital of France?"),
    ("/v1/chat/completions", True, "Name a planet of the solar system."),
    ("/completion", False, "In 1969 the first humans walked on the"),
    ("/completion", True, "The quick brown fox jumps over the lazy"),
]


@pytest.mark.parametrize(("path", "stream", "text"), CASES)
def test_disaggregated_output_is_identical_to_aggregated_and_reuses_the_kv(
    servers: dict[str, Server], path: str, stream: bool, text: str
) -> None:
    async def main() -> None:
        handoff = Handoff("llama.cpp")
        body = _request(path, text, stream=stream)
        async with httpx.AsyncClient(timeout=120) as client:
            alone, _ = await ask(client, servers["agg"].url, path, body)
            split, last = await _disaggregated(handoff, client, servers, path, body)
        assert split == alone
        assert split.strip()
        # The decode replica reused the restored KV: of the whole prompt it evaluated only
        # the last token or two (llama-server re-evaluates the last one for its logits).
        timings = last["timings"]
        prompt_tokens = timings["cache_n"] + timings["prompt_n"]
        assert prompt_tokens >= 8
        assert timings["prompt_n"] <= 2
        assert timings["cache_n"] >= prompt_tokens - 2
        assert handoff.busy_slots(servers["prefill"].url) == 0
        assert handoff.busy_slots(servers["decode"].url) == 0

    asyncio.run(main())


# ~170-token prompts: long enough that llama.cpp's own numerics differ between evaluating
# a prompt's last token inside the prompt's batch (a fresh request) and alone (a request
# whose prompt is cached, as after a hand-off): greedy outputs of a fresh and a cached
# request then drift apart after a few tokens on one aggregated replica too.
LONG = " ".join(
    ["river", "city", "stone", "winter", "garden", "music", "harbor", "forest", "letter"][
        (i * 7 + i // 3) % 9
    ]
    for i in range(150)
)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_long_prompts_match_the_aggregated_replica_answering_from_its_prompt_cache(
    servers: dict[str, Server], path: str
) -> None:
    async def main() -> None:
        handoff = Handoff("llama.cpp")
        body = {**_request(path, f"{path} {LONG}", stream=False), "ignore_eos": True}
        async with httpx.AsyncClient(timeout=120) as client:
            await ask(client, servers["agg"].url, path, body)  # fills its prompt cache
            cached, answer = await ask(client, servers["agg"].url, path, body)
            split, last = await _disaggregated(handoff, client, servers, path, body)
        # The same path on both sides: the prompt evaluated in one batch, then its last
        # token alone — the output is the aggregated replica's, to the token.
        assert answer["timings"]["prompt_n"] <= 2 and answer["timings"]["cache_n"] >= 150
        assert last["timings"]["prompt_n"] <= 2 and last["timings"]["cache_n"] >= 150
        assert split == cached
        assert last["usage"]["completion_tokens"] == MAX_TOKENS and split.strip()

    asyncio.run(main())


def test_more_concurrent_requests_than_slots_all_complete_one_request_per_slot(
    servers: dict[str, Server],
) -> None:
    prefill, decode = servers["prefill"], servers["decode"]
    holders: dict[tuple[str, int], int] = {}  # (replica, slot) -> requests using it now
    overlaps: list[tuple[str, int]] = []

    def enter(url: str, slot: int) -> None:
        holders[(url, slot)] = holders.get((url, slot), 0) + 1
        if holders[(url, slot)] > 1:
            overlaps.append((url, slot))

    def leave(url: str, slot: int) -> None:
        holders[(url, slot)] -= 1

    async def main() -> list[str]:
        handoff = Handoff("llama.cpp")
        async with httpx.AsyncClient(timeout=120) as client:
            plain = make_post(client)

            async def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
                # A prefill slot is in use from its prefill until its KV is saved.
                if url == prefill.url and "id_slot" in body:
                    enter(url, body["id_slot"])
                answer = await plain(url, path, body)
                if url == prefill.url and "action=save" in path:
                    leave(url, int(path.split("/")[2].split("?")[0]))
                return answer

            async def one(i: int) -> str:
                body = _request("/v1/completions", f"Story {i}: once upon a time a", stream=False)
                prepared = await handoff.prefill(
                    post,
                    prefill.endpoint("prefill"),
                    decode.endpoint("decode"),
                    "/v1/completions",
                    body,
                )
                slot = prepared.body["id_slot"]
                enter(decode.url, slot)
                try:
                    text, answer = await ask(client, decode.url, "/v1/completions", prepared.body)
                    assert answer["choices"][0]["finish_reason"] in ("length", "stop")
                    return text
                finally:
                    leave(decode.url, slot)
                    await prepared.release()

            texts = await asyncio.gather(*(one(i) for i in range(5)))
        assert handoff.busy_slots(prefill.url) == 0
        assert handoff.busy_slots(decode.url) == 0
        return list(texts)

    texts = asyncio.run(main())
    assert len(texts) == 5 and all(t.strip() for t in texts)
    assert overlaps == []
    assert {slot for (_, slot) in holders} <= {0, 1}


def test_a_decode_replica_dying_mid_way_fails_the_hand_off_and_frees_every_slot(
    servers: dict[str, Server], tmp_path: Path
) -> None:
    handoff_dir = tmp_path / "handoff"
    handoff_dir.mkdir()
    doomed = start(tmp_path, "doomed", handoff_dir)
    try:
        wait_ready(doomed)
        prefill = servers["prefill"]

        async def main() -> None:
            handoff = Handoff("llama.cpp")
            async with httpx.AsyncClient(timeout=60) as client:
                plain = make_post(client)

                async def post(
                    url: str, path: str, body: dict[str, Any]
                ) -> tuple[int, dict[str, Any]]:
                    answer = await plain(url, path, body)
                    if "action=save" in path:  # the prefill is done: the decode replica dies
                        doomed.stop()
                    return answer

                body = _request("/v1/completions", "The weather today is", stream=False)
                with pytest.raises(HandoffError) as failed:
                    await handoff.prefill(
                        post,
                        prefill.endpoint("prefill"),
                        doomed.endpoint("decode"),
                        "/v1/completions",
                        body,
                    )
                assert failed.value.status == 502
                assert "restoring" in str(failed.value) and doomed.url in str(failed.value)
                assert handoff.busy_slots(prefill.url) == 0
                assert handoff.busy_slots(doomed.url) == 0
                # The prefill replica serves the next hand-off at once.
                text, _ = await _disaggregated(handoff, client, servers, "/v1/completions", body)
                assert text.strip()

        asyncio.run(main())
    finally:
        doomed.stop()


def test_a_request_lost_on_a_dropped_connection_is_sent_once_more(
    servers: dict[str, Server],
) -> None:
    """llama-server drops a kept-alive connection after a streamed answer: the pooled
    client's next request fails before reaching it. Each step survives one such loss."""

    async def main() -> None:
        handoff = Handoff("llama.cpp")
        lost: list[str] = []
        async with httpx.AsyncClient(timeout=60) as client:
            plain = make_post(client)

            async def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
                step = path.split("action=")[-1] if "action=" in path else "prefill"
                if step not in lost:
                    lost.append(step)
                    raise httpx.RemoteProtocolError("Server disconnected")
                return await plain(url, path, body)

            body = _request("/v1/completions", "Four seasons: spring, summer,", stream=False)
            alone, _ = await ask(client, servers["agg"].url, "/v1/completions", body)
            split, _ = await _disaggregated(handoff, client, servers, "/v1/completions", body, post)
        assert lost == ["prefill", "save", "restore"]
        assert split == alone

    asyncio.run(main())


def test_waiting_for_a_decode_slot_is_bounded_and_a_release_frees_it(
    servers: dict[str, Server],
) -> None:
    prefill, decode = servers["prefill"], servers["decode"]

    async def main() -> None:
        handoff = Handoff("llama.cpp", slot_wait_s=0.5)
        async with httpx.AsyncClient(timeout=60) as client:
            post = make_post(client)
            body = _request("/v1/completions", "Hello there", stream=False)
            ends = (prefill.endpoint("prefill"), decode.endpoint("decode"))
            held = [await handoff.prefill(post, *ends, "/v1/completions", body) for _ in range(2)]
            assert sorted(p.body["id_slot"] for p in held) == [0, 1]
            with pytest.raises(HandoffError) as full:
                await handoff.prefill(post, *ends, "/v1/completions", body)
            assert full.value.status == 503 and "no free slot on decode replica" in str(full.value)
            assert handoff.busy_slots(prefill.url) == 0  # the waiting one gave its slot back
            await held[0].release()
            await held[0].release()  # once is what counts
            again = await handoff.prefill(post, *ends, "/v1/completions", body)
            assert again.body["id_slot"] == held[0].body["id_slot"]
            assert handoff.busy_slots(decode.url) == 2
            for p in (again, held[1]):
                await p.release()
            assert handoff.busy_slots(decode.url) == 0

    asyncio.run(main())


def test_an_engine_error_on_the_prefill_replica_is_a_handoff_error(
    servers: dict[str, Server],
) -> None:
    async def main() -> None:
        handoff = Handoff("llama.cpp")
        long = " ".join(["word"] * 3000)  # more tokens than a slot's context holds
        async with httpx.AsyncClient(timeout=60) as client:
            with pytest.raises(HandoffError) as failed:
                await handoff.prefill(
                    make_post(client),
                    servers["prefill"].endpoint("prefill"),
                    servers["decode"].endpoint("decode"),
                    "/v1/completions",
                    _request("/v1/completions", long, stream=False),
                )
        assert failed.value.status == 502
        assert "prefill on" in str(failed.value) and "answered 400" in str(failed.value)
        assert handoff.busy_slots(servers["prefill"].url) == 0
        assert handoff.busy_slots(servers["decode"].url) == 0

    asyncio.run(main())


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/embeddings", {"input": "x"}, "not /v1/embeddings"),
        ("/v1/completions", {"prompt": ["one", "two"]}, "one prompt per request"),
        ("/v1/completions", {"prompt": ""}, "non-empty"),
        ("/v1/completions", {"prompt": "x", "n": 2}, "n = 1"),
        ("/v1/chat/completions", {"messages": []}, "'messages'"),
    ],
)
def test_a_request_the_hand_off_cannot_carry_is_refused_with_400(
    path: str, body: dict[str, Any], message: str
) -> None:
    async def never(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        raise AssertionError("no engine is asked")

    end = Endpoint(job_id=1, pool="prefill", url="http://127.0.0.1:9", slots=1, generation=1)
    handoff = Handoff("llama.cpp")
    with pytest.raises(HandoffError) as refused:
        asyncio.run(handoff.prefill(never, end, end, path, body))
    assert refused.value.status == 400 and message in str(refused.value)
    assert handoff.busy_slots(end.url) == 0


def test_replicas_with_different_slot_counts_are_refused_before_any_work() -> None:
    async def never(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        raise AssertionError("no engine is asked")

    pre = Endpoint(job_id=1, pool="prefill", url="http://127.0.0.1:9", slots=2, generation=1)
    dec = Endpoint(job_id=2, pool="decode", url="http://127.0.0.1:8", slots=4, generation=1)
    handoff = Handoff("llama.cpp")
    with pytest.raises(HandoffError, match=r"2 slots, decode replica .* 4"):
        asyncio.run(handoff.prefill(never, pre, dec, "/v1/completions", {"prompt": "x"}))
    with pytest.raises(ValueError, match=r"same slots \(-np\)"):
        DeploymentSpec(
            name="chat",
            engine="llama.cpp",
            model="/m.gguf",
            engine_path="/llama-server",
            pools=[PoolSpec(role="prefill", slots=2), PoolSpec(role="decode", slots=4)],
            handoff_dir="/shared",
        )


def test_an_unreachable_prefill_replica_is_a_handoff_error() -> None:
    async def main() -> None:
        url = f"http://127.0.0.1:{free_port()}"  # nothing listens
        end = Endpoint(job_id=1, pool="prefill", url=url, slots=1, generation=1)
        handoff = Handoff("llama.cpp")
        async with httpx.AsyncClient(timeout=10) as client:
            with pytest.raises(HandoffError) as failed:
                await handoff.prefill(
                    make_post(client), end, end, "/v1/completions", {"prompt": "x"}
                )
        assert failed.value.status == 502 and "ConnectError" in str(failed.value)
        assert handoff.busy_slots(url) == 0

    asyncio.run(main())


def test_set_replicas_keeps_the_leases_of_a_replica_that_comes_back() -> None:
    a = Endpoint(job_id=1, pool="decode", url="http://127.0.0.1:1", slots=2, generation=1)
    b = Endpoint(job_id=2, pool="decode", url="http://127.0.0.1:2", slots=1, generation=1)

    async def main() -> None:
        handoff = Handoff("llama.cpp", slot_wait_s=0.05)
        handoff.set_replicas([a, b])
        lease = await handoff._lease(a, "decode")
        handoff.set_replicas([b])  # a leaves while one of its slots is held ...
        assert handoff.busy_slots(a.url) == 1
        handoff.set_replicas([a, b])  # ... and comes back: that slot is still held
        second = await handoff._lease(a, "decode")
        assert {lease.slot, second.slot} == {0, 1}
        with pytest.raises(HandoffError):
            await handoff._lease(a, "decode")
        lease.release()
        second.release()
        handoff.set_replicas([b])  # gone with nothing held: forgotten
        assert handoff.busy_slots(a.url) == 0 and a.url not in handoff._replicas
        handoff.set_replicas([b.model_copy(update={"slots": 3})])  # restarted with -np 3
        assert handoff._replicas[b.url].count == 3

    asyncio.run(main())


def test_unknown_engine_is_refused() -> None:
    with pytest.raises(ValueError, match="no prefill/decode hand-off for engine 'custom'"):
        Handoff("custom")


def test_sweep_removes_only_stale_hand_off_files(tmp_path: Path) -> None:
    now = time.time()
    old = tmp_path / f"{FILE_PREFIX}{'a' * 32}{FILE_SUFFIX}"
    fresh = tmp_path / f"{FILE_PREFIX}{'b' * 32}{FILE_SUFFIX}"
    other = tmp_path / "model.gguf"
    for path in (old, fresh, other):
        path.write_bytes(b"kv")
    os.utime(old, (now - 700, now - 700))
    os.utime(other, (now - 7000, now - 7000))
    (tmp_path / f"{FILE_PREFIX}dir{FILE_SUFFIX}").mkdir()
    assert sweep(tmp_path, older_than_s=600, now=now) == 1
    assert not old.exists() and fresh.exists() and other.exists()
    assert sweep(tmp_path, older_than_s=600, now=now) == 0
    assert sweep(tmp_path / "missing", older_than_s=600) == 0
