"""Lengths from Megatron index files and folders of Parquet shards."""

import shutil
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthwise.errors import ConfigError
from lengthwise.planning.lengths import LengthError, load_lengths, open_lengths
from lengthwise.planning.readers import megatron_lengths, parquet_folder_lengths

DATA = Path(__file__).parents[1] / "data"


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


def _spark_like_folder(root):
    """Shards as Spark, Hive and notebooks leave them: hidden and underscore names among data."""
    rng = np.random.default_rng(1)
    names = ["part-00000.snappy.parquet", "part-00001.snappy.parquet", "year=2024/part-0.parquet",
             "_temporary/0/part-00002.parquet", ".ipynb_checkpoints/part-00000-checkpoint.parquet",
             "_hidden.parquet", "sub/_staging/part-9.parquet", "sub/part-3.parquet",
             "part-00002"]  # Parquet without the suffix: pyarrow.dataset reads it too
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"n": rng.integers(1, 500, int(rng.integers(1, 40)))}), path)
    (root / "_SUCCESS").write_bytes(b"")
    (root / ".part-00000.snappy.parquet.crc").write_bytes(b"crc!")
    (root / "sub" / "_SUCCESS").write_bytes(b"")


def test_a_parquet_folder_is_read_as_pyarrow_dataset_reads_it(tmp_path):
    import pyarrow.dataset as ds

    _spark_like_folder(tmp_path / "ds")
    want = ds.dataset(tmp_path / "ds", format="parquet").to_table(columns=["n"])["n"]
    got = parquet_folder_lengths(tmp_path / "ds", "n", batch_rows=7)
    assert got.size == ds.dataset(tmp_path / "ds", format="parquet").count_rows()
    np.testing.assert_array_equal(got, want.to_numpy())
    np.testing.assert_array_equal(load_lengths(f"{tmp_path / 'ds'}:n"), want.to_numpy())
    # a file that is not Parquet (a README) is not data: passed over, the rest read the same
    (tmp_path / "ds" / "README.md").write_text("# shards\n")
    np.testing.assert_array_equal(parquet_folder_lengths(tmp_path / "ds", "n"), want.to_numpy())


def test_a_folder_of_only_hidden_shards_has_no_shards(tmp_path):
    (tmp_path / "ds").mkdir()
    _shards(tmp_path / "ds" / "_temporary", [{"n": [1, 2]}])
    with pytest.raises(FileNotFoundError, match="no .parquet files.*skipped"):
        parquet_folder_lengths(tmp_path / "ds", "n")
    with pytest.raises(FileNotFoundError, match="no such folder"):
        parquet_folder_lengths(tmp_path / "missing", "n")


def test_a_failed_out_leaves_no_complete_looking_file(tmp_path):
    _shards(tmp_path / "ds", [{"n": [1, 2]}, {"n": [3, 4]}, {"n": pa.array([5, None])}])
    out = tmp_path / "lengths.npy"
    with pytest.raises(LengthError, match=r"part-00002.parquet, row 1"):
        parquet_folder_lengths(tmp_path / "ds", "n", out=out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no .npy, no temporary
    np.save(out, np.array([9, 9]))  # an earlier good output survives a failed rewrite
    with pytest.raises(LengthError, match=r"part-00002.parquet, row 1"):
        parquet_folder_lengths(tmp_path / "ds", "n", out=out)
    assert np.load(out).tolist() == [9, 9]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "lengths.npy"]
    _shards(tmp_path / "ds", [{"n": [1, 2]}, {"n": [3, 4]}, {"n": [5, 6]}])
    got = parquet_folder_lengths(tmp_path / "ds", "n", out=out)
    assert np.load(out).tolist() == got.tolist() == [1, 2, 3, 4, 5, 6]


def test_a_bad_shard_is_named_with_the_reason(tmp_path):
    _shards(tmp_path / "drift", [{"n": [1, 2]}, {"m": [3]}])
    with pytest.raises(LengthError, match=r"part-00001.parquet has no column 'n' \(columns: "
                                          r"\['m'\]\); every shard"):
        parquet_folder_lengths(tmp_path / "drift", "n")
    _shards(tmp_path / "cut", [{"n": [1, 2]}, {"n": [3, 4]}])
    shard = tmp_path / "cut" / "part-00001.parquet"
    shard.write_bytes(shard.read_bytes()[:40])
    with pytest.raises(LengthError, match="part-00001.parquet is not a readable Parquet file"):
        parquet_folder_lengths(tmp_path / "cut", "n")
    _shards(tmp_path / "good", [{"n": [1, 2]}])
    with pytest.raises(ConfigError, match="there is no folder"):
        parquet_folder_lengths(tmp_path / "good", "n", out=tmp_path / "no" / "lengths.npy")
    with pytest.raises(ConfigError, match="it is a folder"):
        parquet_folder_lengths(tmp_path / "good", "n", out=tmp_path / "drift")
