"""Independent runs of an experiment, one after another or in worker processes.

Example::

    >>> done = []
    >>> map_jobs(abs, [-1, 2, -3], workers=1, on_result=done.append)
    [1, 2, 3]
    >>> done
    [1, 2, 3]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["map_jobs"]


def map_jobs(fn: Callable[[Any], Any], jobs: Sequence[Any], *, workers: int = 1,
             on_result: Callable[[Any], None] | None = None) -> list[Any]:
    """``fn`` of every job, in the jobs' order; ``workers`` > 1 runs them in that many spawned
    processes (``fn`` and the jobs must pickle). ``on_result(result)`` is called as each ends,
    so a long experiment can save its runs as it goes.
    """
    out: list[Any] = []
    if workers <= 1 or len(jobs) <= 1:
        results: Any = map(fn, jobs)
        pool = None
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
        results = pool.map(fn, jobs)
    try:
        for result in results:
            out.append(result)
            if on_result is not None:
                on_result(result)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return out
