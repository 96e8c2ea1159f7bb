"""The Slurm job the pool submits: its sbatch options and its batch script.

The script runs one `phalanx agent` for the length of the allocation (`exec`: the agent is
the batch step's main process, so Slurm's signals reach it directly). Its node name is
the pool's prefix plus the Slurm job id, so the pool can tell which Phalanx node is which
Slurm job (and the name is never reused). The join token stays in its file: the script
names the file, never the token, and nothing logs it.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

AUTO_ADDRESS = "auto"
# The node's first address (`hostname -I`), else what its name resolves to.
_AUTO_ADDRESS_SH = (
    'address="$(hostname -I 2>/dev/null | cut -d" " -f1)"\n'
    'if [ -z "$address" ]; then address="$(hostname -i | cut -d" " -f1)"; fi'
)
_HOSTNAME_SH = 'address="$(hostname -f)"'
# iface:NAME: the node's IPv4 address on that interface (ib0, eth1: the training network).
_IFACE_SH = (
    "address=\"$(ip -4 -o addr show dev {iface} | awk '{{print $4}}' | cut -d/ -f1 | head -n1)\"\n"
    'if [ -z "$address" ]; then echo "no IPv4 address on {iface}" >&2; exit 1; fi'
)


def address_lines(address: str) -> str:
    """Shell that sets $address: `auto`, `hostname` (the node's FQDN), `iface:NAME`, or a
    literal address (a single-host test)."""
    if address == AUTO_ADDRESS:
        return _AUTO_ADDRESS_SH
    if address == "hostname":
        return _HOSTNAME_SH
    if address.startswith("iface:"):
        iface = address.removeprefix("iface:")
        if not iface or not all(c.isalnum() or c in "._-" for c in iface):
            raise ValueError(f"--address {address!r}: not an interface name")
        return _IFACE_SH.format(iface=iface)
    return f"address={shlex.quote(address)}"


@dataclass(frozen=True)
class AgentJob:
    """What every agent job of a pool looks like."""

    pool: str  # the pool's name: its Slurm jobs are named `phalanx-pool-<pool>`
    head_url: str
    token_file: str  # the join token, in a file the compute nodes can read
    node_prefix: str  # Phalanx node names: <prefix><slurm job id>
    state_root: str  # each agent's state dir: <state_root>/<node name> (node-local disk)
    phalanx: tuple[str, ...]  # the command that runs phalanx on a compute node
    partition: str | None = None
    gpus_per_node: int = 0
    time_limit: str | None = None  # sbatch --time (Slurm's formats: minutes, H:MM:SS, D-H)
    leave_before_s: int = 120  # SIGTERM this long before the time limit
    leave_grace_s: float = 60.0  # the agent's --leave-grace
    address: str = AUTO_ADDRESS
    ca_file: str | None = None
    output: str | None = None  # sbatch --output (default: Slurm's, slurm-%j.out in the cwd)
    sbatch_args: tuple[str, ...] = field(default_factory=tuple)
    agent_args: tuple[str, ...] = field(default_factory=tuple)

    @property
    def job_name(self) -> str:
        return f"phalanx-pool-{self.pool}"

    def node_name(self, slurm_id: str) -> str:
        return f"{self.node_prefix}{slurm_id}"

    def sbatch_options(self) -> list[str]:
        """One whole node per agent (NVML then sees exactly the GPUs Slurm gave it)."""
        opts = [f"--job-name={self.job_name}", "--nodes=1", "--ntasks=1", "--exclusive"]
        opts.append("--comment=phalanx agent (phalanx slurm-pool)")
        if self.partition:
            opts.append(f"--partition={self.partition}")
        if self.gpus_per_node > 0:
            opts.append(f"--gres=gpu:{self.gpus_per_node}")
        if self.time_limit:
            opts.append(f"--time={self.time_limit}")
            # Slurm warns the batch shell (the agent) ahead of the limit: it leaves then.
            opts.append(f"--signal=B:TERM@{self.leave_before_s}")
        if self.output:
            opts.append(f"--output={self.output}")
        opts.append("--no-requeue")  # a replacement is a new job (and a new node name)
        return [*opts, *self.sbatch_args]

    def script(self) -> str:
        argv = [
            *self.phalanx,
            "agent",
            "--head",
            self.head_url,
            "--token-file",
            self.token_file,
            "--on-sigterm",
            "leave",
            "--leave-grace",
            f"{self.leave_grace_s:g}",
        ]
        if self.ca_file:
            argv += ["--ca-file", self.ca_file]
        argv += list(self.agent_args)
        fixed = " ".join(shlex.quote(a) for a in argv)
        lines = [
            "#!/bin/bash",
            f"# phalanx slurm-pool {self.pool}: one Phalanx agent for this allocation.",
            "set -eu",
            f'name={shlex.quote(self.node_prefix)}"$SLURM_JOB_ID"',
            f'state={shlex.quote(self.state_root.rstrip("/"))}/"$name"',
        ]
        lines.append(address_lines(self.address))
        lines.append(f'exec {fixed} --name "$name" --address "$address" --state-dir "$state"')
        return "\n".join(lines) + "\n"


def parse_command(text: str) -> tuple[str, ...]:
    """`--phalanx-command "python -m phalanx"` as argv."""
    return tuple(shlex.split(text))


def check_args(args: Sequence[str], what: str) -> list[str]:
    """Extra options passed through: each must be one option (`--account=x`)."""
    bad = [a for a in args if not a.startswith("-") or "\n" in a or "\0" in a]
    if bad:
        raise ValueError(f"{what}: {bad[0]!r} is not an option (write --opt=value)")
    return list(args)
