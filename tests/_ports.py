"""A TCP port for a multi-process test's rendezvous (shared by every test that launches ranks)."""

import socket


def free_port() -> int:
    """A TCP port free on this machine now: a launch must not meet a port an earlier test holds."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: what the C++ runtime prints when torch's gloo backend still runs a thread as the interpreter
#: exits: an abort after the rank has done all its work, which says nothing of the run
EXIT_ABORT = "terminate called without an active exception"


def rank_finished(returncode: int | None, output: str, result) -> bool:
    """Whether a launched rank did all its work: it exited 0, or it wrote ``result`` (the
    last thing a rank does) and then hit torch's abort at interpreter exit (:data:`EXIT_ABORT`).
    A rank that aborts before writing its result, or fails any other way, did not finish."""
    import os
    import signal

    if returncode == 0:
        return True
    return (returncode == -signal.SIGABRT and EXIT_ABORT in output
            and os.path.exists(result))
