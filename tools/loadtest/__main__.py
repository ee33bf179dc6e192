"""`python -m tools.loadtest [options]`: see tools/loadtest/__init__.py."""
import sys

from .run import main

sys.exit(main())
