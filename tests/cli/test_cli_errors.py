"""The command line's two kinds of failure: a user error is one line (exit 2), a bug is not.

A user error is a :class:`~lengthwise.errors.LengthwiseError` or the ``OSError``
of a file the user named; anything else is a bug of lengthwise: its traceback,
then one line saying so (exit 1).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import lengthwise.cli.plan as plan_cli
from lengthwise.cli import is_user_error, main
from lengthwise.errors import ConfigError, DataError, MissingDependencyError


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_a_bad_option_value_is_one_line_and_exit_2(capsys):
    assert main(["plan", "coqa", "--max-tokens", "0"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("lengthwise plan: error: ") and "max_tokens" in line


def test_a_missing_file_is_one_line_naming_it(tmp_path, capsys):
    missing = tmp_path / "nowhere.npy"
    assert main(["plan", str(missing)]) == 2
    assert str(missing) in _one_line(capsys.readouterr().err)


def test_a_folder_given_as_a_file_is_one_line(tmp_path, capsys):
    assert main(["plan", "coqa", "--out", str(tmp_path)]) == 2
    assert "is a folder" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("exc", [ValueError("bad shape"), KeyError("bucket"),
                                 TypeError("not a number"), IndexError("index 9"),
                                 OSError("no filename")])
def test_an_internal_error_shows_its_traceback_and_says_it_is_a_bug(exc, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise exc

    monkeypatch.setattr(plan_cli, "_plan_with_recomposition", broken)
    assert main(["plan", "coqa", "--max-tokens", "4096"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "in broken" in err  # the frame that raised
    last = err.strip().splitlines()[-1]
    assert last.startswith("lengthwise plan: internal error: ")
    assert "bug in lengthwise" in last and "report it" in last


def test_a_user_error_raised_inside_is_still_one_line(monkeypatch, capsys):
    def refused(*args, **kwargs):
        raise DataError("row 7 of lengths.npy: length -1 is negative")

    monkeypatch.setattr(plan_cli, "_plan_with_recomposition", refused)
    assert main(["plan", "coqa"]) == 2
    assert _one_line(capsys.readouterr().err) == (
        "lengthwise plan: error: row 7 of lengths.npy: length -1 is negative")


def test_which_errors_are_the_users():
    assert all(is_user_error(e) for e in (
        ConfigError("x"), DataError("x"), MissingDependencyError("pip install x"),
        FileNotFoundError(2, "No such file or directory", "a.npy"),
        PermissionError(13, "Permission denied", "a.npy"),
        IsADirectoryError(21, "Is a directory", "a"),
        NotADirectoryError(20, "Not a directory", "a/b"),
        FileNotFoundError("no file 'a.npy' and no bundled distribution of that name"),
        OSError(28, "No space left on device", "out.npz")))
    assert not any(is_user_error(e) for e in (
        ValueError("x"), KeyError("x"), TypeError("x"), RuntimeError("x"),
        IndexError("x"), OSError(5, "Input/output error")))


def test_the_console_entry_point_exits_with_the_same_status(tmp_path):
    run = subprocess.run([sys.executable, "-m", "lengthwise", "plan", str(tmp_path / "x.npy")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "x.npy" in _one_line(run.stderr)


@pytest.mark.parametrize("module, extra", [("torch", "torch"), ("matplotlib.pyplot", "plots")])
def test_an_optional_package_that_is_missing_is_one_line_naming_the_extra(
        module, extra, monkeypatch, capsys):
    def needs(*args, **kwargs):
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)

    monkeypatch.setattr(plan_cli, "_plan_with_recomposition", needs)
    assert main(["plan", "coqa"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.endswith(f'{module.split(".")[0]} is not installed: pip install -e ".[{extra}]" '
                         "(from a checkout of lengthwise)")


def test_a_missing_module_of_lengthwise_itself_is_a_bug(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'lengthwise.gone'", name="lengthwise.gone")

    monkeypatch.setattr(plan_cli, "_plan_with_recomposition", broken)
    assert main(["plan", "coqa"]) == 1
    assert "bug in lengthwise" in capsys.readouterr().err


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(plan_cli, "_plan_with_recomposition", stopped)
    assert main(["plan", "coqa"]) == 130
    assert _one_line(capsys.readouterr().err) == "lengthwise plan: interrupted"


def test_a_real_sigint_stops_the_command_in_one_line():
    import signal

    code = ("import sys, time\n"
            "import lengthwise.cli.plan as p\n"
            "from lengthwise.cli import main\n"
            "def slow(*a, **k):\n"
            "    print('ready', flush=True)\n"
            "    time.sleep(120)\n"
            "p._plan_with_recomposition = slow\n"
            "sys.exit(main(['plan', 'coqa']))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            # a Ctrl-C reaches it even where this run ignores SIGINT (a
                            # background job of a shell without job control)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert _one_line(err) == "lengthwise plan: interrupted"


def test_the_dflash_demo_names_a_missing_package_of_its_extra_before_any_work(
        tmp_path, monkeypatch, capsys):
    import importlib

    demo_cli = importlib.import_module("lengthwise.cli.demo")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as in an install of the demo extra only

    def started(*args, **kwargs):
        raise AssertionError("the demo started before its packages were checked")

    monkeypatch.setattr("lengthwise.demo.dflash.run_dflash_demo", started)
    assert demo_cli.DFLASH_NEEDS == ("pyarrow",)
    assert main(["demo", "--task", "dflash", "--out", str(tmp_path / "out"),
                 "--cache-dir", str(tmp_path / "cache")]) == 2
    assert _one_line(capsys.readouterr().err).endswith(
        'pyarrow is not installed: pip install -e ".[dflash]" (from a checkout of lengthwise)')
