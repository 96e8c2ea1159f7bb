"""The real Slurm commands the pool calls (`sbatch`, `squeue`, `scancel`), and their errors.

Every call is a subprocess with a timeout; a failure raises `SlurmError` with Slurm's own
words (its stderr), `SlurmUnreachable` when the controller did not answer (the pool keeps
going and asks again), `SubmitRefused` when sbatch refused the job itself (a bad partition,
an account it may not use: retrying the same request fails the same way).
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# What Slurm's clients print when slurmctld cannot be reached (connect failure, timeout).
_UNREACHABLE = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "slurm_persist_conn",
    "zero bytes were transmitted",
    "controller not responding",
)
# Slurm job states in which the job holds or will hold an allocation (squeue's %T words).
LIVE_STATES = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "RESIZING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD"}
)
FIELD_SEP = "|"
# sbatch exports the submitter's environment to the job (--export=ALL): never the pool's
# own credentials. The agent reads its join token from its file, and gives jobs none of
# its environment anyway.
SECRET_ENV = ("PHALANX_TOKEN", "PHALANX_JOIN_TOKEN", "PHALANX_HEAD", "PHALANX_CONTEXT")


class SlurmError(RuntimeError):
    """A Slurm command failed; the message says which and what Slurm answered."""


class SlurmUnreachable(SlurmError):
    """slurmctld did not answer (down, restarting, or the network): ask again later."""


class SubmitRefused(SlurmError):
    """sbatch refused the job (bad partition, account, QOS, limits…): fix the pool's flags."""


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One of the pool's Slurm jobs as squeue shows it."""

    job_id: str
    state: str  # PENDING, RUNNING, COMPLETING, … (squeue %T)
    nodes: str  # the node it runs on ("" while pending)
    reason: str  # why it pends (squeue %r), "None" when running
    end_time: str  # its expected end (squeue %e), "N/A" or "Unknown" while pending

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


def current_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


class Slurm:
    """Runs Slurm's client commands from `bin_dir` (default: from PATH) with `env`
    (default: this process's; SLURM_CONF in it picks the cluster)."""

    def __init__(
        self,
        bin_dir: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.bin_dir = bin_dir
        # Slurm's commands need none of the pool's credentials (and sbatch would export
        # them to the job).
        base = os.environ if env is None else env
        self.env = {k: v for k, v in base.items() if k not in SECRET_ENV}
        self.timeout_s = timeout_s
        self.user = current_user()

    def _cmd(self, name: str) -> str:
        return os.path.join(self.bin_dir, name) if self.bin_dir else name

    def _run(self, argv: Sequence[str], stdin: str | None = None) -> str:
        what = " ".join(argv[:1])
        try:
            done = subprocess.run(
                [self._cmd(argv[0]), *argv[1:]],
                input=stdin,
                capture_output=True,
                text=True,
                env=self.env,
                timeout=self.timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise SlurmError(
                f"{what}: not found (is Slurm's client installed and on PATH?)"
            ) from None
        except subprocess.TimeoutExpired:
            raise SlurmUnreachable(f"{what}: no answer within {self.timeout_s:.0f} s") from None
        except OSError as e:
            raise SlurmError(f"{what}: cannot run it: {e.strerror or e}") from None
        if done.returncode != 0:
            said = " ".join((done.stderr or done.stdout).split())[:500] or "no message"
            if any(marker in said.lower() for marker in _UNREACHABLE):
                raise SlurmUnreachable(f"{what}: {said}")
            if argv[0] == "sbatch":
                raise SubmitRefused(f"sbatch refused the job: {said}")
            raise SlurmError(f"{what} failed (exit {done.returncode}): {said}")
        return done.stdout

    def submit(self, script: str, options: Sequence[str]) -> str:
        """sbatch the script (on stdin) with `options`; the new job's id."""
        out = self._run(["sbatch", "--parsable", *options], stdin=script).strip()
        job_id = out.split(";", 1)[0]  # `--parsable` prints "ID" or "ID;CLUSTER"
        if not job_id.isdigit():
            raise SlurmError(f"sbatch: unexpected answer {out[:200]!r} (no job id)")
        return job_id

    def jobs(self, name: str) -> list[SlurmJob]:
        """This user's Slurm jobs named `name` that squeue still lists."""
        fmt = FIELD_SEP.join(("%i", "%T", "%N", "%r", "%e"))
        out = self._run(
            ["squeue", "--noheader", f"--name={name}", f"--user={self.user}", "-o", fmt]
        )
        found = []
        for line in out.splitlines():
            parts = line.split(FIELD_SEP)
            if len(parts) != 5 or not parts[0].strip().isdigit():
                continue
            job_id, state, nodes, reason, end = (p.strip() for p in parts)
            found.append(SlurmJob(job_id, state, nodes, reason, end))
        return found

    def cancel(self, job_ids: Sequence[str]) -> None:
        """scancel these jobs (their processes get SIGTERM, then SIGKILL after KillWait)."""
        if job_ids:
            self._run(["scancel", *job_ids])
