"""One JobSpec from three sources: YAML files, CLI flags and `#SBATCH` scripts."""

from phalanx.jobspec import hostlist
from phalanx.jobspec.build import build_spec
from phalanx.jobspec.errors import JobSpecError
from phalanx.jobspec.options import SubmitOptions, merge
from phalanx.jobspec.patterns import expand_pattern
from phalanx.jobspec.sbatch import check_script, parse_sbatch
from phalanx.jobspec.units import parse_duration, parse_mem, parse_time
from phalanx.jobspec.yamlspec import load_yaml

__all__ = [
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
    "parse_time",
]
