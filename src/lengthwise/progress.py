"""Progress bars on standard error: tqdm when installed, a plain counter otherwise.

Example::

    >>> for _ in progress(range(3), desc="work", enable=False):
    ...     pass
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")


def progress(items: Iterable[T], *, desc: str = "", unit: str = "it", total: int | None = None,
             enable: bool = True) -> Iterator[T]:
    """Iterate over ``items`` showing progress on stderr when ``enable`` and stderr is a tty
    (or tqdm is installed)."""
    if not enable:
        yield from items
        return
    try:
        from tqdm.auto import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        yield from tqdm(items, desc=desc, unit=unit, total=total, file=sys.stderr,
                        leave=False, dynamic_ncols=True)
        return
    size = total if total is not None else (len(items) if hasattr(items, "__len__") else None)
    start = time.perf_counter()
    for i, item in enumerate(items, start=1):
        yield item
        of = f"/{size}" if size else ""
        print(f"\r{desc}: {i}{of} {unit} ({time.perf_counter() - start:.1f}s)", end="",
              file=sys.stderr, flush=True)
    print(file=sys.stderr)


@contextmanager
def no_transformers_bars() -> Iterator[None]:
    """``transformers``' own progress bars ("Loading weights", "Writing model shards") off
    within the block: a command's stderr keeps its own lines only.

    Example::

        >>> with no_transformers_bars():
        ...     pass
    """
    try:
        from transformers.utils import logging
    except ImportError:  # nothing to silence
        yield
        return
    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            logging.enable_progress_bar()
