"""Reading lengths from every supported source, and the errors for bad input."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthwise import bundled_names, load_lengths
from lengthwise.planning.lengths import LengthError, apply_overflow


def test_arrays_and_lists():
    assert load_lengths([3, 1, 2]).tolist() == [3, 1, 2]
    assert load_lengths(np.array([3.0, 4.0])).dtype == np.int64


def test_bundled_distributions_with_provenance():
    names = bundled_names()
    assert {"sft_mix", "evals_capped", "pydoc", "linuxdoc"} <= set(names)
    sft = load_lengths("sft_mix")
    assert sft.size == 66_464 and sft.max() == 78_833
    parts = sum(load_lengths(n).size for n in names if n != "sft_mix")
    assert parts == sft.size  # the mix is the other six concatenated


def test_npy_txt_jsonl(tmp_path):
    np.save(tmp_path / "a.npy", np.array([5, 6], dtype=np.int32))
    (tmp_path / "a.txt").write_text("5\n\n6\n")
    rows = [{"n": 5, "ids": [1, 2, 3]}, {"n": 6, "ids": [1]}]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert load_lengths(tmp_path / "a.npy").tolist() == [5, 6]
    assert load_lengths(str(tmp_path / "a.txt")).tolist() == [5, 6]
    assert load_lengths(f"{tmp_path}/a.jsonl:n").tolist() == [5, 6]
    assert load_lengths(f"{tmp_path}/a.jsonl:ids").tolist() == [3, 1]  # token-id lists count


def test_parquet_and_arrow_columns(tmp_path):
    table = pa.table({"length": [10, 20, 30], "input_ids": [[1], [1, 2], [1, 2, 3]]})
    pq.write_table(table, tmp_path / "d.parquet")
    with pa.OSFile(str(tmp_path / "d.arrow"), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    assert load_lengths(f"{tmp_path}/d.parquet:length").tolist() == [10, 20, 30]
    assert load_lengths(f"{tmp_path}/d.parquet:input_ids").tolist() == [1, 2, 3]
    assert load_lengths(f"{tmp_path}/d.arrow:length").tolist() == [10, 20, 30]
    with pytest.raises(LengthError, match="no column 'nope'"):
        load_lengths(f"{tmp_path}/d.parquet:nope")
    with pytest.raises(LengthError, match="name one"):
        load_lengths(f"{tmp_path}/d.parquet")
    pq.write_table(pa.table({"length": [1, None]}), tmp_path / "n.parquet")
    with pytest.raises(LengthError, match="row 1: missing"):
        load_lengths(f"{tmp_path}/n.parquet:length")


@pytest.mark.parametrize(("values", "message"), [
    ([3, -2, 1], r"row 1: -2 is negative"),
    ([3.0, 2.5], r"row 1: 2.5 is not a whole number"),
    ([1.0, float("nan")], r"row 1: nan is not a finite"),
    ([], r"empty"),
    (["a", "b"], r"must be numbers"),
    ([[1, 2], [3, 4]], r"one-dimensional"),
])
def test_bad_values_name_row_and_value(values, message):
    with pytest.raises(LengthError, match=message):
        load_lengths(values)


def test_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="bundled"):
        load_lengths("no_such_distribution")
    (tmp_path / "b.txt").write_text("4\nfour\n")
    with pytest.raises(LengthError, match="line 2: 'four'"):
        load_lengths(tmp_path / "b.txt")
    (tmp_path / "b.jsonl").write_text('{"n": 1}\n{"n": 2\n')
    with pytest.raises(LengthError, match="line 2: not valid JSON"):
        load_lengths(f"{tmp_path}/b.jsonl:n")
    (tmp_path / "c.jsonl").write_text('{"n": 1}\n{"m": 2}\n')
    with pytest.raises(LengthError, match="line 2: no field 'n'"):
        load_lengths(f"{tmp_path}/c.jsonl:n")
    with pytest.raises(LengthError, match="name the field"):
        load_lengths(tmp_path / "c.jsonl")
    (tmp_path / "x.bin").write_bytes(b"\0")
    with pytest.raises(LengthError, match="cannot read"):
        load_lengths(tmp_path / "x.bin")


def test_overflow_policies_are_counted():
    lens = np.array([5, 0, 12, 30])
    out, keep, counts = apply_overflow(lens, 10, "truncate")
    assert out.tolist() == [5, 0, 10, 10] and keep.tolist() == [True, False, True, True]
    assert counts == {"samples": 4, "dropped_empty": 1, "truncated": 2, "dropped_overflow": 0}
    out, keep, counts = apply_overflow(lens, 10, "drop")
    assert keep.tolist() == [True, False, False, False] and counts["dropped_overflow"] == 2
    with pytest.raises(LengthError, match="row 2: length 12 is over max_len=10"):
        apply_overflow(lens, 10, "error")
    with pytest.raises(ValueError, match="on_overflow"):
        apply_overflow(lens, 10, "ignore")
    assert load_lengths([5, 12], max_len=10).tolist() == [5, 10]
    with pytest.raises(LengthError):
        load_lengths([5, 12], max_len=10, on_overflow="error")
