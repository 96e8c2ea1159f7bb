"""`python -m phalanx.agent.scontrol`: the scontrol shim a job finds first on its PATH."""

import sys

from phalanx.agent.slurm_cmds import scontrol_main

if __name__ == "__main__":
    sys.exit(scontrol_main(sys.argv[1:]))
