"""Length readers refuse values int64 cannot hold instead of writing them wrapped."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from lengthwise.planning.errors import LengthError  # noqa: E402
from lengthwise.planning.lengths import load_lengths  # noqa: E402
from lengthwise.planning.readers import parquet_folder_lengths  # noqa: E402


@pytest.mark.parametrize("values,kind", [([4, 2**63 + 5], pa.uint64()),
                                         ([4.0, 2.0**64], pa.float64()),
                                         ([4.0, 2.0**63], pa.float64())])
def test_a_parquet_folder_length_from_2_pow_63_is_refused_naming_shard_and_row(
        tmp_path, values, kind):
    pq.write_table(pa.table({"n": pa.array([3, 5], kind)}), tmp_path / "part-0.parquet")
    pq.write_table(pa.table({"n": pa.array(values, kind)}), tmp_path / "part-1.parquet")
    for read in (lambda: parquet_folder_lengths(tmp_path, "n"),
                 lambda: parquet_folder_lengths(tmp_path, "n", out=tmp_path / "l.npy"),
                 lambda: load_lengths(f"{tmp_path}:n")):
        with pytest.raises(LengthError, match=r"part-1\.parquet, row 1: .* too large"):
            read()
    assert not (tmp_path / "l.npy").exists()


def test_the_largest_int64_length_is_kept(tmp_path):
    pq.write_table(pa.table({"n": pa.array([4, 2**63 - 1], pa.uint64())}),
                   tmp_path / "part-0.parquet")
    assert parquet_folder_lengths(tmp_path, "n").tolist() == [4, 2**63 - 1]
