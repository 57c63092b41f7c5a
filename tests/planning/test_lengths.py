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
    (tmp_path / "deep.jsonl").write_text('{"n": 1}\n{"n": ' + "[" * 100_000 + "]" * 100_000
                                         + "}\n")
    with pytest.raises(LengthError, match="deep.jsonl, line 2: JSON nested too deeply to read"):
        load_lengths(f"{tmp_path}/deep.jsonl:n")
    (tmp_path / "c.jsonl").write_text('{"n": 1}\n{"m": 2}\n')
    with pytest.raises(LengthError, match=r"line 2: no field 'n' \(its fields: 'm'\)"):
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
    assert counts == {"samples": 4, "dropped_empty": 1, "truncated": 2, "dropped_overflow": 0,
                      "truncated_tokens": 22, "truncated_share": 22 / 47}
    out, keep, counts = apply_overflow(lens, 10, "drop")
    assert keep.tolist() == [True, False, False, False] and counts["dropped_overflow"] == 2
    with pytest.raises(LengthError, match="row 2: length 12 is over max_len=10"):
        apply_overflow(lens, 10, "error")
    with pytest.raises(ValueError, match="on_overflow"):
        apply_overflow(lens, 10, "ignore")
    assert load_lengths([5, 12], max_len=10).tolist() == [5, 10]
    with pytest.raises(LengthError):
        load_lengths([5, 12], max_len=10, on_overflow="error")


@pytest.mark.parametrize("values, match", [
    ([1, 1e19], "row 1: 1e\\+19 is too large for a length"),
    (np.array([1, 2**63], dtype=np.uint64), "row 1: 9223372036854775808 is too large"),
    ([3, 2**70], "row 1: 1180591620717411303424 is too large"),
    ([3, -2**70], "row 1: -1180591620717411303424 is negative"),
    (np.array(["2020-01-01"], dtype="datetime64[D]"), "dtype datetime64"),
    (np.array([5], dtype="timedelta64[s]"), "dtype timedelta64"),
    ((n for n in [1, 2]), "got a generator; pass list"),
    ({1, 2}, "got a set, which has no row order"),
    ({1: 2}, "got a dict, which has no row order"),
    (5, "got the single value 5"),
    ([1, "a"], "must be numbers"),
    (np.array([1, None], dtype=object), "row 1: None is not a number"),
])
def test_lengths_that_do_not_fit_int64_or_are_not_lengths(values, match):
    with pytest.raises(LengthError, match=match):
        load_lengths(values)


def test_huge_values_in_files_name_the_row(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"n": 3}\n{"n": 1.2e29}\n')
    (tmp_path / "b.jsonl").write_text('{"n": 123456789012345678901234567890}\n')
    (tmp_path / "c.jsonl").write_text('{"n": 3}\n{"n": {"tokens": 5}}\n')
    (tmp_path / "d.txt").write_text("3\n99999999999999999999\n")
    with pytest.raises(LengthError, match="row 1: 1.2e\\+29 is too large"):
        load_lengths(f"{tmp_path}/a.jsonl:n")
    with pytest.raises(LengthError, match="b.jsonl, line 1: field 'n' is 1234.* too large"):
        load_lengths(f"{tmp_path}/b.jsonl:n")
    with pytest.raises(LengthError, match="c.jsonl, line 2: field 'n' is {'tokens': 5}, not a"):
        load_lengths(f"{tmp_path}/c.jsonl:n")
    with pytest.raises(LengthError, match="row 1: 99999999999999999999 is too large"):
        load_lengths(tmp_path / "d.txt")


def test_binary_txt_and_folders_name_the_path(tmp_path):
    (tmp_path / "bin.txt").write_bytes(b"1\n\xff\xfe\x00\x01")
    with pytest.raises(LengthError, match="bin.txt: not UTF-8 text"):
        load_lengths(tmp_path / "bin.txt")
    with pytest.raises(LengthError, match="is a folder"):
        load_lengths(tmp_path)


def test_a_file_here_named_like_a_bundled_set_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "coqa").write_text("3\n4\n")
    with pytest.raises(LengthError, match="also the name of a bundled distribution"):
        load_lengths("coqa")  # read as the user's file (no extension: unreadable)
    (tmp_path / "coqa").unlink()
    assert load_lengths("coqa").size == 700  # no file here: the bundled set


def test_load_lengths_records_what_max_len_cut():
    lens = load_lengths([10, 70000, 3, 9000], max_len=8192)
    assert lens.tolist() == [10, 8192, 3, 8192] and lens.cut.tolist() == [0, 61808, 0, 808]
    again = load_lengths(lens, max_len=100)  # a second cut adds up
    assert again.cut.tolist() == [0, 61808 + 8092, 0, 808 + 8092]
    assert load_lengths(lens).cut is lens.cut  # reading it again keeps the record
    import pickle

    assert pickle.loads(pickle.dumps(lens)).cut.tolist() == lens.cut.tolist()
    assert getattr(lens[:2], "cut", None) is None  # a slice is plain lengths
    out, keep, counts = apply_overflow(np.asarray(lens), 9000, cut=lens.cut)
    assert counts["truncated"] == 2 and counts["truncated_tokens"] == 61808 + 808
    assert counts["truncated_share"] == pytest.approx((61808 + 808) / 79013)


@pytest.mark.parametrize("max_len, exc", [(2.5, TypeError), (True, TypeError), (0, ValueError),
                                          ("8", TypeError)])
def test_max_len_is_a_whole_number(max_len, exc):
    with pytest.raises(exc, match="max_len"):
        load_lengths([5, 12], max_len=max_len)
