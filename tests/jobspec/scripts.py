"""Batch scripts shaped like real multi-node training scripts (written for these tests)."""

from __future__ import annotations

# The shape of torchtitan's multinode_trainer.slurm: one task per node, torchrun under srun.
TITAN = """\
#!/usr/bin/bash
# Two-node pretraining run; change --nodes and --nnodes together to scale.

#SBATCH --job-name=titan-8b
#SBATCH --ntasks=2
#SBATCH --nodes=2
#SBATCH --gpus-per-task=8
#SBATCH --cpus-per-task=96
#SBATCH --partition=train
#SBATCH --mail-type=END,FAIL

set -ex
nodes=( $( scontrol show hostnames $SLURM_JOB_NODELIST ) )
nodes_array=($nodes)
head_node=${nodes_array[0]}
head_node_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address)
echo "rendezvous at $head_node_ip"
export LOGLEVEL=INFO
CONFIG=${CONFIG:-"./configs/llama3_8b.toml"}
srun torchrun --nnodes 2 --nproc_per_node 8 --rdzv_id 101 --rdzv_backend c10d \\
    --rdzv_endpoint "$head_node_ip:29500" ./train.py --job.config_file ${CONFIG}
"""

# The shape of accelerate's examples/slurm/submit_multinode.sh.
ACCELERATE = """\
#!/bin/bash

#SBATCH --job-name=accel-nlp
#SBATCH -D runs/accel
#SBATCH --output=logs/%x-%j.out
#SBATCH --error=logs/%x-%j.err
#SBATCH --nodes=4                   # machines
#SBATCH --ntasks-per-node=1         # one launcher per machine
#SBATCH --gres=gpu:4                # GPUs per machine
#SBATCH --cpus-per-task=160
#SBATCH --exclusive
#SBATCH --hint=nomultithread
#SBATCH --time=04:00:00

source activate accel-env
export GPUS_PER_NODE=4
head_node=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)
export MASTER_ADDR=$head_node
export MASTER_PORT=29400
export LAUNCHER="accelerate launch --num_processes $((SLURM_NNODES * GPUS_PER_NODE)) \\
    --num_machines $SLURM_NNODES --rdzv_backend c10d \\
    --main_process_ip $MASTER_ADDR --main_process_port $MASTER_PORT"
export SCRIPT="complete_nlp_example.py"
export CMD="$SCRIPT --mixed_precision fp16"
srun $LAUNCHER $CMD
"""

# The shape of nanotron's examples/slurm/train.slurm: requeue on USR1 before the limit.
NANOTRON = """\
#!/bin/bash
#SBATCH --job-name=smol-pretrain
#SBATCH --time=2-00:00:00
#SBATCH --qos=high
#SBATCH --nodes=8
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --mem=512G
#SBATCH --exclusive
#SBATCH --array=1-4%1
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
#SBATCH --output=/fsx/logs/%x-%A_%a.out
#SBATCH --mem-per-cpu=4G
#SBATCH --open-mode=append

set -x -e
export HF_HOME=/fsx/cache
export CUDA_DEVICE_MAX_CONNECTIONS=1
MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)
MASTER_PORT=6000
trap 'echo "USR1: requeue"; scontrol requeue $SLURM_JOB_ID' USR1
LAUNCHER="torchrun --nproc_per_node 8 --nnodes $SLURM_NNODES \\
    --rdzv_endpoint $MASTER_ADDR:$MASTER_PORT --rdzv_backend c10d --max_restarts 0"
srun -u bash -c "$LAUNCHER run_train.py --config-file config.yaml" &
wait
"""
