"""`phalanx slurm-pool`: Phalanx agents as Slurm jobs on an existing Slurm cluster.

The pool is a client of both: of the Phalanx head through `phalanx.client` (its queue and
pending reasons, its nodes) and of Slurm through the real `sbatch`, `squeue` and `scancel`.
Each Slurm job it submits runs one `phalanx agent --on-sigterm leave` for the length of
the allocation. Modules: `slurm` (the Slurm commands), `payload` (the batch script),
`policy` (pure: how many nodes, which to let go), `pool` (the loop that applies it).
"""
