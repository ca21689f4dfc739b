"""`python -m codespec` runs the CLI."""

from codespec.cli.main import run

run()
