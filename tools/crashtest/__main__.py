"""`python -m tools.crashtest --cycles N [--seed S] ...`: see the package docstring."""
import sys

from .subcommands import main

sys.exit(main())
