"""Reading the environment and checking parallel layouts: what init() decides before any I/O."""

from __future__ import annotations

import signal

import pytest

from phalanx.train.env import DistEnv
from phalanx.train.errors import TrainConfigError
from phalanx.train.model import preset
from phalanx.train.pipeline import stage_layers
from phalanx.train.preempt import (
    REQUEUE_EXIT_CODE,
    Preempted,
    PreemptionWatcher,
    grace_s,
    notice_signal,
)
from phalanx.train.runtime import ParallelConfig


def test_no_environment_is_one_process() -> None:
    env = DistEnv.from_environ({})
    assert (env.rank, env.world_size, env.local_rank, env.distributed) == (0, 1, 0, False)
    assert not env.under_phalanx


def test_torchrun_variables_are_read() -> None:
    env = DistEnv.from_environ(
        {
            "RANK": "5",
            "WORLD_SIZE": "8",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "4",
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29500",
            "TORCHELASTIC_RESTART_COUNT": "2",
        }
    )
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (5, 8, 1, 4)
    assert (env.master_addr, env.master_port, env.restart_count) == ("10.0.0.1", 29500, 2)


def test_phalanx_variables_fill_in_for_missing_torchrun_ones() -> None:
    env = DistEnv.from_environ(
        {
            "PHALANX_PROCID": "3",
            "PHALANX_NTASKS": "4",
            "PHALANX_LOCALID": "1",
            "PHALANX_JOB_ID": "42",
            "PHALANX_RESTART_COUNT": "1",
            "MASTER_ADDR": "127.0.0.2",
            "MASTER_PORT": "1234",
        }
    )
    assert (env.rank, env.world_size, env.local_rank) == (3, 4, 1)
    assert (env.job_id, env.restart_count, env.under_phalanx) == ("42", 1, True)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"WORLD_SIZE": "2", "RANK": "0"}, "MASTER_ADDR/MASTER_PORT are not set"),
        ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "outside 0..1"),
        ({"WORLD_SIZE": "two"}, "not an integer"),
    ],
)
def test_inconsistent_environment_is_a_clear_error(environ: dict[str, str], message: str) -> None:
    with pytest.raises(TrainConfigError, match=message):
        DistEnv.from_environ(environ)


def test_default_layout_is_data_parallel_over_the_world() -> None:
    assert ParallelConfig().resolve(8).degrees() == {"pp": 1, "dp": 8, "fsdp": 1, "tp": 1}


def test_minus_one_takes_the_rest_of_the_world() -> None:
    cfg = ParallelConfig(dp=1, fsdp=-1, tp=2, pp=2).resolve(16)
    assert cfg.degrees() == {"pp": 2, "dp": 1, "fsdp": 4, "tp": 2}


@pytest.mark.parametrize(
    ("cfg", "world", "message"),
    [
        (
            ParallelConfig(dp=2, tp=2),
            8,
            r"dp=2 × fsdp=1 × tp=2 = 4 processes, but the world size is 8",
        ),
        (ParallelConfig(tp=3), 8, "not divisible"),
        (ParallelConfig(fsdp=-1), 4, "only one parallel degree may be -1"),
        (ParallelConfig(dp=0), 4, "must be ≥ 1"),
    ],
)
def test_layouts_that_do_not_fit_the_world_are_rejected(
    cfg: ParallelConfig, world: int, message: str
) -> None:
    with pytest.raises(TrainConfigError, match=message):
        cfg.resolve(world)


def test_pipeline_stages_are_contiguous_and_balanced() -> None:
    names = [str(i) for i in range(7)]
    stages = [stage_layers(names, 3, s) for s in range(3)]
    assert stages == [["0", "1", "2"], ["3", "4"], ["5", "6"]]
    with pytest.raises(TrainConfigError, match="at least 4 blocks"):
        stage_layers(names[:3], 4, 0)


def test_notice_signal_defaults_to_sigusr1_and_is_configurable() -> None:
    assert notice_signal({}) == signal.SIGUSR1
    assert notice_signal({"PHALANX_PREEMPT_SIGNAL": "SIGTERM"}) == signal.SIGTERM
    assert notice_signal({"PHALANX_PREEMPT_SIGNAL": "usr2"}) == signal.SIGUSR2
    assert notice_signal({"PHALANX_PREEMPT_SIGNAL": "10"}) == signal.Signals(10)
    with pytest.raises(TrainConfigError, match="not a signal"):
        notice_signal({"PHALANX_PREEMPT_SIGNAL": "SIGNOPE"})


def test_grace_seconds_and_requeue_exit_code() -> None:
    assert grace_s({}) is None
    assert grace_s({"PHALANX_PREEMPT_DEADLINE": "30"}) == 30.0
    assert grace_s({"PHALANX_PREEMPT_DEADLINE": "30.5"}) == 30.5
    for bad in ("soon", "-1", "nan", "inf"):
        with pytest.raises(TrainConfigError, match="not a number of seconds"):
            grace_s({"PHALANX_PREEMPT_DEADLINE": bad})
    assert REQUEUE_EXIT_CODE == 75
    assert Preempted(12).code == REQUEUE_EXIT_CODE


def test_seconds_left_counts_from_the_notice() -> None:
    """PHALANX_PREEMPT_DEADLINE is the grace after the notice, not a point in time."""
    watcher = PreemptionWatcher(None, {"PHALANX_PREEMPT_DEADLINE": "30"})
    assert watcher.seconds_left() is None  # no notice yet
    watcher.request()
    left = watcher.seconds_left()
    assert watcher.received_at is not None and left is not None and 0 < left <= 30
    assert PreemptionWatcher(None, {}).seconds_left() is None


def test_unknown_preset_or_field_is_a_clear_error() -> None:
    with pytest.raises(TrainConfigError, match="unknown model preset"):
        preset("gpt-7")
    with pytest.raises(TrainConfigError, match="bad GPTConfig override"):
        preset("tiny", n_layers=3)


def test_init_rejects_a_layout_before_joining_any_process_group() -> None:
    from phalanx.train.runtime import init

    with pytest.raises(
        TrainConfigError, match="world size 1 is not divisible by pp=1 × fsdp=1 × tp=4 = 4"
    ):
        init(ParallelConfig(tp=4), environ={})
