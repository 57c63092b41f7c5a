"""The target's rotary settings, read and written on transformers 4.x and 5.x.

A draft must use the target's rotary settings (Qwen3: ``rope_theta`` 1,000,000).
``transformers`` 4.x keeps them as ``rope_theta`` + ``rope_scaling``, 5.x as one
``rope_parameters`` dict; :func:`rope_settings` reads either, and
:func:`qwen3_config` writes them the way the installed version reads them and
checks that it did (a config that silently fell back to 10,000 is refused).

Example::

    >>> import transformers
    >>> t = transformers.Qwen3Config(hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
    ...                              num_key_value_heads=2, intermediate_size=128, head_dim=16,
    ...                              rope_theta=1e6)
    >>> rope_settings(t)
    {'rope_theta': 1000000.0, 'rope_scaling': None}
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from lengthwise.errors import ConfigError

__all__ = ["qwen3_config", "rope_settings"]

#: keys of a ``rope_parameters`` dict that are not scaling settings
_BASE_KEYS = ("rope_theta", "rope_type", "type")


def rope_settings(config: Any) -> dict[str, Any]:
    """``{"rope_theta", "rope_scaling"}`` of a Hugging Face config, on transformers 4.x or 5.x.

    ``rope_scaling`` is ``None`` for plain RoPE, else the scaling dict with its
    ``rope_type`` (e.g. ``yarn`` and its factors). A config with no rotary base at
    all raises :class:`~lengthwise.errors.ConfigError`.
    """
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        kinds = sorted(params)  # per layer type (full/sliding attention): the full one
        params = params.get("full_attention", params[kinds[0]])
    theta = None
    scaling: dict[str, Any] | None = None
    if isinstance(params, dict) and params.get("rope_theta") is not None:
        theta = params["rope_theta"]
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if theta is None:
        theta = getattr(config, "rope_theta", None)
        old = getattr(config, "rope_scaling", None)
        scaling = dict(old) if isinstance(old, dict) else None
    if theta is None:
        raise ConfigError(f"target config ({type(config).__name__}) has neither rope_theta nor "
                          "rope_parameters: a DFlash draft needs the target's rotary base")
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        scaling = None if kind == "default" and set(scaling) <= set(_BASE_KEYS) else scaling
    return {"rope_theta": float(theta), "rope_scaling": scaling}


def qwen3_config(*, rope_theta: float, rope_scaling: dict[str, Any] | None = None,
                 **sizes: Any) -> Any:
    """A ``Qwen3Config`` with these sizes and rotary settings, on any supported ``transformers``.

    Raises ``RuntimeError`` if the installed version did not keep the rotary base.

    Example::

        >>> c = qwen3_config(rope_theta=5e5, hidden_size=32, num_attention_heads=4,
        ...                  num_key_value_heads=2, head_dim=8, intermediate_size=64,
        ...                  num_hidden_layers=1, vocab_size=1)
        >>> rope_settings(c)["rope_theta"]
        500000.0
    """
    from transformers.models.qwen3.configuration_qwen3 import Qwen3Config

    accepted = inspect.signature(Qwen3Config.__init__).parameters
    if "rope_parameters" in accepted:  # transformers >= 5
        params = {"rope_type": "default", **(rope_scaling or {}), "rope_theta": float(rope_theta)}
        cfg = Qwen3Config(rope_parameters=params, **sizes)
    else:
        cfg = Qwen3Config(rope_theta=float(rope_theta), rope_scaling=rope_scaling, **sizes)
    kept = rope_settings(cfg)
    if not math.isclose(kept["rope_theta"], float(rope_theta), rel_tol=1e-12):
        raise RuntimeError(f"transformers {_version()} kept rope_theta {kept['rope_theta']} "
                           f"instead of {rope_theta}")
    return cfg


def _version() -> str:
    import transformers

    return str(transformers.__version__)
