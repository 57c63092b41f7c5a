"""``lengthwise dflash prepare`` on a real tokenizer and chat template, and its reader."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _chat_tiny import (
    TEMPLATE,
    TEMPLATE_MARKED,
    TEMPLATE_NO_ASSISTANT,
    chat_tokenizer,
    conversations,
    save_target,
    write_jsonl,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.dflash.chat import ChatRenderer, normalise
from lengthwise.dflash.prepare import prepare_chats
from lengthwise.dflash.prepare_config import PrepareConfig
from lengthwise.dflash.prepared import open_prepared
from lengthwise.errors import ConfigError, DataError

pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return save_target(tmp_path_factory.mktemp("target") / "tiny-qwen3")


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("chats") / "chats.jsonl", conversations(30))


def _cfg(**kw):
    return PrepareConfig(**{"min_supervised": 8, "shard_rows": 8, "progress": False, **kw})


def _rows(chats):
    data = open_prepared(chats)
    return [data[i] for i in range(len(data))]


def test_generation_marks_and_prefix_rendering_give_the_same_mask():
    marked = ChatRenderer(chat_tokenizer(TEMPLATE_MARKED))
    diffed = ChatRenderer(chat_tokenizer(TEMPLATE))
    assert marked.uses_generation_marks and not diffed.uses_generation_marks
    tok = diffed.tokenizer
    for row in conversations(12):
        conv = normalise(row["messages"], where="row")
        a, b = marked.render(conv), diffed.render(conv)
        assert a.input_ids == b.input_ids and a.loss_mask == b.loss_mask
        learned = tok.decode([t for t, m in zip(b.input_ids, b.loss_mask, strict=True) if m])
        expect = "".join(m["content"] + "<|im_end|>" for m in conv if m["role"] == "assistant")
        assert learned == expect


@pytest.fixture(scope="module")
def renderers():
    return ChatRenderer(chat_tokenizer(TEMPLATE_MARKED)), ChatRenderer(chat_tokenizer(TEMPLATE))


TEXT = st.text(alphabet=st.sampled_from(list("ab cat\n\t.,é漢😀")), min_size=1, max_size=30)


@settings(max_examples=40, deadline=None)
@given(turns=st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=3), system=st.booleans(),
       opening=st.booleans())
def test_any_conversation_gets_the_same_mask_both_ways(renderers, turns, system, opening):
    marked, diffed = renderers
    conv = [{"role": "system", "content": "be brief"}] if system else []
    for user, reply in turns:
        conv += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    if opening:  # the chat opens with the assistant's turn: its first user turn left out
        del conv[int(system)]
    a, b = marked.render(conv), diffed.render(conv)
    assert a.input_ids == b.input_ids and a.loss_mask == b.loss_mask
    # every assistant turn's end-of-turn token is learned, and no user token is
    tok = diffed.tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    learned_ends = sum(1 for t, m in zip(b.input_ids, b.loss_mask, strict=True) if t == end and m)
    assert learned_ends == len(turns)


def test_thinking_switch_is_passed_and_refused_without_one():
    tok = chat_tokenizer(TEMPLATE_MARKED)
    conv = normalise(conversations(1)[0]["messages"], where="row")
    off = ChatRenderer(tok, enable_thinking=False).render(conv)
    default = ChatRenderer(tok).render(conv)
    assert len(off.input_ids) > len(default.input_ids)
    assert "<think>" in tok.decode(off.input_ids)
    plain = chat_tokenizer(TEMPLATE.replace("enable_thinking is defined and "
                                            "enable_thinking is false", "false"))
    with pytest.raises(ConfigError, match="no enable_thinking switch"):
        ChatRenderer(plain, enable_thinking=True)


def test_reasoning_reaches_a_template_that_renders_it():
    tpl = TEMPLATE.replace("{{- m['content'] + '<|im_end|>' -}}",
                           "{{- (m.get('reasoning_content') or '') + m['content'] + "
                           "'<|im_end|>' -}}")
    render = ChatRenderer(chat_tokenizer(tpl))
    conv = normalise([{"role": "user", "content": "hi"},
                      {"role": "assistant", "content": "yes", "reasoning_content": "think "}],
                     where="row")
    out = render.render(conv)
    learned = render.tokenizer.decode([t for t, m in zip(out.input_ids, out.loss_mask,
                                                           strict=True) if m])
    assert learned == "think yes<|im_end|>"


def test_template_without_assistant_role_is_refused():
    with pytest.raises(ConfigError, match="no assistant role"):
        ChatRenderer(chat_tokenizer(TEMPLATE_NO_ASSISTANT), name="--target t")


def test_prepared_folder_holds_ids_mask_lengths_and_counts(target, chats, tmp_path):
    rec = prepare_chats(chats, target, tmp_path / "p", _cfg(min_supervised=20))
    data = open_prepared(tmp_path / "p")
    c = rec["counts"]
    assert c["rows"] == 30 and c["kept"] == len(data) > 0
    assert c["kept"] + c["dropped_few_supervised"] == 30 and c["dropped_few_supervised"] > 0
    assert data.lengths.dtype == np.int64
    from lengthwise import load_lengths

    assert np.array_equal(load_lengths(str(tmp_path / "p" / "lengths.npy")), data.lengths)
    supervised = 0
    for i in range(len(data)):
        row = data[i]
        assert len(row["input_ids"]) == len(row["loss_mask"]) == data.lengths[i]
        assert sum(row["loss_mask"]) >= 20
        supervised += sum(row["loss_mask"])
        s = data.sample(i)
        assert np.array_equal(s["labels"] != -100, np.array(row["loss_mask"]) == 1)
    assert supervised == c["supervised_tokens"]
    table = pq.read_table(tmp_path / "p" / "data-00000.parquet")
    assert str(table.schema.field("input_ids").type) == "list<element: int32>"
    assert str(table.schema.field("loss_mask").type) == "list<element: int8>"
    info = json.loads((tmp_path / "p" / "prepare.json").read_text())
    assert info["chat_template_sha256"] and info["counts"] == c


def test_sharegpt_parquet_and_datasets_folder_equal_openai_jsonl(target, chats, tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = conversations(30)
    share = write_jsonl(tmp_path / "share.jsonl", conversations(30, sharegpt=True))
    pq.write_table(__import__("pyarrow").Table.from_pylist(rows), tmp_path / "c.parquet")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    expect = (prepare_chats(chats, target, tmp_path / "a", _cfg()), _rows(tmp_path / "a"))
    for name, src in [("b", share), ("c", tmp_path / "c.parquet"), ("d", tmp_path / "ds")]:
        rec = prepare_chats(src, target, tmp_path / name, _cfg())
        assert rec["counts"] == expect[0]["counts"]
        assert _rows(tmp_path / name) == expect[1]


def test_rerun_resumes_from_finished_shards(target, chats, tmp_path):
    out = tmp_path / "p"
    first = prepare_chats(chats, target, out, _cfg())
    before = _rows(out)
    (out / "data-00002.parquet").unlink()
    (out / "prepare.json").unlink()
    again = prepare_chats(chats, target, out, _cfg())
    assert again["shards_reused"] == len(first["shards"]) - 1
    assert again["counts"] == first["counts"] and _rows(out) == before
    with pytest.raises(ConfigError, match="other data or settings"):
        prepare_chats(chats, target, out, _cfg(min_supervised=9))


def test_overlong_samples_are_truncated_or_dropped_and_counted(target, chats, tmp_path):
    full = prepare_chats(chats, target, tmp_path / "full", _cfg())
    over = int((open_prepared(tmp_path / "full").lengths > 60).sum())
    assert over > 0
    cut = prepare_chats(chats, target, tmp_path / "cut", _cfg(max_len=60))
    dropped = prepare_chats(chats, target, tmp_path / "drop", _cfg(max_len=60, overlong="drop"))
    assert cut["counts"]["truncated"] == over
    assert open_prepared(tmp_path / "cut").lengths.max() <= 60
    assert dropped["counts"]["dropped_too_long"] == over
    assert dropped["counts"]["kept"] == full["counts"]["kept"] - over


BAD = [
    ({"messages": "hello"}, r"row 0 \(line 1\) field 'messages': must be a list"),
    ({"messages": [{"content": "x"}]}, r"field 'messages'\[0\]: no 'role'"),
    ({"conversations": [{"from": "wizard", "value": "x"}]},
     r"field 'conversations'\[0\]: unknown role 'wizard'"),
    ({"messages": [{"role": "user", "content": ""}]}, r"\[0\]: empty content \(role 'user'\)"),
    ({"messages": [{"role": "user"}]}, r"\[0\]: no 'content'"),
    ({"text": "hello"}, "line 1: no 'messages' or 'conversations' field"),
]


@pytest.mark.parametrize(("row", "message"), BAD)
def test_malformed_conversations_name_row_and_field(target, tmp_path, row, message):
    src = write_jsonl(tmp_path / "bad.jsonl", [row])
    with pytest.raises(DataError, match=message):
        prepare_chats(src, target, tmp_path / "out", _cfg())


def test_a_conversation_the_template_refuses_is_named(tmp_path):
    strict = ("{%- for m in messages -%}{%- if not loop.first and m['role'] == "
              "messages[loop.index0 - 1]['role'] -%}{{ raise_exception('roles must alternate') }}"
              "{%- endif -%}{%- endfor -%}" + TEMPLATE)
    target = save_target(tmp_path / "strict", template=strict)
    rows = [conversations(1)[0], {"messages": [{"role": "user", "content": "a"},
                                               {"role": "user", "content": "b"}]}]
    src = write_jsonl(tmp_path / "c.jsonl", rows)
    with pytest.raises(DataError, match=r"row 1 \(line 2\) field 'messages': the chat template "
                                        r"cannot render it \(roles must alternate\)"):
        prepare_chats(src, target, tmp_path / "out", _cfg())


def test_a_line_that_is_not_a_json_object_is_named(target, tmp_path):
    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps(conversations(1)[0]) + "\n\n{broken\n")
    with pytest.raises(DataError, match=r"c.jsonl, line 3: not valid JSON"):
        prepare_chats(src, target, tmp_path / "out", _cfg())
    src.write_text("[1, 2]\n")
    with pytest.raises(DataError, match=r"c.jsonl, line 1: not a JSON object"):
        prepare_chats(src, target, tmp_path / "out2", _cfg())


def test_every_sample_below_the_minimum_is_an_error(target, chats, tmp_path):
    with pytest.raises(DataError, match="every one of the 30 samples was dropped"):
        prepare_chats(chats, target, tmp_path / "out", _cfg(min_supervised=500))
    assert not (tmp_path / "out" / "prepare.json").exists()


def test_target_without_model_or_template_is_refused(tmp_path, chats):
    with pytest.raises(ConfigError, match="no config.json"):
        prepare_chats(chats, tmp_path, tmp_path / "out", _cfg())
    bare = save_target(tmp_path / "bare", causal_lm=False)
    with pytest.raises(ConfigError, match="not a causal language model"):
        prepare_chats(chats, bare, tmp_path / "out", _cfg())
    bad = save_target(tmp_path / "t", template=TEMPLATE_NO_ASSISTANT)
    with pytest.raises(ConfigError, match="no assistant role"):
        prepare_chats(chats, bad, tmp_path / "out", _cfg())


def test_regeneration_writes_the_targets_greedy_turns(target, tmp_path):
    import torch
    import transformers

    rows = [*conversations(4), {"messages": [{"role": "user", "content": "the cat"}]}]
    src = write_jsonl(tmp_path / "c.jsonl", rows)
    cfg = _cfg(regenerate=True, max_new_tokens=5, min_supervised=2, batch_size=3)
    rec = prepare_chats(src, target, tmp_path / "p", cfg)
    turns = sum(m["role"] == "assistant" for r in rows for m in r["messages"])
    assert rec["counts"]["regenerated_turns"] == turns + 1  # the last chat gets its answer
    # the first turn of a conversation is what the target writes greedily, one prompt alone
    tok = transformers.AutoTokenizer.from_pretrained(str(target))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(target)).eval()
    render = ChatRenderer(tok)
    data = open_prepared(tmp_path / "p")
    for i in range(len(data)):
        conv = normalise(rows[i]["messages"], where="row")
        first = next((j for j, m in enumerate(conv) if m["role"] == "assistant"), len(conv))
        prompt = render.prompt_ids(conv[:first])
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
        new = out[0, len(prompt):].tolist()
        new = new[: new.index(tok.eos_token_id) + 1] if tok.eos_token_id in new else new
        row = data[i]
        ids, mask = row["input_ids"], row["loss_mask"]
        start = mask.index(1)
        end = start + mask[start:].index(0) if 0 in mask[start:] else len(mask)
        # the target's own ids, its end-of-turn token only where it wrote one
        assert ids[:start] == prompt and ids[start:end] == new


def test_cli_prints_counts_and_one_line_errors(target, chats, tmp_path, capsys):
    from lengthwise.cli import main

    args = ["dflash", "prepare", str(chats), "--target", str(target), "--out",
            str(tmp_path / "p"), "--min-supervised", "20", "--shard-rows", "10", "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    n = len(open_prepared(tmp_path / "p"))
    assert f"{n} of 30 conversations kept" in out and "3 shard(s)" in out
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"messages": [{"role": "wizard", "content": "x"}]}])
    assert main(["dflash", "prepare", str(bad), "--target", str(target), "--out",
                 str(tmp_path / "q"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown role 'wizard'" in err[0]


@pytest.mark.parametrize("flags, said", [
    (["--min-supervised", "-1"], "--min-supervised must be a positive integer, got -1"),
    (["--max-len", "0"], "--max-len must be an integer >= 2, got 0"),
    (["--max-len", "-1"], "--max-len must be an integer >= 2, got -1"),
    (["--shard-rows", "0"], "--shard-rows must be a positive integer, got 0"),
])
def test_cli_names_a_bad_setting_by_its_option(target, chats, tmp_path, capsys, flags, said):
    from lengthwise.cli import main

    assert main(["dflash", "prepare", str(chats), "--target", str(target), "--out",
                 str(tmp_path / "p"), "--no-progress", *flags]) == 2
    assert capsys.readouterr().err.strip() == f"lengthwise dflash: error: {said}"


def test_thinking_asked_of_a_target_without_a_template_says_what_it_needs(tmp_path, chats,
                                                                           capsys):
    from lengthwise.cli import main

    bare = save_target(tmp_path / "bare")
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    assert main(["dflash", "prepare", str(chats), "--target", str(bare), "--out",
                 str(tmp_path / "p"), "--no-progress", "--enable-thinking"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"--target {bare} has no chat template (--enable-thinking/--no-enable-thinking need "
        "one with an enable_thinking switch)")


def test_samples_longer_than_the_target_s_positions_are_kept_and_counted(target, tmp_path,
                                                                          capsys):
    from lengthwise.cli import main

    long = " ".join(["the cat sat on a mat"] * 120)  # over the target's 512 positions
    rows = [*conversations(3), {"messages": [{"role": "user", "content": "tell"},
                                             {"role": "assistant", "content": long}]}]
    source = write_jsonl(tmp_path / "long.jsonl", rows)
    assert main(["dflash", "prepare", str(source), "--target", str(target), "--out",
                 str(tmp_path / "p"), "--min-supervised", "8", "--no-progress"]) == 0
    longest = int(open_prepared(tmp_path / "p").lengths.max())
    assert longest > 512
    assert capsys.readouterr().err.strip().endswith(
        "warning: 1 of 4 samples are longer than the target's 512 positions "
        f"(max_position_embeddings; the longest has {longest:,} tokens): they are kept whole; "
        "give --max-len 512 here, or to dflash train, to cut them")
    assert main(["dflash", "prepare", str(source), "--target", str(target), "--out",
                 str(tmp_path / "q"), "--min-supervised", "8", "--max-len", "512",
                 "--no-progress"]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.slow
def test_torchrun_two_processes_prepare_the_same_folder(target, chats, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from _ports import free_port

    one = prepare_chats(chats, target, tmp_path / "one", _cfg(shard_rows=7))
    port = free_port()
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "lengthwise",
           "dflash", "prepare", str(chats), "--target", str(target), "--out",
           str(tmp_path / "two"), "--min-supervised", "8", "--shard-rows", "7", "--no-progress"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("conversations kept") == 1  # rank 0 reports
    two = json.loads((tmp_path / "two" / "prepare.json").read_text())
    assert two["processes"] == 2 and two["counts"] == one["counts"]
    assert _rows(tmp_path / "two") == _rows(tmp_path / "one")
    assert np.array_equal(np.load(tmp_path / "two" / "lengths.npy"),
                          np.load(tmp_path / "one" / "lengths.npy"))


def test_regeneration_backend_is_chosen_and_named():
    import importlib.util

    from lengthwise.dflash.regenerate import pick_backend
    from lengthwise.errors import MissingDependencyError

    assert pick_backend("auto", "cpu", 1) == "hf" and pick_backend("hf", "cuda", 1) == "hf"
    if importlib.util.find_spec("vllm") is None:
        assert pick_backend("auto", "cuda", 1) == "hf"
        with pytest.raises(MissingDependencyError, match="vllm package is not installed"):
            pick_backend("vllm", "cuda", 1)
    else:
        with pytest.raises(ConfigError, match="one process"):
            pick_backend("vllm", "cuda", 2)
    with pytest.raises(ConfigError, match="backend must be"):
        PrepareConfig(backend="tgi")


def test_regeneration_with_vllm_writes_every_turn(target, tmp_path):
    pytest.importorskip("vllm")
    if not torch_cuda():
        pytest.skip("vLLM regeneration needs a CUDA device")
    rows = conversations(6)
    src = write_jsonl(tmp_path / "c.jsonl", rows)
    cfg = _cfg(regenerate=True, max_new_tokens=5, min_supervised=2, backend="vllm",
               device="cuda")
    rec = prepare_chats(src, target, tmp_path / "p", cfg)
    turns = sum(m["role"] == "assistant" for r in rows for m in r["messages"])
    assert rec["regenerated_with"] == "vllm"
    assert rec["counts"]["regenerated_turns"] == turns


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_chat_sources_read_any_row_range_the_same_way(tmp_path):
    import gzip

    import pyarrow as pa

    from lengthwise.dflash.chat_files import ChatSource

    rows = conversations(23)
    lines = [json.dumps(r) for r in rows]
    text = "\n\n".join(lines[:5]) + "\n   \n" + "\n".join(lines[5:]) + "\n"  # blank lines
    (tmp_path / "c.jsonl").write_text(text)
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as f:
        f.write(text)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet", row_group_size=7)
    sources = [tmp_path / "c.jsonl", tmp_path / "c.jsonl.gz", tmp_path / "c.parquet"]
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    sources.append(tmp_path / "ds")
    for path in sources:
        src = ChatSource(path)
        assert len(src) == 23
        for lo, hi in [(0, 23), (0, 1), (4, 9), (6, 7), (7, 14), (20, 40), (23, 30)]:
            got = [(row, raw) for row, _, raw in src.rows(lo, hi)]
            assert got == [(i, rows[i]["messages"]) for i in range(lo, min(hi, 23))], path
    where = [w for _, w, _ in ChatSource(tmp_path / "c.jsonl").rows(4, 6)]
    assert where[0].endswith("row 4 (line 9) field 'messages'")
    assert where[1].endswith("row 5 (line 11) field 'messages'")
