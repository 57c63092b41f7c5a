"""What a test that launches its own file as ranks needs: a free TCP port for their rendezvous,
an environment in which the file imports these helpers, and whether each rank finished."""

import os
import socket
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent)


def script_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default ``os.environ``) with ``tests/`` on ``PYTHONPATH``: a test file in a
    subfolder, run as a script, imports the helpers beside this one."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, env.get("PYTHONPATH")) if p)
    return env


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
    import signal

    if returncode == 0:
        return True
    return (returncode == -signal.SIGABRT and EXIT_ABORT in output
            and os.path.exists(result))
