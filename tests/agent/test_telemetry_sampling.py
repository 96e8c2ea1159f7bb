"""Fake GPUs that jobs declare or drive, their energy counter, and the agent's sampler:
attribution to jobs, a bounded buffer that counts what it drops, columnar batches."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from phalanx.agent import fakeload
from phalanx.agent.fakeload import Holding
from phalanx.agent.gpus import IDLE_W, FakeLoad, FakeProvider
from phalanx.agent.telemetry import Sampler, batch_of, check_interval, same_shape
from phalanx.testing.clock import FakeClock


def _holding(job_dir: Path, gpus: tuple[int, ...], env: dict[str, str], job: int = 5) -> Holding:
    # The rank leaders: each leads its own process group (this test's group stands in)
    return Holding(job, 2, gpus, env, job_dir, None, (os.getpgrp(),), 0)


def test_declared_values_per_gpu() -> None:
    assert fakeload.declared("35", 3) == [35.0, 35.0, 35.0]
    assert fakeload.declared("90,10", 4) == [90.0, 10.0, 10.0, 10.0]  # the last repeats
    assert fakeload.declared("150,-3", 2) == [100.0, 0.0]  # clamped
    assert fakeload.declared("lots", 2) == [None, None]
    assert fakeload.declared(None, 2) == [None, None]


def test_a_driven_file_wins_and_is_read_safely(tmp_path: Path) -> None:
    env = {fakeload.UTIL_ENV: "35", fakeload.MEM_ENV: "12.5"}
    h = _holding(tmp_path, (3, 1), env)
    assert fakeload.loads([h]) == {3: FakeLoad(35.0, 12.5), 1: FakeLoad(35.0, 12.5)}
    fakeload.util_file(tmp_path, 0).write_text("20\n")
    # Rank 0's file drives every GPU of the job that has no file of its own.
    assert fakeload.loads([h]) == {3: FakeLoad(20.0, 12.5), 1: FakeLoad(20.0, 12.5)}
    fakeload.util_file(tmp_path, 1).write_text("60%")
    assert fakeload.loads([h]) == {3: FakeLoad(20.0, 12.5), 1: FakeLoad(60.0, 12.5)}
    fakeload.util_file(tmp_path, 1).write_text("garbage")  # unset: rank 0's again
    assert fakeload.loads([h])[1] == FakeLoad(20.0, 12.5)
    # A symlink is never followed (the job owns the file: it could point anywhere).
    fakeload.util_file(tmp_path, 1).unlink()
    secret = tmp_path / "secret"
    secret.write_text("77")
    fakeload.util_file(tmp_path, 1).symlink_to(secret)
    assert fakeload.read_driven(fakeload.util_file(tmp_path, 1)) is None
    # A job declaring nothing: busy by default (None), memory following utilisation.
    assert fakeload.loads([_holding(tmp_path / "none", (0,), {})]) == {0: FakeLoad(None, None)}


def test_fake_gpus_follow_their_load_and_count_energy() -> None:
    clock = FakeClock(0.0)
    loads: dict[int, FakeLoad] = {0: FakeLoad(50.0, 10.0)}
    gpus = FakeProvider(2, "H100", 81559, load=lambda: loads, clock=clock.monotonic)
    first = gpus.telemetry()
    assert [g.utilization_pct for g in first] == [50.0, 0.0]
    assert [g.memory_used_mb for g in first] == [8156, 0]
    assert [g.power_w for g in first] == [382.5, IDLE_W]  # 65 W + half of (700 − 65) W
    assert [g.temperature_c for g in first] == [52.0, 32.0]
    assert [g.energy_j for g in first] == [0.0, 0.0]
    clock.advance(10)
    second = gpus.telemetry()
    assert [g.energy_j for g in second] == [3825.0, 650.0]  # the power since the last reading
    loads.clear()  # the job ended
    clock.advance(10)
    third = gpus.telemetry()
    assert [g.utilization_pct for g in third] == [0.0, 0.0]
    assert [g.energy_j for g in third] == [7650.0, 1300.0]
    clock.advance(10)
    assert [g.energy_j for g in gpus.telemetry()] == [8300.0, 1950.0]


def test_sampler_attributes_gpus_and_drops_the_oldest(tmp_path: Path) -> None:
    clock = FakeClock(1_700_000_000.0)
    holdings = [_holding(tmp_path, (1,), {fakeload.UTIL_ENV: "40"}, job=9)]
    gpus = FakeProvider(2, load=lambda: fakeload.loads(holdings), clock=clock.monotonic)
    ended: list[int] = []
    sampler = Sampler(
        gpus,
        lambda: list(holdings),
        buffer=3,
        clock=clock.time,
        on_job_end=lambda: ended.append(1),
    )
    for _ in range(5):
        sampler.sample_once()
        clock.advance(10)
    samples, dropped = sampler.take()
    assert len(samples) == 3 and dropped == 2
    assert [s.time for s in samples] == [1_700_000_020.0, 1_700_000_030.0, 1_700_000_040.0]
    assert [g.job_id for g in samples[0].gpus] == [None, 9]
    assert samples[0].epochs == (None, 2)
    # Its CPU: a rate needs two readings; this process is the job here.
    assert samples[0].jobs and samples[0].jobs[0].job_id == 9
    batch = batch_of("n1", samples, dropped, clock.time())
    assert batch.gpus == [0, 1] and batch.times == [s.time for s in samples]
    assert batch.utilization_pct == [0.0, 40.0] * 3
    assert batch.job_id == [None, 9] * 3 and batch.epoch == [None, 2] * 3
    assert batch.dropped == 2
    sampler.done(2, dropped)
    assert sampler.pending() == 1 and sampler.take()[1] == 0
    assert not ended
    holdings.clear()
    sampler.sample_once()
    assert ended == [1]  # a job ended: the shipper is woken to send its last samples


def test_batches_have_one_shape() -> None:
    clock = FakeClock(0.0)
    two = Sampler(FakeProvider(2, clock=clock.monotonic), list, clock=clock.time)
    one = Sampler(FakeProvider(1, clock=clock.monotonic), list, clock=clock.time)
    samples = [two.sample_once(), two.sample_once(), one.sample_once(), two.sample_once()]
    assert same_shape(samples) == samples[:2]


def test_interval_bounds() -> None:
    assert check_interval(10.0) == 10.0
    for bad in (0.0, -1.0, 1e9):
        with pytest.raises(ValueError, match="--telemetry-interval"):
            check_interval(bad)


def test_the_agent_refuses_intervals_out_of_bounds(tmp_path: Path) -> None:
    from phalanx.agent.main import AgentConfig, AgentError, run_agent

    for field, flag in (("telemetry_interval_s", "--telemetry-interval"),
                        ("telemetry_ship_s", "--telemetry-ship")):  # fmt: skip
        cfg = AgentConfig(
            head_url="http://127.0.0.1:9",
            token="x",
            address="127.0.0.2",
            name="127.0.0.2",
            state_dir=tmp_path / "agent",
            fake_gpus=1,
            **{field: 0.0},  # type: ignore[arg-type]  # one float field, named above
        )
        with pytest.raises(AgentError, match=flag):
            run_agent(cfg)
