"""`python -m phalanx` runs the CLI."""

from phalanx.cli.main import app

app()
