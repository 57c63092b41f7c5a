"""Prepared data, drafts and targets are matched on their tokenizer and chat template.

``prepare.json`` records the vocabulary size and the tokenizer and template hashes;
``dflash train`` refuses a target of another tokenizer, ``dflash export --target`` and
``dflash eval`` a target other than the draft's (``dflash eval`` also one of other
weights), and a prepare rerun after the target's tokenizer changed prepares its shards again.
"""

from __future__ import annotations

import json
import shutil

import pytest
from _chat_tiny import conversations, write_jsonl
from _cli import TINY_TRAIN

from lengthwise.cli import main
from lengthwise.dflash.prepare import prepare_chats
from lengthwise.dflash.prepare_config import PrepareConfig
from lengthwise.dflash.prepared import open_prepared
from lengthwise.errors import ConfigError

torch = pytest.importorskip("torch")


def _swapped(target, folder):
    """``target`` whose tokenizer gives two ordinary tokens each other's id (same size)."""
    shutil.copytree(target, folder)
    file = folder / "tokenizer.json"
    tok = json.loads(file.read_text())
    vocab = tok["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    a, b = by_id[100], by_id[101]
    vocab[a], vocab[b] = 101, 100
    file.write_text(json.dumps(tok))
    return folder


def _retemplated(target, folder):
    """``target`` (copied to ``folder`` unless it is it) with one more comment in its template."""
    if folder != target:
        shutil.copytree(target, folder)
    file = folder / "chat_template.jinja"
    file.write_text(file.read_text() + "{#- v2 -#}")
    return folder


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def _train(target, data, out) -> int:
    return main(["dflash", "train", "--target", str(target), "--data", str(data), "--out",
                 str(out), "--steps", "2", *TINY_TRAIN])


def test_prepare_records_the_tokenizer(tiny_prepared):
    from lengthwise.dflash.target import load_tokenizer
    from lengthwise.dflash.target_match import tokenizer_record

    target, data = tiny_prepared
    info = open_prepared(data).info
    assert {k: info[k] for k in ("vocab_size", "tokenizer_sha256", "chat_template_sha256")} == (
        tokenizer_record(load_tokenizer(target)))


@pytest.mark.parametrize(("change", "said"), [
    (_swapped, "was prepared with another tokenizer than --target"),
    (_retemplated, "was prepared with another chat template than --target"),
])
def test_train_refuses_a_target_of_another_tokenizer(tiny_prepared, tmp_path, capsys, change,
                                                     said):
    target, data = tiny_prepared
    other = change(target, tmp_path / "other")
    assert _train(other, data, tmp_path / "run") == 2
    line = _error(capsys)
    assert said in line and str(data) in line and str(other) in line
    assert not (tmp_path / "run").exists()


def test_train_refuses_data_whose_prepare_json_records_no_tokenizer(tiny_prepared, tmp_path,
                                                                     capsys):
    target, source = tiny_prepared
    data = tmp_path / "data"
    shutil.copytree(source, data)
    info = json.loads((data / "prepare.json").read_text())
    del info["tokenizer_sha256"]  # as an older lengthwise wrote it
    (data / "prepare.json").write_text(json.dumps(info))
    assert _train(target, data, tmp_path / "run") == 2
    assert _error(capsys) == (
        f"lengthwise dflash: error: --data {data}: prepare.json records no tokenizer_sha256: it "
        "was written by an older lengthwise, which this version does not train on; prepare "
        f"--data again with --target {target}")
    assert not (tmp_path / "run").exists()


def test_a_prepare_rerun_after_the_tokenizer_changed_prepares_again(tiny_prepared, tmp_path,
                                                                     capsys):
    source, _ = tiny_prepared
    target = tmp_path / "target"
    shutil.copytree(source, target)
    chats = write_jsonl(tmp_path / "chats.jsonl", conversations(20))
    cfg = PrepareConfig(min_supervised=16, shard_rows=8, progress=False)
    first = prepare_chats(chats, target, tmp_path / "out", cfg)
    shutil.rmtree(target)
    _swapped(source, target)  # the same folder, another tokenizer
    again = prepare_chats(chats, target, tmp_path / "out", cfg)
    assert "3 shard(s) in" in capsys.readouterr().err
    assert again["shards_reused"] == 0
    assert again["tokenizer_sha256"] != first["tokenizer_sha256"]
    fresh = prepare_chats(chats, target, tmp_path / "fresh", cfg)
    a, b = open_prepared(tmp_path / "out"), open_prepared(tmp_path / "fresh")
    assert all(a[i] == b[i] for i in range(len(b))) and len(a) == len(b)
    assert fresh["tokenizer_sha256"] == again["tokenizer_sha256"]
    assert prepare_chats(chats, target, tmp_path / "out", cfg)["shards_reused"] == 3


def test_export_and_eval_refuse_a_target_other_than_the_drafts(tiny_prepared, tmp_path, capsys):
    target, data = tiny_prepared
    run = tmp_path / "run"
    assert _train(target, data, run) == 0
    serve = run / "target"  # grown by the mask token's row: still the data's tokenizer
    assert main(["dflash", "export", str(run), str(tmp_path / "x"), "--target",
                 str(serve)]) == 0
    other = _swapped(serve, tmp_path / "other")
    capsys.readouterr()
    assert main(["dflash", "export", str(run), str(tmp_path / "y"), "--target",
                 str(other)]) == 2
    assert f"the draft {run} was trained with another tokenizer than --target" in (
        _error(capsys))
    assert not (tmp_path / "y").exists()
    _retemplated(other, other)
    shutil.copy(serve / "tokenizer.json", other / "tokenizer.json")  # only the template differs
    assert main(["dflash", "eval", "--target", str(other), "--draft", str(tmp_path / "x"),
                 "--limit", "1", "--max-new-tokens", "2", "--temperatures", "0"]) == 2
    assert "was trained with another chat template than --target" in _error(capsys)


def _redrawn(target, folder):
    """``target`` with every weight drawn afresh: the same shapes, tokenizer and template."""
    import transformers

    shutil.copytree(target, folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    torch.manual_seed(123)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def exported_run(tiny_prepared, tmp_path_factory):
    """``(target, run, exported)``: a tiny run trained on ``target`` and its draft exported."""
    target, data = tiny_prepared
    root = tmp_path_factory.mktemp("exported_run")
    run, exported = root / "run", root / "x"
    assert _train(target, data, run) == 0
    assert main(["dflash", "export", str(run), str(exported)]) == 0
    return target, run, exported


#: ``dflash eval`` options of a short run (add --target and --draft)
EVAL = ["dflash", "eval", "--limit", "1", "--max-new-tokens", "2", "--temperatures", "0",
        "--no-check", "--no-accuracy", "--no-baseline", "--no-progress", "--json"]


def test_eval_refuses_a_target_of_other_weights_than_the_drafts(exported_run, tmp_path, capsys):
    from lengthwise.dflash.target import load_target
    from lengthwise.dflash.target_match import DRAFT_TARGET_FIX, SAMPLES, differs, weights_record

    _, run, exported = exported_run
    serve = run / "target"  # grown by the mask token's row: the target the draft trained on
    record = json.loads((exported / "config.json").read_text())["dflash_config"][
        "target_weights"]
    assert len(record["sample"]) == SAMPLES
    assert differs(record, weights_record(load_target(serve))) == 0
    other = _redrawn(serve, tmp_path / "other")
    for draft in (exported, run):
        capsys.readouterr()
        assert main([*EVAL, "--target", str(other), "--draft", str(draft)]) == 2
        line = _error(capsys)
        assert line.startswith(f"lengthwise dflash: error: the draft {draft} was trained on "
                               f"other weights than --target {other}'s ({SAMPLES} of {SAMPLES} "
                               "sampled values differ; the draft: "), line
        assert line.endswith(DRAFT_TARGET_FIX), line
    assert main([*EVAL, "--target", str(serve), "--draft", str(exported)]) == 0


def test_eval_of_the_target_before_it_grew_names_the_grown_one(exported_run, capsys):
    from lengthwise.dflash.target_match import DRAFT_TARGET_FIX

    target, _, exported = exported_run
    capsys.readouterr()
    assert main([*EVAL, "--target", str(target), "--draft", str(exported)]) == 2
    line = _error(capsys)  # one line: no loading bars before it
    assert line == ("lengthwise dflash: error: --target: the draft was trained with "
                    f"target_vocab_size 323, the target has 322; {DRAFT_TARGET_FIX}"), line


def test_shards_of_an_older_lengthwise_are_refused_naming_the_first(tiny_prepared, tmp_path):
    import pyarrow.parquet as pq

    from lengthwise.dflash.prepare import _META_KEY

    target, _ = tiny_prepared
    chats = write_jsonl(tmp_path / "chats.jsonl", conversations(20))
    cfg = PrepareConfig(min_supervised=16, shard_rows=8, progress=False)
    out = tmp_path / "out"
    prepare_chats(chats, target, out, cfg)
    for shard in sorted(out.glob("data-*.parquet")):  # as an older format wrote them
        table = pq.read_table(shard)
        meta = json.loads(table.schema.metadata[_META_KEY])
        meta["fingerprint"] = "0" * 24
        del meta["tokenizer"]
        pq.write_table(table.replace_schema_metadata({_META_KEY: json.dumps(meta)}), shard)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with pytest.raises(ConfigError) as err:
        prepare_chats(chats, target, out, cfg)
    assert str(err.value) == (f"--out {out}: data-00000.parquet was prepared by an older "
                              "lengthwise (it records no tokenizer), which this version does not "
                              "reuse; use an empty folder")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before

def test_a_resume_on_data_prepared_again_for_another_tokenizer_is_refused(tiny_prepared,
                                                                         tmp_path, capsys):
    source, _ = tiny_prepared
    target, data = tmp_path / "target", tmp_path / "data"
    shutil.copytree(source, target)
    chats = write_jsonl(tmp_path / "chats.jsonl", conversations(40))
    cfg = PrepareConfig(min_supervised=16, shard_rows=16, progress=False)
    prepare_chats(chats, target, data, cfg)
    assert _train(target, data, tmp_path / "run") == 0
    shutil.rmtree(target)
    _swapped(source, target)  # the target's tokenizer changed in place, the data follows it
    prepare_chats(chats, target, data, cfg)
    capsys.readouterr()
    assert main(["dflash", "train", "--target", str(target), "--data", str(data), "--out",
                 str(tmp_path / "run"), "--steps", "4", "--resume", *TINY_TRAIN]) == 2
    assert "--data (other data or tokenizer:" in _error(capsys)
