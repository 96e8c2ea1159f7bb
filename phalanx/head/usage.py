"""The head's usage service: idle-GPU detection and the accounting rollup, wired to the
control thread and the GPU samples, with its own thread for ticks and flushes."""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy import delete, select

from phalanx.core.idle import IdleAction, IdlePolicy
from phalanx.head import accounting, db
from phalanx.head.accounting import By, Per, Rollup, Scope
from phalanx.head.control import ControlThread, HeadError
from phalanx.head.idle import IdleDetector, RunOp
from phalanx.head.mirror import Tx
from phalanx.head.telemetry import GpuSamples

log = logging.getLogger("phalanx.head")

TICK_S = 5.0  # idle flags and actions between samples: within window + 5 s of a fresh sample
FLUSH_S = 60.0  # the rollup is written this often (and before every report, and at stop)


class Usage:
    """Idle GPUs and accounting for one head."""

    def __init__(
        self,
        control: ControlThread,
        samples: GpuSamples,
        run_op: RunOp | None = None,
        tick_s: float = TICK_S,
        flush_s: float = FLUSH_S,
    ) -> None:
        self.control = control
        self.clock = control.clock
        self.idle = IdleDetector(control.mirror, run_op or control.submit_op)
        # Policy changes wait for their commit (a control loop driven by hand: its run_op).
        self._call: RunOp = run_op or control.call
        self.rollup = Rollup(control.engine)
        self.tick_s, self.flush_s = tick_s, flush_s
        control.move_watchers.append(self.idle.on_commit)
        samples.subscribe(self.idle.on_sample)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._flushing = threading.Lock()
        # Team → flagged-idle GPU-seconds the rollup stored since this head started (the
        # Prometheus counter phalanx_gpu_idle_seconds_total; head/metrics.py reads it).
        self._idle_s: dict[str, float] = {}
        self._idle_lock = threading.Lock()

    def load(self) -> None:
        """Policies and the rollup's cursor from the database, allocations from the mirror
        (after the control thread loaded it)."""
        with self.control.engine.connect() as conn:
            policies = {
                r.team: IdlePolicy(IdleAction(r.action), r.window_s, r.grace_s, r.threshold_pct)
                for r in conn.execute(select(db.idle_policies))
            }
        self.idle.set_policies(policies)
        with self.control.lock:
            holding = [r for r in self.control.mirror.jobs.values() if r.state.holds_gpus]
            self.idle.load(holding, self.clock.time())
        self.rollup.load()

    def start(self) -> None:
        self.load()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="phalanx-usage", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop ticking and write what was counted (a graceful restart loses nothing)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.flush()

    def _run(self) -> None:
        next_flush = self.clock.monotonic() + self.flush_s
        while not self._stop.wait(self.tick_s):
            try:
                self.idle.tick(self.clock.time())
                if self.clock.monotonic() >= next_flush:
                    next_flush = self.clock.monotonic() + self.flush_s
                    self.flush()
            except Exception:  # the database is away: the next flush tries again
                log.exception("usage: tick or flush failed; trying again later")

    def tick(self) -> None:
        self.idle.tick(self.clock.time())

    def flush(self) -> None:
        """Bring the rollup up to now."""
        with self._flushing:
            sums = self.idle.take_sums()
            try:
                self.rollup.flush(self.clock.time(), sums)
            except Exception:
                self.idle.put_back(sums)
                raise
            with self._idle_lock:
                for (_day, _user, team, _qos), (_util, idle) in sums.items():
                    if idle > 0:
                        self._idle_s[team] = self._idle_s.get(team, 0.0) + idle

    def idle_seconds(self) -> dict[str, float]:
        """Team → flagged-idle GPU-seconds stored since this head started (they move when
        the rollup is written: each FLUSH_S, and before each report)."""
        with self._idle_lock:
            return dict(self._idle_s)

    def flagged_by_team(self) -> dict[str, int]:
        """Team → how many of its allocated GPUs are flagged idle now."""
        out: dict[str, int] = {}
        for f in self.idle.flags():
            out[f.team] = out.get(f.team, 0) + 1
        return out

    # ------------------------------------------------------------------ reports
    def report(
        self, by: By, per: Per, since: str, until: str, scope: Scope | None
    ) -> list[dict[str, Any]]:
        try:
            self.flush()
        except Exception:  # a report of what was stored beats none
            log.exception("usage: flush before a report failed; reporting what is stored")
        with self.control.engine.connect() as conn:
            return accounting.report(conn, by, per, since, until, scope)

    # ------------------------------------------------------------------ policies
    def policies(self) -> dict[str, IdlePolicy]:
        with self.control.lock:
            teams = sorted(self.control.mirror.teams)
        return {t: self.idle.policy(t) for t in teams}

    def is_default(self, team: str) -> bool:
        with self.control.engine.connect() as conn:
            found = conn.execute(
                select(db.idle_policies.c.team).where(db.idle_policies.c.team == team)
            ).first()
        return found is None

    def set_policy(self, team: str, policy: IdlePolicy | None) -> None:
        """Store team `team`'s policy (None: back to the default), through the control
        thread (the team must exist; 404 if not)."""

        def op(tx: Tx) -> None:
            if team not in self.control.mirror.teams:
                raise HeadError(404, f"no team {team!r}")
            t = db.idle_policies
            tx.conn.execute(delete(t).where(t.c.team == team))
            if policy is not None:
                tx.conn.execute(
                    t.insert().values(
                        team=team,
                        action=policy.action.value,
                        window_s=policy.window_s,
                        grace_s=policy.grace_s,
                        threshold_pct=policy.threshold_pct,
                        updated=tx.now,
                    )
                )

        self._call(op)
        self.idle.set_policy(team, policy)
