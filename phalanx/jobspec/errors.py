"""The one error type for job specifications a user wrote."""

from __future__ import annotations


class JobSpecError(ValueError):
    """A job specification (YAML, CLI flags or `#SBATCH` lines) that cannot be used.

    The message names the bad option, value or line, and says what would be accepted, so
    the CLI can print it as is.
    """
