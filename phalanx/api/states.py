"""Job states as the wire spells them (no pydantic here: the CLI imports it at start-up).

The wire's view of core.JobState: the client and the CLI do not import the core, and a test
holds the two to the same members and the same terminal ones."""

from __future__ import annotations

from typing import Literal, get_args

JobStateCode = Literal["PD", "R", "CG", "CD", "F", "CA", "TO", "NF", "OOM", "PR"]
JOB_STATES: tuple[str, ...] = get_args(JobStateCode)
TERMINAL_JOB_STATES: frozenset[str] = frozenset({"CD", "F", "CA", "TO", "NF", "OOM"})
