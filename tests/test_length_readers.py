"""Lengths from Megatron index files and folders of Parquet shards."""

import shutil
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthwise.planning.lengths import LengthError, load_lengths, open_lengths
from lengthwise.planning.readers import megatron_lengths, parquet_folder_lengths

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("name", ["megatron_int32", "megatron_uint16"])
def test_megatron_index_written_by_megatron_core(name):
    expected = np.load(DATA / f"{name}.lengths.npy")
    lens = megatron_lengths(DATA / f"{name}.idx")
    assert isinstance(lens, np.memmap) and lens.dtype == np.int32
    np.testing.assert_array_equal(lens, expected)
    np.testing.assert_array_equal(megatron_lengths(DATA / name), expected)  # the prefix
    np.testing.assert_array_equal(load_lengths(str(DATA / f"{name}.idx")), expected)
    assert isinstance(open_lengths(str(DATA / f"{name}.idx")), np.memmap)


def test_megatron_index_errors(tmp_path):
    src = (DATA / "megatron_int32.idx").read_bytes()
    bad = tmp_path / "bad.idx"
    bad.write_bytes(b"NOTANIDX" + src[8:])
    with pytest.raises(LengthError, match="not a Megatron index"):
        megatron_lengths(bad)
    bad.write_bytes(src[:9] + struct.pack("<Q", 2) + src[17:])
    with pytest.raises(LengthError, match="version 2"):
        megatron_lengths(bad)
    bad.write_bytes(src[:100])
    with pytest.raises(LengthError, match="truncated"):
        megatron_lengths(bad)
    # an index beside the wrong .bin
    shutil.copy(DATA / "megatron_int32.idx", tmp_path / "pair.idx")
    shutil.copy(DATA / "megatron_uint16.bin", tmp_path / "pair.bin")
    with pytest.raises(LengthError, match="not one data set"):
        megatron_lengths(tmp_path / "pair.idx")
    with pytest.raises(FileNotFoundError, match="no Megatron index"):
        megatron_lengths(tmp_path / "missing")


def _shards(folder, parts):
    folder.mkdir(exist_ok=True)
    for i, part in enumerate(parts):
        pq.write_table(pa.table(part), folder / f"part-{i:05d}.parquet")


def test_parquet_folder_in_file_order_and_into_npy(tmp_path):
    rng = np.random.default_rng(0)
    parts = [{"length": rng.integers(1, 900, n), "ids": [[0] * int(k) for k in
                                                           rng.integers(1, 9, n)]}
             for n in (1000, 1, 2500, 333)]
    _shards(tmp_path / "ds", parts)
    want = np.concatenate([p["length"] for p in parts])
    got = parquet_folder_lengths(tmp_path / "ds", "length", batch_rows=256)
    np.testing.assert_array_equal(got, want)
    token_lists = parquet_folder_lengths(tmp_path / "ds", "ids")
    np.testing.assert_array_equal(token_lists, [len(x) for p in parts for x in p["ids"]])
    out = parquet_folder_lengths(tmp_path / "ds", "length", out=tmp_path / "lens.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "lens.npy"), want)
    assert isinstance(out, np.memmap)
    np.testing.assert_array_equal(load_lengths(f"{tmp_path / 'ds'}:length"), want)


def test_parquet_folder_errors_name_the_shard_and_row(tmp_path):
    _shards(tmp_path / "ds", [{"n": [1, 2]}, {"n": pa.array([3, None, 5])}])
    with pytest.raises(LengthError, match=r"part-00001.parquet, row 1: 'n' is missing"):
        parquet_folder_lengths(tmp_path / "ds", "n")
    _shards(tmp_path / "neg", [{"n": [1, -2]}])
    with pytest.raises(LengthError, match=r"part-00000.parquet, row 1: -2"):
        parquet_folder_lengths(tmp_path / "neg", "n")
    with pytest.raises(LengthError, match="no column 'x'"):
        parquet_folder_lengths(tmp_path / "neg", "x")
    with pytest.raises(FileNotFoundError, match="no .parquet files"):
        parquet_folder_lengths(tmp_path / "nothing", "n")
    with pytest.raises(LengthError, match="FOLDER:COLUMN|COLUMN"):
        load_lengths(str(tmp_path / "neg"))
