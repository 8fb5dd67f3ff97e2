"""Names of the processes that take work from Redis (writer consumers, committer lease owners)."""

from __future__ import annotations

import os
import socket
import uuid


def consumer_name() -> str:
    """`<host>-<pid>-<random>`: unique per process start, and says where to look for it."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
