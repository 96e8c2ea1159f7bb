"""Team quotas with borrowing inside a cohort, seen through one scheduling cycle."""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.core.decisions import Reason, ReasonCode
from phalanx.core.state import ClusterState


@dataclass(frozen=True, slots=True)
class Admission:
    ok: bool
    borrowed: int = 0
    reason: Reason | None = None


ADMIT = Admission(True)


class QuotaView:
    """Team usage as the cycle goes: the live usage plus this cycle's tentative starts."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.usage = dict(state.usage)

    def add(self, team: str, gpus: int) -> None:
        self.usage[team] = self.usage.get(team, 0) + gpus

    def within_nominal(self, team: str, gpus: int) -> bool:
        quota = self.state.teams[team].quota
        return quota is None or self.usage.get(team, 0) + gpus <= quota

    def borrowing(self, team: str) -> bool:
        quota = self.state.teams[team].quota
        return quota is not None and self.usage.get(team, 0) > quota

    def cohort_idle(self, cohort: str) -> int:
        members = self.state.cohorts.get(cohort, [])
        capacity = sum(self.state.teams[t].quota or 0 for t in members)
        used = sum(self.usage.get(t, 0) for t in members)
        return max(0, capacity - used)

    def admit(self, team_name: str, gpus: int) -> Admission:
        team = self.state.teams[team_name]
        if team.quota is None:
            return ADMIT
        used = self.usage.get(team_name, 0)
        after = used + gpus
        if after <= team.quota:
            return ADMIT
        head = f"team {team_name} quota {used}/{team.quota} GPUs in use, job needs {gpus}"
        if team.cohort is None:
            return Admission(
                False, reason=Reason(ReasonCode.QUOTA, f"{head}; no cohort to borrow from")
            )
        borrowed_after = after - team.quota
        if team.borrowing_limit is not None and borrowed_after > team.borrowing_limit:
            return Admission(
                False,
                reason=Reason(
                    ReasonCode.QUOTA,
                    f"{head}; borrowing {borrowed_after} would pass the team's borrowing limit "
                    f"of {team.borrowing_limit}",
                ),
            )
        idle = self.cohort_idle(team.cohort)
        if gpus > idle:
            return Admission(
                False,
                reason=Reason(
                    ReasonCode.QUOTA,
                    f"{head}; cohort {team.cohort} has {idle} idle GPUs to borrow",
                ),
            )
        return Admission(True, borrowed=min(gpus, borrowed_after))
