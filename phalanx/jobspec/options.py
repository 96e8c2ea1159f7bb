"""Submit options exactly as the user gave them, and how CLI flags override a script's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Options that together describe one quantity: when the CLI gives any of them, all of the
# script's are dropped, so `--gpus-per-node=8` on the command line replaces a script's
# `--gres=gpu:4` instead of conflicting with it (sbatch behaves the same way).
OVERRIDE_GROUPS: tuple[frozenset[str], ...] = (
    frozenset({"gres", "gpus", "gpus_per_node", "gpus_per_task"}),
    frozenset({"ntasks", "ntasks_per_node"}),
)


@dataclass
class SubmitOptions:
    """Every submit option as written (raw text, or a flag); None means "not given".

    Values are checked and converted only by `build_spec`, so a script's options and the
    CLI's can be merged first and every error is reported in one place.
    """

    job_name: str | None = None  # -J/--job-name
    nodes: str | None = None  # -N/--nodes
    ntasks: str | None = None  # -n/--ntasks
    ntasks_per_node: str | None = None  # --ntasks-per-node
    gres: str | None = None  # --gres=gpu[:type]:N
    gpus: str | None = None  # -G/--gpus=[type:]N, total over all nodes
    gpus_per_node: str | None = None  # --gpus-per-node=[type:]N
    gpus_per_task: str | None = None  # --gpus-per-task=[type:]N
    cpus_per_task: str | None = None  # -c/--cpus-per-task
    mem: str | None = None  # --mem
    time: str | None = None  # -t/--time
    partition: str | None = None  # -p/--partition → team
    qos: str | None = None  # -q/--qos
    account: str | None = None  # -A/--account
    output: str | None = None  # -o/--output
    error: str | None = None  # -e/--error
    dependency: str | None = None  # -d/--dependency
    array: str | None = None  # -a/--array
    requeue: bool | None = None  # --requeue / --no-requeue
    signal: str | None = None  # --signal
    exclusive: bool | None = None  # --exclusive (True) / --oversubscribe (False)
    launcher: str | None = None  # --launcher (Phalanx): torchrun, node or batch
    workdir: str | None = None  # -D/--chdir
    export: str | None = None  # --export
    constraint: str | None = None  # -C/--constraint → gpu_model
    exclude: str | None = None  # -x/--exclude (hostlist)
    nodelist: str | None = None  # -w/--nodelist (hostlist): only these nodes
    begin: str | None = None  # -b/--begin: not before this time
    max_restarts: str | None = None  # --max-restarts (Phalanx)
    # Fault tolerance (Phalanx's own, like --max-restarts):
    restart_on_failure: bool | None = None  # --restart-on-failure / --no-restart-on-failure
    checkpoint_dir: str | None = None  # --checkpoint-dir (relative: to the job's workdir)
    preempt_signal: str | None = None  # --preempt-signal: USR1, SIGUSR1 or a number
    preempt_grace: str | None = None  # --preempt-grace: seconds or a -t form
    hang_timeout: str | None = None  # --hang-timeout: seconds or a -t form; 0 = off
    # Notifications (jobspec/notify.py): a webhook, and Slurm's mail options mapped to it.
    notify_url: str | None = None  # --notify-url (Phalanx)
    mail_type: str | None = None  # --mail-type: BEGIN,END,FAIL,REQUEUE,ALL,NONE
    mail_user: str | None = None  # --mail-user: used when it is an http(s) URL


def merge(script: SubmitOptions, cli: SubmitOptions) -> SubmitOptions:
    """Combine a script's `#SBATCH` options with CLI flags; a flag the CLI gives wins.

    Options of one group (see OVERRIDE_GROUPS) are replaced together.
    """
    values = dataclasses.asdict(script)
    given = {key for key, value in dataclasses.asdict(cli).items() if value is not None}
    for group in OVERRIDE_GROUPS:
        if given & group:
            for key in group:
                values[key] = None
    for key in given:
        values[key] = getattr(cli, key)
    return SubmitOptions(**values)
