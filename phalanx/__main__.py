"""`python -m phalanx` runs the CLI."""

from phalanx.cli.main import app

app(prog_name="phalanx")  # not "python -m phalanx": messages name the command users type
