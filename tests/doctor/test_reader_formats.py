"""Log files the doctor meets in the wild: a compact trainer_state.json, decimal commas."""

from __future__ import annotations

import json

import pytest

from lengthwise.doctor.errors import EmptyLogError
from lengthwise.doctor.readers import read_log


def _losses(n=40):
    return [3.0 - 0.01 * i for i in range(n)]


@pytest.mark.parametrize("indent", [None, 2])
def test_trainer_state_json_on_one_line_or_many_is_read(tmp_path, indent):
    losses = _losses()
    state = {"global_step": len(losses),
             "log_history": [{"step": i + 1, "loss": v} for i, v in enumerate(losses)]}
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(state, indent=indent))
    log = read_log(path)
    assert log.input.format == "trainer_state"
    assert log.loss.tolist() == losses


@pytest.mark.parametrize("header,row", [("step;loss", "{i};{v}"), ("step,loss", '{i},"{v}"')])
def test_decimal_comma_csv_is_refused_saying_so(tmp_path, header, row):
    path = tmp_path / "log.csv"
    lines = [header] + [row.format(i=i, v=f"{v:.4f}".replace(".", ","))
                        for i, v in enumerate(_losses())]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(EmptyLogError) as err:
        read_log(path)
    msg = str(err.value)
    assert "line 2" in msg and "'3,0000'" in msg and "decimal comma" in msg
    assert "\n" not in msg
