"""Where lengthwise keeps what it computes once and reuses (lengths, trained tokenizers).

``$LENGTHWISE_CACHE`` wins; otherwise ``$XDG_CACHE_HOME/lengthwise``, else
``~/.cache/lengthwise``.

Example::

    >>> import os
    >>> os.environ["LENGTHWISE_CACHE"] = "/tmp/lw-cache"
    >>> str(cache_dir())
    '/tmp/lw-cache'
    >>> del os.environ["LENGTHWISE_CACHE"]
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """The cache folder (not created)."""
    env = os.environ.get("LENGTHWISE_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lengthwise"
