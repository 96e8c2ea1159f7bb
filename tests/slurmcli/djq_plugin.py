"""A pytest plugin that lets dask-jobqueue's own test-suite run from its installed package
(`pytest -p tests.slurmcli.djq_plugin --pyargs dask_jobqueue.tests -E slurm`).

The suite expects what its source repository's root conftest.py provides, which neither its
wheel nor its sdist ships: the `-E NAME` option (run only the tests marked `env(NAME)`; with
no `-E`, only unmarked ones), the `env` and `xfail_env` markers, the `loop` fixture from
distributed's test utilities, and the `Cluster` / `EnvSpecificCluster` fixtures (one
parameter per job-queue system, marked with its environment). This module provides the same
behaviour, so the Slurm-marked tests drive whatever `sbatch` is first on PATH — here the
Phalanx shims.
"""

from __future__ import annotations

import copy
from typing import Any

import dask
import dask_jobqueue.config
import distributed.utils_test
import pytest
from dask_jobqueue.htcondor import HTCondorCluster
from dask_jobqueue.local import LocalCluster as JobqueueLocalCluster
from dask_jobqueue.lsf import LSFCluster
from dask_jobqueue.moab import MoabCluster
from dask_jobqueue.oar import OARCluster
from dask_jobqueue.pbs import PBSCluster
from dask_jobqueue.sge import SGECluster
from dask_jobqueue.slurm import SLURMCluster
from distributed.utils_test import loop, loop_in_thread  # noqa: F401 (fixtures)

# Which cluster class each `-E` environment tests (None: no scheduler, the local one).
ENVIRONMENTS: dict[str | None, Any] = {
    None: JobqueueLocalCluster,
    "pbs": PBSCluster,
    "moab": MoabCluster,
    "slurm": SLURMCluster,
    "sge": SGECluster,
    "lsf": LSFCluster,
    "oar": OARCluster,
    "htcondor": HTCondorCluster,
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("-E", action="store", metavar="NAME", help="only run tests marked env(NAME)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "env(NAME): only run if the -E environment is NAME")
    config.addinivalue_line("markers", "xfail_env(NAMES): known failure in these environments")


def _marked_environments(item: pytest.Item) -> list[str | None]:
    names: list[str | None] = []
    for mark in item.iter_markers(name="env"):
        arg = mark.args[0]
        names.extend(arg if isinstance(arg, list) else [arg])
    return names


def pytest_runtest_setup(item: pytest.Item) -> None:
    env = item.config.getoption("-E")
    names = _marked_environments(item)
    if None in names:  # the no-scheduler parameter of a parametrised fixture
        wanted = env is None
    elif env is None:
        wanted = not names
    else:
        wanted = env in names
    if not wanted:
        pytest.skip(f"test requires env in {names!r}")
    for mark in item.iter_markers(name="xfail_env"):
        reasons: dict[str, str] = mark.args[0]
        if env in reasons:
            item.add_marker(pytest.mark.xfail(reason=reasons[env]))


@pytest.fixture
def cleanup() -> Any:
    """distributed's `loop` fixture depends on `cleanup`; jobqueue's config survives it."""
    dask_jobqueue.config.reconfigure()
    yield


def _reset_config() -> None:
    dask.config.config.clear()
    dask.config.config.update(copy.deepcopy(distributed.utils_test.original_config))
    dask_jobqueue.config.reconfigure()


# distributed resets dask's config between tests to its own defaults, which drops the
# jobqueue section the suite reads; reset it to those defaults plus jobqueue's.
distributed.utils_test.reset_config = _reset_config


def _with_disk(cls: Any) -> Any:
    if cls is HTCondorCluster:
        dask.config.set({"jobqueue.htcondor.disk": "1GB"})  # HTCondor requires it
    return cls


@pytest.fixture(
    params=[pytest.param(cls, marks=[pytest.mark.env(name)]) for name, cls in ENVIRONMENTS.items()]
)
def EnvSpecificCluster(request: pytest.FixtureRequest) -> Any:
    return _with_disk(request.param)


@pytest.fixture(params=list(ENVIRONMENTS.values()))
def Cluster(request: pytest.FixtureRequest) -> Any:
    return _with_disk(request.param)
