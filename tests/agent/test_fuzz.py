"""Fuzz the agent: its HTTP API with schemathesis, and what it accepts from the head (the
desired state) with hypothesis. No 5xx, no exception; the agent and its job live on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phalanx.agent.admission import InvalidDesiredState, parse_desired
from phalanx.testing.processes import pid_alive

from .harness import AGENT_SECRET, Agent, start_agent
from .helpers import assignment, desired


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    """A real agent API with one running job (job 7, `sleep`)."""
    tmp = tmp_path_factory.mktemp("fuzz-agent")
    a = start_agent("127.0.0.2", tmp / "state")
    a.apply(desired(running_job(tmp)))
    try:
        yield a
    finally:
        a.close()


def running_job(workdir: Path) -> Any:
    return assignment(
        command=["sleep", "300"],
        workdir=str(workdir),
        nodes=["n1"],
        addresses=["127.0.0.2"],
        agent_urls=["http://127.0.0.2:1"],
        gpus_per_node=1,
        gpus=[0],
    )


def job_alive(agent: Agent) -> bool:
    [status] = [s for s in agent.reconciler.process_statuses() if s.job_id == 7]
    return status.running and status.pid is not None and pid_alive(status.pid)


def test_schemathesis_finds_no_server_error_in_the_agent_api(agent: Agent) -> None:
    st_bin = Path(sys.executable).with_name("st")
    result = subprocess.run(
        [
            str(st_bin),
            "run",
            f"{agent.url}/openapi.json",
            "--checks",
            "not_a_server_error,status_code_conformance,response_schema_conformance",
            "--header",
            f"Authorization: Bearer {AGENT_SECRET}",  # the head's credential: past auth
            "--max-examples",
            "30",
            "--seed",
            "1",
            "--request-timeout",
            "20",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "SCHEMATHESIS_HOOKS": ""},
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert httpx.get(f"{agent.url}/healthz", timeout=10).json()["loop_errors"] == 0
    assert job_alive(agent)


# ----------------------------------------------------------------------------- desired states
NASTY = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 2**31, 2**63, 2**70, 65536]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from(["\x00", "a\x00b", "/", "..", "%", "=", "A=B", "x" * 5000]),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
)
FIELDS = sorted(running_job(Path("/tmp")).model_dump(mode="json"))


@st.composite
def mutated_job(draw: st.DrawFn, base: dict[str, Any]) -> dict[str, Any]:
    """A job of the desired state with one to three fields set to hostile values."""
    job = dict(base)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from([*FIELDS, "extra_field"]))
        job[key] = draw(NASTY)
    if draw(st.booleans()):
        job["env"] = {draw(st.sampled_from(["A", "A=B", "\x00", "PATH"])): draw(NASTY)}
    return job


def test_hostile_desired_states_fail_only_their_jobs(agent: Agent, tmp_path: Path) -> None:
    good = running_job(agent.ctx.state_dir.parent)
    base = good.model_dump(mode="json")

    @settings(
        max_examples=60,
        derandomize=True,  # deterministic
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(job=mutated_job({**base, "job_id": 8, "gpus": [1]}), extra=NASTY)
    def run(job: dict[str, Any], extra: Any) -> None:
        state = desired(good).model_dump(mode="json")
        state["jobs"].append(job)
        if isinstance(extra, int) and not isinstance(extra, bool):
            state["health_ack"] = extra
        try:
            parsed, refused = parse_desired(json.dumps(state))
        except InvalidDesiredState:
            return  # the whole answer refused (a bad top-level field): nothing applied
        agent.reconciler.apply(parsed, refused)
        assert job_alive(agent)
        agent.reconciler.apply(desired(good))  # the hostile job goes away again

    run()
    assert agent.reconciler.survivals.total() == 0  # every failure was foreseen
    assert job_alive(agent)
