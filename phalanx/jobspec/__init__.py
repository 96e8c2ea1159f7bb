"""One JobSpec from three sources: YAML files, CLI flags and `#SBATCH` scripts."""

from phalanx.jobspec import hostlist
from phalanx.jobspec.build import build_spec
from phalanx.jobspec.errors import JobSpecError
from phalanx.jobspec.options import SubmitOptions, merge
from phalanx.jobspec.patterns import expand_pattern
from phalanx.jobspec.sbatch import (
    HETJOB_REFUSAL,
    CommandLine,
    check_script,
    parse_sbatch,
    parse_sbatch_argv,
    parse_sbatch_script,
)
from phalanx.jobspec.units import parse_duration, parse_mem, parse_time
from phalanx.jobspec.yamlspec import load_yaml

__all__ = [
    "HETJOB_REFUSAL",
    "CommandLine",
    "JobSpecError",
    "SubmitOptions",
    "build_spec",
    "check_script",
    "expand_pattern",
    "hostlist",
    "load_yaml",
    "merge",
    "parse_duration",
    "parse_mem",
    "parse_sbatch",
    "parse_sbatch_argv",
    "parse_sbatch_script",
    "parse_time",
]
