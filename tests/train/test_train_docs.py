"""The complete loop in docs/training.md runs, resumes, and writes what the page says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

DOC = Path(__file__).resolve().parents[2] / "docs" / "training.md"


def _loop_source() -> str:
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    return next(b for b in blocks if "while step <" in b)


def test_the_documented_loop_runs_and_resumes(tmp_path, monkeypatch):
    source = _loop_source().replace("run_dir = Path(tempfile.mkdtemp())", "run_dir = RUN_DIR")
    first: dict = {"RUN_DIR": tmp_path}
    exec(compile(source, str(DOC), "exec"), first)  # noqa: S102 - our own documentation
    lines = [json.loads(x) for x in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "event" not in x]
    assert [s["step"] for s in steps] == list(range(1, 31))
    assert all(s["micro_batches"] == 4 and s["corrected_loss"] is not None for s in steps)
    names = {x["event"] for x in lines if "event" in x}
    assert {"checkpoint_begin", "checkpoint_end", "checkpoint_written"} <= names
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert checkpoints == ["step_20", "step_30"]

    # run it again: it resumes at step 30 and has nothing left to do
    second: dict = {"RUN_DIR": tmp_path}
    exec(compile(source, str(DOC), "exec"), second)  # noqa: S102
    assert second["step"] == 30
    assert second["guard"].checked == first["guard"].checked == 30  # its window came back
    after = (tmp_path / "train_log.jsonl").read_text().splitlines()
    assert len(after) == len(lines)
