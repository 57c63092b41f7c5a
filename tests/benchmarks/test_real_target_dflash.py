"""``benchmarks/real_target_dflash.py``: a DFlash draft for SmolLM2-135M-Instruct on real chats.

The fast tests check how the chats are taken from the evals registry (licences, Git LFS
pointers, few-shot turns), what the drift check compares, and that docs/dflash.md's region
holds what the script renders from the committed JSON. The slow one reruns the ``check``
scale (conversion, regeneration, training, export, the reference load, eval) and compares it
with the committed one; it is skipped with the install command where an input is missing.
"""

from __future__ import annotations

import copy
import json

import pytest
from _scripts import script_fixtures, stale_regions
from hypothesis import given, settings
from hypothesis import strategies as st

script, saved = script_fixtures("real_target_dflash")

LICENCE = """NOTE: This license applies to all parts of this repository except for the datasets
#### Text Compression
- **Location**: evals/registry/data/text_compression
#### Theory of Mind
- **Location**: evals/registry/data/theory_of_mind
"""


def test_data_sets_under_their_own_licence_are_named_from_the_licence_file(script):
    assert script.licensed_elsewhere(LICENCE) == {"text_compression", "theory_of_mind"}


def test_git_lfs_pointers_are_recognised(script):
    assert script.is_lfs_pointer(b"version https://git-lfs.github.com/spec/v1\noid sha256:")
    assert not script.is_lfs_pointer(b'{"input": [{"role": "user"')


def _wheel(tmp_path, files):
    import zipfile

    path = tmp_path / "evals.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("evals-3.0.1.post1.dist-info/LICENSE.md", LICENCE)
        for name, text in files.items():
            zf.writestr("evals/registry/data/" + name, text)
    return path


def test_registry_chats_skip_licensed_lfs_and_chatless_files(script, tmp_path):
    row = json.dumps({"input": [{"role": "user", "content": "Hi"}], "ideal": "Hello"})
    wheel = _wheel(tmp_path, {
        "a/samples.jsonl": row + "\n" + row + "\n",
        "theory_of_mind/x.jsonl": row + "\n",
        "b/lfs.jsonl": "version https://git-lfs.github.com/spec/v1\n",
        "c/other.jsonl": json.dumps({"sample": 1}) + "\nnot json\n",
    })
    chats, counts = script.registry_chats(wheel, per_file=5, max_chars=100)
    assert counts == {"files": 4, "files_licensed_elsewhere": 1, "files_lfs_pointer": 1,
                      "files_no_chat": 1, "files_used": 1}
    assert [c["source"] for c in chats] == ["a/samples.jsonl"] * 2


_turn = st.fixed_dictionaries({
    "role": st.sampled_from(["system", "user", "assistant", "tool"]),
    "content": st.text(max_size=20),
    "name": st.sampled_from([None, "example_user", "example_assistant", "other"])})


@settings(deadline=None, max_examples=200)
@given(turns=st.lists(_turn, max_size=6), limit=st.integers(0, 80))
def test_a_registry_chat_is_a_chat_the_target_answers_or_none(script, turns, limit):
    chat = script.registry_chat({"input": turns}, limit)
    if chat is None:
        return
    assert chat[-1]["role"] == "user" and len(chat) == len(turns)
    assert sum(len(m["content"]) for m in chat) <= limit
    assert all(m["role"] in ("system", "user", "assistant") for m in chat)
    assert all(m["role"] != "system" for m in chat[1:])
    for m, t in zip(chat, turns, strict=True):
        if t["name"] in ("example_user", "example_assistant"):
            assert m["role"] == t["name"].removeprefix("example_")


def test_the_check_compares_counts_and_figures_but_not_times(script):
    check = {"data": {"kept": 10}, "final": [{"acceptance_length": 1.5, "mismatches": 0}],
             "times": {"total_s": 10.0}, "machine": "here"}
    fresh = copy.deepcopy(check)
    fresh["times"]["total_s"], fresh["machine"] = 99.0, "there"
    assert script.compare(check, fresh) == []
    fresh["data"]["kept"] = 11
    fresh["final"][0]["acceptance_length"] = 1.6
    assert script.compare(check, fresh) == ["check.data.kept: 10, now 11",
                                            "check.final[0].acceptance_length: 1.5, now 1.6"]


def test_the_docs_region_is_what_the_committed_figures_render(script, saved):
    assert stale_regions(script, saved) == []
    assert script.RESULTS_MD.read_text(encoding="utf-8") == script.render_md(saved)


def test_the_committed_run_says_whether_the_draft_beats_prompt_lookup(script, saved):
    main = next((saved[k] for k in script.SCALE_ORDER[:-1] if k in saved), None)
    assert main is not None, "no committed run"
    assert all(r.get(k, 0) == 0 for r in main["final"]
               for k in ("mismatches", "baseline_mismatches", "combined_mismatches"))
    text = script.verdict(main)
    assert "prompt lookup" in text
    if "is below" in text or "is not told apart" in text:
        assert "Why:" in text
    for r in main["final"]:  # the combined proposer, said per set and temperature
        if "combined_vs_baseline" in r:
            d = r["combined_vs_baseline"]
            word = script._compared(d)
            assert f"on {r['set']} it {word} prompt lookup" in text.replace(". On", ". on")
            assert d["lo"] <= d["mean"] <= d["hi"]
    scales = [saved[k] for k in script.SCALE_ORDER[:-1] if k in saved]
    if len(scales) > 1:
        table = script.scales_table(scales)
        assert [line.split(" | ")[0].strip("| ") for line in table.splitlines()[2:2 + len(scales)]
                ] == [s["scale"] for s in scales]


def test_the_check_scale_reruns_as_committed(script, saved):
    """The whole pipeline at the check scale, compared with the committed check run."""
    try:
        script.gguf_file()
        wheel = script.evals_wheel()
        script.humaneval_file()
    except script.Missing as exc:
        pytest.skip(str(exc))
    import tempfile
    from pathlib import Path

    from lengthwise.cache import cache_dir

    work = Path(tempfile.mkdtemp(prefix="real-target-check-"))
    target = cache_dir() / "real-target" / "target"  # the conversion is tested by test_gguf
    if target.is_dir():
        (work / "target").symlink_to(target, target_is_directory=True)
    fresh = script.run("check", work / "check", wheel)
    assert fresh["reference"].get("missing_keys", []) == []
    assert fresh["reference"].get("equal_to_greedy", True)
    assert all(r["mismatches"] == 0 for r in fresh["final"] if "mismatches" in r)
    assert script.compare(saved["check"], fresh) == []


def test_a_rerun_takes_saved_stage_figures_and_leaves_unchanged_data_files_alone(
        script, tmp_path, monkeypatch):
    stages = script.Stages(tmp_path / "evals")
    calls = []
    assert stages.get("final", lambda: calls.append(1) or [{"a": 1}]) == [{"a": 1}]
    assert stages.get("final", lambda: calls.append(2) or [{"a": 2}]) == [{"a": 1}]
    assert calls == [1]
    stages.clear()
    assert stages.get("final", lambda: [{"a": 3}]) == [{"a": 3}]
    path = tmp_path / "chats.jsonl"
    script._jsonl(path, [{"x": 1}])
    before = path.stat().st_mtime_ns
    script._jsonl(path, [{"x": 1}])  # the same rows: prepare's fingerprint (mtime) is kept
    assert path.stat().st_mtime_ns == before
    script._jsonl(path, [{"x": 2}])
    assert path.read_text() == '{"x": 2}\n'


@given(st.lists(st.integers(0, 9), min_size=1, max_size=60), st.integers(0, 10),
       st.integers(0, 3))
@settings(max_examples=60, deadline=None)
def test_held_out_chats_share_no_data_set_with_training_and_none_is_lost(script, sets, n_held,
                                                                       seed):
    chats = [{"source": f"set{k}/data.jsonl", "messages": [i]} for i, k in enumerate(sets)]
    held, train = script.split_by_data_set(chats, n_held, seed)
    held_sets = {script.data_set(c) for c in held}
    assert len(held) == len(held_sets) == min(n_held, len(set(sets)))
    assert not held_sets & {script.data_set(c) for c in train}
    assert sorted(c["messages"][0] for c in train) == [
        i for i, k in enumerate(sets) if f"set{k}" not in held_sets]


def test_the_results_gather_the_committed_lever_reference_and_wall_clock_figures(script):
    from pathlib import Path

    root = Path(script.__file__).resolve().parents[1]
    got = script.companions(root)
    for key, (_, name) in script.COMPANIONS.items():
        assert (key in got) == (root / "benchmarks" / name).is_file()
    if "levers" in got:
        assert got["levers"]["arms"]["baseline"]["seeds"] >= 1
    if "wall_clock" in got:
        assert got["wall_clock"]["speedup"]["greedy"]["mean"] == 1.0
    text = script.render_md({**got})
    assert ("## Wall clock" in text) == ("wall_clock" in got)


def test_the_committed_prepared_chats_are_used_only_for_the_chats_they_were_made_from(
        script, tmp_path, monkeypatch):
    """The large scale's committed prepared folder is copied in for the chats its SHA-256
    names, and read back whole; other chats are regenerated (nothing copied)."""
    from lengthwise.dflash.prepared import open_prepared

    sha = (script.LARGE_PREPARED / script.CHATS_SHA256).read_text().strip()
    other = tmp_path / "other.jsonl"
    other.write_text('{"messages": []}\n')
    assert not script.committed_prepared(other, tmp_path / "a")
    assert not (tmp_path / "a").exists()

    class Chats:  # the chats the folder was made from, by their hash only
        def read_bytes(self) -> bytes:
            return b"made from"

    monkeypatch.setattr(script.hashlib, "sha256",
                        lambda b: type("H", (), {"hexdigest": lambda self: sha})())
    assert script.committed_prepared(Chats(), tmp_path / "b")
    monkeypatch.undo()
    data = open_prepared(str(tmp_path / "b"))
    info = json.loads((script.LARGE_PREPARED / "prepare.json").read_text())
    assert len(data) == info["counts"]["kept"] == 2469
