"""`lengthwise plan` inputs that cannot mean what they say are refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from lengthwise.cli import main


def _err(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("suffix", ["npy", "txt"])
def test_a_column_of_a_file_without_columns_is_refused(tmp_path, capsys, suffix):
    path = tmp_path / f"lens.{suffix}"
    if suffix == "npy":
        np.save(path, np.arange(1, 50))
    else:
        path.write_text("\n".join(str(i) for i in range(1, 50)))
    assert main(["plan", f"{path}:column", "--max-tokens", "256"]) == 2
    line = _err(capsys)
    assert f"{path}" in line and "'column'" in line and "without ':column'" in line


@pytest.mark.parametrize("value,named", [("-5,100", "got -5 in buckets=[-5, 100]"),
                                         ("0,100", "got 0"), ("-3", "got -3"), ("0", "got 0")])
def test_buckets_below_one_are_refused_by_name(tmp_path, capsys, value, named):
    path = tmp_path / "lens.npy"
    np.save(path, np.arange(1, 50))
    with pytest.raises(SystemExit) as code:
        main(["plan", str(path), "--buckets", value])
    assert code.value.code == 2
    line = _err(capsys)
    assert "argument --buckets" in line and named in line
    assert "expected one argument" not in line
