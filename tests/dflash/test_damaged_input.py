"""Damaged input to ``dflash prepare``, ``train`` and ``eval``: one line naming the file, exit 2.

Each case is a real damaged file (cut short, bytes flipped, a byte that is not UTF-8)
or a full disk (an ``OSError`` ENOSPC from the Parquet writer); nothing half-written
is left as if complete.
"""

from __future__ import annotations

import errno
import gzip
import json
import shutil

import numpy as np
import pytest
from _chat_tiny import conversations, write_jsonl
from _cli import TINY_TRAIN

from lengthwise.cli import main
from lengthwise.errors import DataError

torch = pytest.importorskip("torch")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _error(capsys) -> str:
    """The one stderr line of a command that failed on bad input."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def _prepare(source, target, out) -> int:
    return main(["dflash", "prepare", str(source), "--target", str(target), "--out", str(out),
                 "--min-supervised", "16", "--no-progress"])


def _cut(path, share: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * share)])


def _flip(path, start: int, stop: int) -> None:
    data = bytearray(path.read_bytes())
    for i in range(start, stop):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def _rows(n: int = 40) -> list[dict]:
    return conversations(n, seed=2)


def _gz(path, rows):
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    return path


def _parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=5)
    return path


def _non_utf8(path, rows):
    with open(path, "wb") as fh:
        for r in rows[:2]:
            fh.write((json.dumps(r) + "\n").encode())
        fh.write(b'{"messages": [{"role": "user", "content": "caf\xe9"}, '
                 b'{"role": "assistant", "content": "the cat sat"}]}\n')
    return path


def _raw_row(path, rows, row: bytes):
    """Two good rows, then ``row`` as it is."""
    path.write_bytes(b"".join((json.dumps(r) + "\n").encode() for r in rows[:2]) + row + b"\n")
    return path


def _datasets_folder(path, rows):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    _cut(sorted(path.glob("*.arrow"))[0])
    return path


@pytest.mark.parametrize(("name", "make", "said"), [
    ("bad.jsonl", _non_utf8, "bad.jsonl row 2 (line 3): not UTF-8 text (byte 0xe9"),
    ("cut.jsonl.gz", lambda p, r: (_gz(p, r), _cut(p, 0.6))[0],
     "cut.jsonl.gz: cannot be read to its end, damaged or cut short"),
    ("flipped.jsonl.gz", lambda p, r: (_gz(p, r), _flip(p, 200, 230))[0],
     "flipped.jsonl.gz: cannot be read to its end, damaged or cut short"),
    ("cut.parquet", lambda p, r: (_parquet(p, r), _cut(p, 0.6))[0],
     "cut.parquet: not a readable Parquet file, damaged or cut short"),
    ("page.parquet", lambda p, r: (_parquet(p, r), _flip(p, 200, 600))[0],
     "page.parquet rows 0-39: the Parquet data cannot be decoded"),
    ("ds", _datasets_folder, "ds: the datasets folder cannot be read"),
    ("surrogate.jsonl", lambda p, r: _raw_row(p, r, b'{"messages": [{"role": "user", "content": '
                                                    b'"a\\ud800b"}, {"role": "assistant", '
                                                    b'"content": "the cat sat"}]}'),
     "surrogate.jsonl row 2 (line 3): the escape \\ud800 is half of a surrogate pair"),
    ("deep.jsonl", lambda p, r: _raw_row(p, r, b'{"messages": ' + b"[" * 100_000
                                         + b"]" * 100_000 + b"}"),
     "deep.jsonl, line 3: JSON nested too deeply to read"),
])
def test_prepare_names_a_damaged_source(tiny_prepared, tmp_path, capsys, name, make, said):
    target, _ = tiny_prepared
    source = make(tmp_path / name, _rows())
    capsys.readouterr()  # the datasets library's own progress bar
    assert _prepare(source, target, tmp_path / "out") == 2
    assert said in _error(capsys)
    assert not (tmp_path / "out" / "prepare.json").exists()


def test_a_template_past_the_sandbox_s_limits_is_named(tiny_prepared, tmp_path, capsys):
    target, _ = tiny_prepared
    looping = shutil.copytree(target, tmp_path / "looping")
    (looping / "chat_template.jinja").write_text("{% for i in range(10**9) %}x{% endfor %}")
    chats = write_jsonl(tmp_path / "chats.jsonl", _rows(4))
    assert _prepare(chats, looping, tmp_path / "out") == 2
    assert _error(capsys).endswith(f"the chat template of --target {looping} cannot render an "
                                   "assistant turn (Range too big. The sandbox blocks ranges "
                                   "larger than MAX_RANGE (100000).)")


def test_a_byte_order_mark_before_the_first_row_is_no_damage(tiny_prepared, tmp_path):
    from lengthwise.dflash.chat_files import count_rows, read_conversations

    rows = _rows(3)
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in rows).encode())
    assert count_rows(path) == 3
    assert [raw for _, _, raw in read_conversations(path)] == [r["messages"] for r in rows]


def test_a_full_disk_while_writing_a_shard_names_it_and_leaves_no_shard(
        tiny_prepared, tmp_path, capsys, monkeypatch):
    target, _ = tiny_prepared
    chats = write_jsonl(tmp_path / "chats.jsonl", _rows())

    def full(table, where, **kw):
        with open(where, "wb") as fh:
            fh.write(b"PAR1 half a shard")
        raise OSError(errno.ENOSPC, "No space left on device")  # no file name, as Arrow's

    monkeypatch.setattr(pq, "write_table", full)
    out = tmp_path / "out"
    assert _prepare(chats, target, out) == 2
    line = _error(capsys)
    assert line.startswith(f"lengthwise dflash: error: writing data-00000.parquet into {out} "
                           "failed: the disk is full (no space left on the device)")
    assert sorted(p.name for p in out.iterdir()) == []  # no shard, no record, no temporary


def _copy(prepared, tmp_path):
    copy = tmp_path / "prepared"
    shutil.copytree(prepared, copy)
    return copy


@pytest.mark.parametrize("damage", ["cut", "flip"])
def test_train_names_a_damaged_shard(tiny_prepared, tmp_path, capsys, damage):
    target, prepared = tiny_prepared
    data = _copy(prepared, tmp_path)
    shard = data / "data-00001.parquet"
    _cut(shard) if damage == "cut" else _flip(shard, 100, 400)
    assert main(["dflash", "train", "--target", str(target), "--data", str(data), "--out",
                 str(tmp_path / "run"), "--steps", "2", *TINY_TRAIN]) == 2
    line = _error(capsys)
    assert "shard data-00001.parquet is damaged or cut short" in line
    assert not (tmp_path / "run").exists()


def test_lengths_that_disagree_with_the_shards_are_refused(tiny_prepared, tmp_path):
    from lengthwise.dflash.prepared import open_prepared

    _, prepared = tiny_prepared
    data = _copy(prepared, tmp_path)
    lengths = np.load(data / "lengths.npy")
    np.save(data / "lengths.npy", lengths[::-1].copy())  # the same count, other values
    first = int(np.flatnonzero(lengths[::-1] != lengths)[0])
    with pytest.raises(DataError, match=f"lengths.npy: disagrees with the shards at .* the "
                                        f"first sample {first} "):
        open_prepared(data)


def test_a_target_without_tokenizer_files_is_refused_by_name(tiny_prepared, tmp_path, capsys):
    target, data = tiny_prepared
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(target / name, bare / name)
    assert main(["dflash", "train", "--target", str(bare), "--data", str(data), "--out",
                 str(tmp_path / "run"), "--steps", "2", *TINY_TRAIN]) == 2
    assert f"--target {bare}: no tokenizer files there" in _error(capsys)


def test_train_names_a_target_whose_weights_are_cut(tiny_prepared, tmp_path, capsys):
    target, data = tiny_prepared
    cut = tmp_path / "target"
    shutil.copytree(target, cut)
    _cut(cut / "model.safetensors")
    assert main(["dflash", "train", "--target", str(cut), "--data", str(data), "--out",
                 str(tmp_path / "run"), "--steps", "2", *TINY_TRAIN]) == 2
    assert f"--target {cut}: its weights cannot be read" in _error(capsys)


@pytest.fixture
def exported(tmp_path):
    from lengthwise.dflash.export import export_draft
    from lengthwise.dflash.model import DFlashConfig, DFlashDraft

    cfg = DFlashConfig(hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8, block_size=4,
                       target_layers=[2], num_target_layers=4, mask_token_id=321,
                       target_vocab_size=322)
    return export_draft(DFlashDraft(cfg), tmp_path / "draft")


def _eval(target, draft, *extra) -> int:
    return main(["dflash", "eval", "--target", str(target), "--draft", str(draft), "--limit",
                 "1", "--max-new-tokens", "2", "--temperatures", "0", *extra])


def test_eval_names_a_cut_draft_weights_file(tiny_prepared, exported, capsys):
    target, _ = tiny_prepared
    _cut(exported / "model.safetensors")
    assert _eval(target, exported) == 2
    assert f"{exported}/model.safetensors: not a readable safetensors file" in _error(capsys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_eval_on_cuda_without_a_gpu_is_one_line(tiny_prepared, exported, capsys):
    target, _ = tiny_prepared
    assert _eval(target, exported, "--device", "cuda") == 2
    assert "--device cuda: torch sees no CUDA device here" in _error(capsys)
