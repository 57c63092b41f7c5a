"""The figures of ``lengthwise dflash eval`` as a text table (torch-free).

The command and the demo print the same table from the same rows.
"""

from __future__ import annotations

from typing import Any

__all__ = ["render_eval"]


def render_eval(rows: list[dict[str, Any]]) -> str:
    """Rows of :func:`~lengthwise.dflash.evaluate.evaluate_set` as a table, a line per set and T.

    Example::

        >>> print(render_eval([{"set": "chat", "temperature": 0.0, "prompts": 2, "new_tokens": 9,
        ...                     "acceptance_length": 2.25, "draft_accuracy": 0.5,
        ...                     "mismatches": 0}]))
        set | T | prompts | new tokens | acceptance length | draft accuracy | lossless
        chat | 0 | 2 | 9 | 2.25 | 0.500 | yes
    """
    head = ("set", "T", "prompts", "new tokens", "acceptance length", "draft accuracy",
            "lossless")
    lines = [" | ".join(head)]
    for r in rows:
        acc = r.get("draft_accuracy")
        if "mismatches" in r:
            lossless = "yes" if r["mismatches"] == 0 else f"no ({r['mismatches']} differ)"
        else:
            lossless = "-"
        lines.append(" | ".join([
            r["set"], f"{r['temperature']:g}", str(r["prompts"]), str(r["new_tokens"]),
            f"{r['acceptance_length']:.2f}", "-" if acc is None else f"{acc:.3f}", lossless]))
    return "\n".join(lines)
