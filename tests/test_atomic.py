"""Output files are written whole or not at all."""

import numpy as np
import pytest

from lengthwise.atomic import atomic_open, atomic_path


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, error):
    target = tmp_path / "plan.npz"
    target.write_bytes(b"old")
    with pytest.raises(type(error)), atomic_open(target) as fh:
        fh.write(b"new, half written")
        raise error
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.npz"]


def test_a_writer_that_takes_a_name_keeps_the_suffix_and_replaces_the_file(tmp_path):
    target = tmp_path / "lengths.npy"
    for values in ([1, 2], [3]):
        with atomic_path(target) as tmp:
            assert tmp.parent == tmp_path and tmp.name.startswith(".") and tmp.suffix == ".npy"
            np.save(tmp, np.array(values))  # np.save would add ".npy" to another suffix
        assert np.load(target).tolist() == values
    assert [p.name for p in tmp_path.iterdir()] == ["lengths.npy"]


def test_a_writer_that_wrote_nothing_publishes_nothing(tmp_path):
    with pytest.raises(FileNotFoundError), atomic_path(tmp_path / "x.png"):
        pass
    assert list(tmp_path.iterdir()) == []


def test_only_whole_file_modes_are_accepted(tmp_path):
    with pytest.raises(ValueError, match="mode must start with 'w'"), \
            atomic_open(tmp_path / "log.jsonl", "a"):
        pass
