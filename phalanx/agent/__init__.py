"""The node agent: GPUs, job processes, launch environment, logs, srun steps, heartbeats."""
