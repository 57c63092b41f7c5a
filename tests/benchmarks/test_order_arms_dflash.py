"""``benchmarks/order_arms_dflash.py``: the order experiment on a DFlash draft from cached features.

The check design runs end to end on a tiny random Llama target, a tiny prepared chat set
and its feature cache, all built here: its invariants (equal steps and real tokens per
step in arm ``data``, equal FLOPs in arm ``compute``, every sample trained once per
epoch), its figures and its generated reading. Once ``benchmarks/ORDER_ARMS_DFLASH.json``
is committed, its check figures hold the same invariants and the results page is the one
the script renders from them.
"""

from __future__ import annotations

import copy
import json

import pytest
from _scripts import load_script

torch = pytest.importorskip("torch")

#: the tiny draft: blocks of 4, 4 anchors, micro-batches of 256 tokens
TINY = {"max_tokens": 256, "max_len": 200, "block_size": 4, "draft_layers": 2,
        "num_features": 2, "num_anchors": 4, "lr": 1e-2}


@pytest.fixture(scope="module")
def script():
    return load_script("order_arms_dflash")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``(prepared, target, features)``: 40 chats for a random Llama (tied embeddings, a
    ChatML template, a special token it never writes for the mask) and their feature cache."""
    from _chat_tiny import conversations, save_instruct_target, write_jsonl

    from lengthwise.dflash.features import FeaturesConfig, write_features
    from lengthwise.dflash.prepare import prepare_chats
    from lengthwise.dflash.prepare_config import PrepareConfig

    root = tmp_path_factory.mktemp("order_dflash")
    target = save_instruct_target(root / "target", dtype="float32",
                                  extra_special=("<|unused|>",))
    chats = write_jsonl(root / "chats.jsonl", conversations(40))
    prepare_chats(chats, target, root / "prepared",
                  PrepareConfig(min_supervised=16, shard_rows=16, progress=False))
    write_features(root / "prepared", target, root / "features",
                   FeaturesConfig(num_features=2, dtype="float32", shard_mib=1, progress=False))
    return root / "prepared", target, root / "features"


def _design(script, tiny, **settings):
    from experiments.dflash_arms import DFlashArms

    prepared, target, features = tiny
    return DFlashArms(prepared=str(prepared), target=str(target), features=str(features),
                      **{**script.CHECK, "train": dict(TINY), "train_samples": None,
                         "epochs": 2, **settings})


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    """Three held-out one-turn prompts, as a prompt file."""
    path = tmp_path_factory.mktemp("prompts") / "held.jsonl"
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in (
        "name three colours", "what is a river", "count to five")), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def check(script, tiny, prompts, tmp_path_factory):
    torch.set_num_threads(1)
    return script.run(_design(script, tiny, prompts=str(prompts)),
                      tmp_path_factory.mktemp("arms"), 1)


def test_the_check_design_keeps_its_invariants(script, check):
    assert script.invariants(check) == []
    cells = check["cells"]
    assert set(cells) == {"data/cosine/2", "compute/cosine/2"}
    data = cells["data/cosine/2"]
    steps = {name: row["steps"]["mean"] for name, row in data["orders"].items()}
    assert len(set(steps.values())) == 1, steps  # the same optimizer steps for every order
    assert data["equal"]["real_tokens_min"] == data["equal"]["real_tokens_max"]
    compute = cells["compute/cosine/2"]["equal"]
    assert compute["flops_min"] >= compute["flops_budget"]
    # the order that pads more takes more micro-batches for the same data
    micro = {name: row["micro_batches"]["mean"] for name, row in data["orders"].items()}
    assert micro["random"] >= micro["sorted"], micro


def test_every_sample_is_trained_once_per_epoch_in_arm_data(script, tiny):
    from lengthwise.train.loop import make_sampler

    from experiments.arms import EqualData
    from experiments.dflash_arms import context

    design = _design(script, tiny)
    lengths = context(design).split.lengths
    for order in design.orders:
        cfg = design.train_config(seed=0, batch=2, steps=1)
        steps = EqualData(make_sampler(order, lengths, cfg), lengths, 5, max_len=cfg.max_len)
        for _epoch in range(2):
            ids = sorted(i for _ in range(5) for b in steps.next() for row in b for i in row)
            assert ids == list(range(lengths.size)), order


def test_each_run_measures_the_draft_and_its_loss_log(check):
    run = check["runs"][0]
    assert len(run["slot_accuracy"]) == TINY["block_size"] - 1
    assert 1.0 <= run["expected_acceptance"] <= TINY["block_size"]
    assert 1.0 <= run["expected_acceptance_t1"] <= TINY["block_size"]
    assert run["tokens_per_second"] > 0 and 0 < run["padding_efficiency"] <= 1
    assert len(run["micro_loss"]) == run["micro_batches"]
    assert "stable" in run["loss_log"] or "error" in run["loss_log"]
    # real decoding of the held-out prompts: at least the target's own token a forward
    assert 1.0 <= run["acceptance_length"] <= TINY["block_size"]
    assert run["new_tokens"] >= run["verify_forwards"] > 0
    row = check["cells"]["data/cosine/2"]["orders"]["sorted"]
    assert set(row["vs_random"]) >= {"eval_loss", "expected_acceptance", "flops",
                                     "acceptance_length"}
    assert row["acceptance_length"]["mean"] >= 1.0


def test_the_reading_is_one_short_sentence_per_setting_and_a_table(script, check, tmp_path,
                                                                    monkeypatch):
    from experiments.dflash_report import MAX_WORDS, decisions, table

    sentences = decisions(check)
    assert len(sentences) == len(check["cells"])
    for s in sentences:
        assert len(s.split()) <= MAX_WORDS
        assert "no difference detected at this size" in s  # one seed: no interval
    for cell in check["cells"].values():
        assert 3 <= len(table(cell).splitlines()) <= 2 + 8
    monkeypatch.setattr(script, "RESULTS", tmp_path / "r.md")
    monkeypatch.setattr(script, "PLOT", tmp_path / "p.png")
    pytest.importorskip("matplotlib")
    script.plot(check, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0
    assert "## The reduced check" in script.results_md({"check": check})


def test_a_moved_figure_of_the_check_is_reported(script, check):
    assert script.compare(check, check) == []
    moved = copy.deepcopy(check)
    moved["runs"][0]["eval_loss"] *= 1.1
    moved["runs"][1]["flops"] += 1
    assert len(script.compare(check, moved)) == 2


def test_the_design_refuses_what_it_sets_itself(script, tiny):
    from lengthwise.errors import ConfigError

    with pytest.raises(ConfigError, match="set by the experiment"):
        _design(script, tiny, train={**TINY, "seed": 3})
    with pytest.raises(ConfigError, match="train_samples"):
        _design(script, tiny, train_samples=0)


def test_the_script_needs_its_data(script, capsys):
    with pytest.raises(SystemExit) as exc:
        script.main(["--check"])
    assert exc.value.code == 2
    assert "--prepared, --target, --features" in capsys.readouterr().err


def test_the_committed_check_keeps_the_invariants_and_its_results_page(script):
    if not script.SAVED.is_file():
        pytest.skip("no benchmarks/ORDER_ARMS_DFLASH.json yet (python "
                    "benchmarks/order_arms_dflash.py --check-only ...)")
    saved = json.loads(script.SAVED.read_text(encoding="utf-8"))
    assert script.invariants(saved["check"]) == []
    assert script.RESULTS.read_text(encoding="utf-8") == script.results_md(saved), (
        "stale: python benchmarks/order_arms_dflash.py --render")
    if "full" in saved:
        import docs_figures

        assert script.invariants(saved["full"]) == []
        readme = (script.ROOT / "README.md").read_text(encoding="utf-8")
        i, j = docs_figures.region_text(readme, "order-arms-dflash", "README.md")
        assert readme[i:j].strip() == script.render("order-arms-dflash", saved).strip(), (
            "stale: python benchmarks/order_arms_dflash.py --render")
        table = script.readme_table(next(iter(saved["full"]["cells"].values())))
        assert len(table.splitlines()) <= 2 + 8


def test_recipe_settings_pass_through_and_every_option_is_documented(script, capsys):
    import re

    args = script.arguments().parse_args(["--set", "lr=0.001", "--set", "init=draft/"])
    assert args.set == [("lr", 0.001), ("init", "draft/")]
    with pytest.raises(SystemExit) as exc:
        script.main(["--set", "lr"])
    assert exc.value.code == 2 and "expected KEY=VALUE" in capsys.readouterr().err
    flags = {a for action in script.arguments()._actions for a in action.option_strings
             if a.startswith("--") and a != "--help"}
    assert flags <= set(re.findall(r"--[a-z][a-z-]*", script.__doc__))


def test_standardize_features_reaches_the_draft_of_a_run(script, tiny, tmp_path):
    from lengthwise.train.device import pick_device

    from experiments.dflash_arms import context, run_draft

    design = _design(script, tiny, train={**TINY, "standardize_features": True})
    draft = run_draft(design, design.train_config(seed=1, batch=2, steps=1), tmp_path,
                      pick_device("cpu"))
    scale = draft.feature_scale
    assert draft.config.standardize_features and not torch.equal(scale, torch.ones_like(scale))
    # the scale dflash train measures on the same training samples
    assert torch.equal(scale, context(design).models.draft.feature_scale)


def test_every_run_starts_from_the_shared_draft_and_another_shape_is_refused(script, tiny,
                                                                              tmp_path):
    from lengthwise.dflash.export import export_draft
    from lengthwise.dflash.recipe import _save_final
    from lengthwise.errors import ConfigError
    from lengthwise.train.device import pick_device

    from experiments.dflash_arms import run_draft

    design = _design(script, tiny)
    cfg = design.train_config(seed=1, batch=2, steps=1)
    first = run_draft(design, cfg, tmp_path, pick_device("cpu"))
    with torch.no_grad():
        first.fc.weight.add_(0.5)  # a draft no seed draws
    _save_final(first, tmp_path / "start" / "final", 7)
    export_draft(first, tmp_path / "exported")  # a start committed as `dflash export` writes
    for start in ("start", "exported"):
        shared = _design(script, tiny, start=str(tmp_path / start))
        for seed in (1, 2):
            draft = run_draft(shared, shared.train_config(seed=seed, batch=2, steps=1),
                              tmp_path, pick_device("cpu"))
            assert draft.training and torch.equal(draft.fc.weight, first.fc.weight)
    other = _design(script, tiny, start=str(tmp_path / "start"),
                    train={**TINY, "block_size": 2})
    with pytest.raises(ConfigError, match="block_size 4 .the design's 2."):
        run_draft(other, other.train_config(seed=1, batch=2, steps=1), tmp_path,
                  pick_device("cpu"))


def test_saved_runs_of_another_design_are_refused_and_a_larger_design_reuses_them(
        script, tiny, tmp_path):
    from lengthwise.errors import ConfigError

    from experiments.saved import CellRuns

    CellRuns(tmp_path / "runs", _design(script, tiny))
    more = CellRuns(tmp_path / "runs", _design(script, tiny, seeds=(0, 1, 2)))
    assert len(more.order) == 3 * len(_design(script, tiny).jobs())
    with pytest.raises(ConfigError, match=r"another design \(epochs, train differ\)"):
        CellRuns(tmp_path / "runs", _design(script, tiny, epochs=3,
                                            train={**TINY, "lr": 0.5}))


def test_runs_saved_from_a_start_made_again_with_other_weights_are_refused(script, tiny,
                                                                           tmp_path):
    """The same paths with other contents: the design's ``inputs`` tell them apart."""
    from lengthwise.dflash.recipe import _save_final
    from lengthwise.errors import ConfigError
    from lengthwise.train.device import pick_device

    from experiments.dflash_arms import inputs, run_draft
    from experiments.saved import CellRuns

    design = _design(script, tiny)
    draft = run_draft(design, design.train_config(seed=1, batch=2, steps=1), tmp_path,
                      pick_device("cpu"))
    _save_final(draft, tmp_path / "start" / "final", 7)
    shared = _design(script, tiny, start=str(tmp_path / "start"))
    first = inputs(shared)
    assert set(first) == {"data", "features", "start"}
    assert first["data"] == inputs(design)["data"] and "start" not in inputs(design)
    CellRuns(tmp_path / "runs", shared, inputs=first)
    CellRuns(tmp_path / "runs", shared, inputs=inputs(shared))  # the same contents: reused
    with torch.no_grad():
        draft.fc.weight.add_(1e-3)
    _save_final(draft, tmp_path / "start" / "final", 7)  # made again at the same path
    assert inputs(shared)["start"] != first["start"]
    with pytest.raises(ConfigError, match=r"another design \(inputs differ\)"):
        CellRuns(tmp_path / "runs", shared, inputs=inputs(shared))
