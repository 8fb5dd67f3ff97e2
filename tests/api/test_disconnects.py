"""A client that goes away mid-body is a normal event: a warning in the api's log, no traceback."""

from __future__ import annotations

import socket
import time

from tests.conftest import TEST_TOKEN
from tests.harness import wait_until


def test_a_client_that_disconnects_mid_body_leaves_a_warning_not_a_traceback(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api",))
    with socket.create_connection(("127.0.0.1", stack.port)) as conn:
        conn.sendall(b"POST /logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TEST_TOKEN.encode()
                     + b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"msg\":")
        time.sleep(0.5)
    log = stack.data_dir / "api.log"
    wait_until(lambda: "client disconnected" in log.read_text(), timeout_s=20, what="the warning")
    text = log.read_text()
    assert "Traceback" not in text and " ERROR " not in text, text[-2000:]
