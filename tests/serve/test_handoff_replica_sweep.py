"""The replica wrapper removes the hand-off files that hand-offs left behind (a router
that died between save and restore), for llama.cpp prefill/decode replicas only."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from phalanx.api.serving import DeploymentSpec, PoolSpec, ReplicaConfig
from phalanx.serve.handoff import FILE_PREFIX, FILE_SUFFIX, FILE_TTL_S
from phalanx.serve.replica import HeadLink, Replica


def _replica(handoff: Path, role: str, pools: list[PoolSpec]) -> Replica:
    spec = DeploymentSpec(
        name="chat",
        engine="llama.cpp",
        model="/m.gguf",
        engine_path="/llama-server",
        pools=pools,
        handoff_dir=str(handoff),
    )
    config = ReplicaConfig.model_validate(
        {
            "name": "chat",
            "job_id": 7,
            "pool": role,
            "generation": 1,
            "spec": spec.model_dump(mode="json"),
            "engine_key": "k",
        }
    )
    link = HeadLink(["http://127.0.0.1:9"], "token", 7, None)
    return Replica(link, config, "127.0.0.1")


def _files(handoff: Path) -> tuple[Path, Path]:
    stale = handoff / f"{FILE_PREFIX}{'a' * 32}{FILE_SUFFIX}"
    fresh = handoff / f"{FILE_PREFIX}{'b' * 32}{FILE_SUFFIX}"
    for path in (stale, fresh):
        path.write_bytes(b"kv")
    old = time.time() - FILE_TTL_S - 5
    os.utime(stale, (old, old))
    return stale, fresh


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_disaggregated_llama_replica_sweeps_stale_hand_off_files(
    tmp_path: Path, role: str
) -> None:
    stale, fresh = _files(tmp_path)
    replica = _replica(tmp_path, role, [PoolSpec(role="prefill"), PoolSpec(role="decode")])
    try:
        replica.sweep_handoff()
        assert not stale.exists() and fresh.exists()
        stale.write_bytes(b"kv")
        old = time.time() - FILE_TTL_S - 5
        os.utime(stale, (old, old))
        replica.sweep_handoff()  # not again within SWEEP_S
        assert stale.exists()
    finally:
        replica.cleanup()
        replica.link.close()


def test_an_aggregated_replica_leaves_the_folder_alone(tmp_path: Path) -> None:
    stale, fresh = _files(tmp_path)
    replica = _replica(tmp_path, "aggregated", [PoolSpec()])
    try:
        replica.sweep_handoff()
        assert stale.exists() and fresh.exists()
    finally:
        replica.cleanup()
        replica.link.close()
