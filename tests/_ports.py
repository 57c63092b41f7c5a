"""A TCP port for a multi-process test's rendezvous (shared by every test that launches ranks)."""

import socket


def free_port() -> int:
    """A TCP port free on this machine now: a launch must not meet a port an earlier test holds."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
