"""Slurm's commands on the submitting host (`sbatch`, `squeue`, `sacct`, `scancel`, `sinfo`,
`scontrol`, `srun`, `salloc`), speaking to a Phalanx head with the user's token, so that tools
which drive Slurm (submitit, dask-jobqueue, TorchX, Snakemake, Nextflow) drive Phalanx unchanged.

Each tool is a module here with `main(argv: list[str]) -> int`; `python -m phalanx.slurmcli
TOOL ARGS…` runs one, and `phalanx slurm-shims DIR` writes one small script per tool into DIR
(to put on PATH). They are never installed under their Slurm names by pip: a Phalanx install
must not shadow a real Slurm by accident.
"""

from __future__ import annotations

# The tools, by the name they answer to; each is the module phalanx.slurmcli.<name>.
TOOLS = ("sbatch", "squeue", "sacct", "scancel", "sinfo", "scontrol", "srun", "salloc")
