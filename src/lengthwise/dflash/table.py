"""The figures of ``lengthwise dflash eval`` as a text table (torch-free).

The command and the demo print the same table from the same rows. A row's
acceptance length is shown with its 95 % interval over prompts; ``expected`` is the
expected acceptance from ``1 - TV(p_draft, p_target)``; ``prompt lookup`` the baseline's
acceptance length; ``combined`` the combined proposer's (prompt lookup where it finds a match,
the draft elsewhere); ``conditional acceptance`` the share of verifications that kept block
position ``k`` among those that kept ``k - 1``, for ``k = 1 .. B - 1``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["render_eval", "render_settings"]


def _num(value: Any, fmt: str) -> str:
    """``value`` formatted, ``-`` when missing or not a number."""
    if value is None or value != value:  # None or nan
        return "-"
    return format(value, fmt)


def _acceptance(row: dict[str, Any], key: str) -> str:
    """A mean with its interval, ``2.25 [2.01, 2.49]``."""
    iv = row.get(key.replace("length", "interval")) or [None, None]
    text = _num(row.get(key), ".2f")
    if text != "-" and None not in iv:
        text += f" [{iv[0]:.2f}, {iv[1]:.2f}]"
    return text


def render_settings(settings: dict[str, Any]) -> str:
    """One line naming what the figures depend on (template, thinking, block size, engine).

    Example::

        >>> render_settings({"template": "chatml", "thinking": "off", "block_size": 16})
        'template: chatml | thinking: off | block_size: 16'
    """
    return " | ".join(f"{k}: {v}" for k, v in settings.items())


def render_eval(rows: list[dict[str, Any]], settings: dict[str, Any] | None = None) -> str:
    """Rows of :func:`~lengthwise.dflash.evaluate.evaluate_set` as a table, a line per set and T.

    ``settings`` (:func:`render_settings`) come first when given.

    Example::

        >>> print(render_eval([{"set": "chat", "temperature": 0.0, "prompts": 2, "new_tokens": 9,
        ...                     "acceptance_length": 2.25, "acceptance_interval": [2.0, 2.5],
        ...                     "expected_acceptance": 2.1, "baseline_acceptance_length": 1.2,
        ...                     "conditional_acceptance": [0.8, 0.5, None],
        ...                     "draft_accuracy": 0.5, "mismatches": 0}]))
        set | T | prompts | new tokens | acceptance length | expected | prompt lookup | \
combined | draft accuracy | lossless | conditional acceptance
        chat | 0 | 2 | 9 | 2.25 [2.00, 2.50] | 2.10 | 1.20 | - | 0.500 | yes | 0.80 0.50 -
    """
    head = ("set", "T", "prompts", "new tokens", "acceptance length", "expected",
            "prompt lookup", "combined", "draft accuracy", "lossless",
            "conditional acceptance")
    lines = [render_settings(settings)] if settings else []
    lines.append(" | ".join(head))
    for r in rows:
        differ = r.get("mismatches", 0) + r.get("combined_mismatches", 0)
        if "mismatches" in r:
            lossless = "yes" if differ == 0 else f"no ({differ} differ)"
        else:
            lossless = "-"
        cond = " ".join(_num(c, ".2f") for c in r.get("conditional_acceptance") or []) or "-"
        lines.append(" | ".join([
            r["set"], f"{r['temperature']:g}", str(r["prompts"]), str(r["new_tokens"]),
            _acceptance(r, "acceptance_length"), _num(r.get("expected_acceptance"), ".2f"),
            _acceptance(r, "baseline_acceptance_length"),
            _acceptance(r, "combined_acceptance_length"),
            _num(r.get("draft_accuracy"), ".3f"), lossless, cond]))
    return "\n".join(lines)
