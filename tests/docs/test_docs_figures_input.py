"""`benchmarks/docs_figures.py` on a missing or cut JSON file: one line naming it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script():
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("docs_figures",
                                                  ROOT / "benchmarks" / "docs_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value.code)
    assert "\n" not in text and text.startswith("docs_figures: ")
    return text


def test_a_cut_saved_file_is_named_by_render_and_check(script, tmp_path, monkeypatch):
    whole = script.SAVED.read_text(encoding="utf-8")
    cut = tmp_path / "DOCS_FIGURES.json"
    cut.write_text(whole[: len(whole) // 2], encoding="utf-8")
    monkeypatch.setattr(script, "SAVED", cut)
    for argv in (["--render"], ["--check"]):
        with pytest.raises(SystemExit) as exc:
            script.main(argv)
        assert f"{cut}: not a readable JSON file (the saved figures" in _one_line(exc)


def test_a_missing_saved_file_is_named_by_render_and_check(script, tmp_path, monkeypatch):
    monkeypatch.setattr(script, "SAVED", tmp_path / "none.json")
    for argv in (["--render"], ["--check"]):
        with pytest.raises(SystemExit) as exc:
            script.main(argv)
        assert f"{tmp_path / 'none.json'}: no such file" in _one_line(exc)


def test_check_of_a_task_never_saved_stops_before_running_it(script, tmp_path, monkeypatch):
    (tmp_path / "saved.json").write_text('{"lm": {}}', encoding="utf-8")
    monkeypatch.setattr(script, "SAVED", tmp_path / "saved.json")
    monkeypatch.setattr(script, "run_task", lambda *a, **k: pytest.fail("ran the demo"))
    with pytest.raises(SystemExit) as exc:
        script.main(["--check", "--tasks", "dflash"])
    assert "holds no figures of task(s) dflash" in _one_line(exc)


def test_a_missing_or_cut_summary_from_an_earlier_run_is_named(script, tmp_path, monkeypatch):
    monkeypatch.setattr(script, "SAVED", tmp_path / "saved.json")
    with pytest.raises(SystemExit) as exc:
        script.main(["--from", str(tmp_path), "--tasks", "lm"])
    assert "lm/summary.json: no such file (the lm demo's summary from --from)" in _one_line(exc)
    (tmp_path / "lm").mkdir()
    (tmp_path / "lm" / "summary.json").write_text('{"strategies": {"sorted": {"tok',
                                                  encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        script.main(["--from", str(tmp_path), "--tasks", "lm"])
    assert "summary.json: not a readable JSON file" in _one_line(exc)
    assert not (tmp_path / "saved.json").exists()
