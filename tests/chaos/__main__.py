"""`python -m tests.chaos [scenario ...]` (what `make chaos` runs)."""

import sys

from tests.chaos.scenarios import main

sys.exit(main(sys.argv[1:]))
