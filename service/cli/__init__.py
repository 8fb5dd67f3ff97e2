"""`calve`: the command line (main.py), its admin commands (admin.py) and the `up` supervisor's
child processes (processes.py)."""

from service.cli.main import main

__all__ = ["main"]
