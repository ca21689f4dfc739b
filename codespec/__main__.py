"""`python -m codespec` runs the CLI."""

import sys

from codespec.cli.main import main

sys.exit(main())
