"""`python -m phalanx.slurmcli TOOL ARGS…`: run one of the Slurm-compatible commands."""

from __future__ import annotations

import importlib
import sys

from phalanx.slurmcli import TOOLS


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in TOOLS:
        print(
            f"usage: python -m phalanx.slurmcli {{{','.join(TOOLS)}}} [ARGS...]",
            file=sys.stderr,
        )
        return 2
    tool = importlib.import_module(f"phalanx.slurmcli.{args[0]}")
    code: int = tool.main(args[1:])
    return code


if __name__ == "__main__":
    sys.exit(main())
