"""`python -m phalanx.agent.srun`: the srun shim a job finds first on its PATH."""

import sys

from phalanx.agent.slurm_cmds import srun_main

if __name__ == "__main__":
    sys.exit(srun_main(sys.argv[1:]))
