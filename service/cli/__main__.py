"""`python -m service.cli <command>`: what the `calve` script runs."""

import sys

from service.cli.main import main

sys.exit(main())
