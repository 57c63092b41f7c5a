"""lengthwise's DFlash trainer against the reference trainer (SpecForge), same data and steps.

For every seed, two drafts of the same shape are trained on the same cached target
features, the same micro-batches in the same order (lengthwise's plan, replayed), the
same anchors per sample, the same AdamW settings, learning-rate schedule, clipping and
number of steps:

- ``lengthwise``: ``train_draft`` (what ``lengthwise dflash train --features`` runs), its
  checkpoints kept along the way;
- ``reference``: SpecForge's own ``DFlashDraftModel`` (its initialisation) trained through
  its own ``OnlineDFlashModel`` (its anchor sampling, mask, labels, decayed loss), imported
  from ``--specforge DIR`` (a checkout of sgl-project/SpecForge; nothing of it is copied here).

SpecForge runs on the CPU in float32 with its ``eager`` attention backend (the dense mask
of ``create_dflash_sdpa_mask`` and its eager attention), which SpecForge offers for
devices without flex attention: no part of it is stubbed. At each checkpoint of the
curve, both drafts are evaluated by one evaluator: lengthwise's teacher-forced pass
(:func:`~lengthwise.dflash.teacher_forced.evaluate_blocks`) on every held-out chat at the same
``EVAL_ANCHORS`` anchors (seed 0), the reference's weights read into lengthwise's draft
through the exported layout (:func:`~lengthwise.dflash.load.load_exported`). Before
training, each seed checks that mapping: the reference's initial weights in lengthwise's
draft give the reference's own loss and accuracy on one micro-batch at the same anchors.

The difference (lengthwise minus reference) of each held-out figure is paired by seed
(pooled over the chats) and by chat (averaged over the seeds), each with a 95 %
t-interval (:func:`lengthwise.intervals.t_interval`).

Example::

    $ python benchmarks/reference_trainer.py --specforge /tmp/specforge --steps 80 \\
          --seeds 0 1 2
    $ python benchmarks/reference_trainer.py --render   # REFERENCE_TRAINER_RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from lengthwise.intervals import t_interval  # noqa: E402

JSON_PATH = HERE / "REFERENCE_TRAINER.json"
MD_PATH = HERE / "REFERENCE_TRAINER_RESULTS.md"

#: the shape of every run: a 2-layer block-8 draft on two target layers, 8 anchors a sample
SHAPE = {"draft_layers": 2, "num_features": 2, "block_size": 8, "max_tokens": 2048,
         "max_len": 2048, "grad_accum": 1, "num_anchors": 8, "threads": 2}
#: anchors per held-out chat (drawn from seed 0: the same positions for every draft)
EVAL_ANCHORS = 32
#: block slots per draft forward of the held-out pass
SLOTS_PER_FORWARD = 1024
#: held-out figures, and whether higher is better
FIGURES = {"simulated_acceptance_length": True, "accuracy": True, "loss": False}
TRAINERS = ("lengthwise", "reference")


def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def curve_steps(steps: int) -> list[int]:
    """The checkpoints of the curve: a quarter, half and all of the steps.

    Example::

        >>> curve_steps(80)
        [20, 40, 80]
    """
    return sorted({max(1, steps * k // 4) for k in (1, 2, 4)})


def reference_batch(batch: dict[str, Any], feats: Any) -> dict[str, Any]:
    """A collated lengthwise micro-batch as SpecForge's DFlash forward takes it.

    ``batch``: padded rows (``input_ids``, ``labels``, ``attention_mask``); ``feats``: the
    target's concatenated features of those rows ``(R, C, F)``. Returns ``input_ids``,
    ``hidden_states`` (float32) and ``loss_mask`` (1 where the label is supervised).

    Example::

        >>> import torch
        >>> b = {"input_ids": torch.tensor([[5, 6, 7]]), "labels": torch.tensor([[-100, 6, 7]]),
        ...      "attention_mask": torch.ones(1, 3, dtype=torch.long)}
        >>> r = reference_batch(b, torch.zeros(1, 3, 4))
        >>> r["loss_mask"].tolist(), r["hidden_states"].dtype
        ([[0.0, 1.0, 1.0]], torch.float32)
    """
    import torch

    from lengthwise.dflash.objective import IGNORE

    if "attention_mask" not in batch:
        raise ValueError("the reference trainer takes padded rows, not packed ones")
    mask = (batch["labels"] != IGNORE) & batch["attention_mask"].bool()
    if feats.shape[:2] != batch["input_ids"].shape:
        raise ValueError(f"features {tuple(feats.shape)} do not match the rows "
                         f"{tuple(batch['input_ids'].shape)}")
    return {"input_ids": batch["input_ids"].long(), "hidden_states": feats.to(torch.float32),
            "loss_mask": mask.to(torch.float32)}


def _specforge(folder: str) -> dict[str, Any]:
    """SpecForge's draft class and training wrapper, imported from ``folder``; its commit."""
    sys.path.insert(0, str(Path(folder).resolve()))
    from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel
    from specforge.modeling.draft.dflash import DFlashDraftModel

    try:
        commit = subprocess.run(["git", "-C", folder, "rev-parse", "HEAD"], check=True,
                                capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {"draft": DFlashDraftModel, "online": OnlineDFlashModel, "commit": commit}


class Setup:
    """What both trainers share: data, split, target, cache, the plan's settings."""

    def __init__(self, a: argparse.Namespace, seed: int) -> None:
        from lengthwise.dflash.features import open_features
        from lengthwise.dflash.prepared import open_prepared
        from lengthwise.dflash.train_config import DFlashTrainConfig

        from experiments.held_out_chats import held_out_chats

        self.a, self.seed = a, seed
        every = curve_steps(a.steps)[0]  # every checkpoint kept: the curve reads them
        self.cfg = DFlashTrainConfig(steps=a.steps, seed=seed, progress=False,
                                     checkpoint_every=every,
                                     keep_checkpoints=a.steps // every + 1, **SHAPE)
        self.data = open_prepared(a.prepared)
        self.chats = held_out_chats(self.data, self.cfg, a.eval_samples, split_seed=a.split_seed)
        self.cache = open_features(a.features, verify=False)
        self.slot_counts = [self._slot_counts(int(j)) for j in self.chats.ids]

    def _slot_counts(self, j: int) -> list[int]:
        """Supervised slots per block position of held-out chat ``j`` at the evaluation's
        anchors (the same for every draft): the weights that pool its accuracies."""
        from lengthwise.dflash.blocks import make_blocks
        from lengthwise.dflash.objective import IGNORE, default_gamma

        ((batch, rows),) = self.chats.batches(j)
        b = self.cfg.block_size
        blocks = make_blocks(batch, rows, step=0, seed=0, num_anchors=EVAL_ANCHORS,
                             block_size=b, gamma=default_gamma(b))
        return [int(n) for n in (blocks.labels != IGNORE).sum(dim=(0, 1))[1:]]

    def target(self, folder: str, layers: list[int]) -> Any:
        from lengthwise.dflash.target import Target, load_target

        return Target(load_target(folder), layers=layers)

    def evaluate(self, draft: Any, target: Any) -> dict[str, list[Any]]:
        """Held-out figures of ``draft`` per chat, at the same anchors for every draft."""
        return self.chats.figures(draft, target, self.cache,
                                  ("loss", "weight", "accuracy", "count",
                                   "simulated_acceptance_length", "slot_accuracy"),
                                  num_anchors=EVAL_ANCHORS, seed=0,
                                  head_chunk=self.cfg.head_chunk,
                                  slots_per_forward=SLOTS_PER_FORWARD)

    def plan(self) -> list[tuple[dict[str, Any], list[list[int]]]]:
        """The micro-batches of every step as the lengthwise run takes them (grad_accum 1)."""
        from lengthwise.train.loop import StepBatches, make_collator, make_sampler

        cfg = self.cfg
        lengths = np.minimum(self.data.lengths[self.chats.train], cfg.max_len)
        sampler = make_sampler("stratified", lengths, cfg)
        collate = make_collator("stratified", cfg, sampler)
        steps = StepBatches(sampler, cfg.grad_accum)
        out = []
        for _ in range(cfg.steps):
            (rows,) = steps.next()
            batch = collate([[self._sample(i) for i in row] for row in rows])
            out.append((batch, rows))
        return out

    def _sample(self, i: int) -> dict[str, np.ndarray]:
        return {k: v[: self.cfg.max_len]
                for k, v in self.data.sample(int(self.chats.train[i])).items()}

    def train_features(self, layers: list[int]) -> Any:
        from lengthwise.dflash.features import CachedRows

        return CachedRows(self.cache, layers, lambda sid: int(self.chats.train[sid]))


def train_lengthwise(s: Setup, work: Path) -> dict[str, Any]:
    """``train_draft`` from the cache; each checkpoint of the curve evaluated."""
    import torch

    from lengthwise.dflash.load import trained_draft
    from lengthwise.dflash.recipe import train_draft
    from lengthwise.dflash.train_config import RunSettings

    torch.set_num_threads(2)
    out = work / f"lengthwise_{s.seed}"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    summary = train_draft(s.cfg, RunSettings(
        target=s.a.target, data=s.a.prepared, out=str(out), eval_samples=s.a.eval_samples,
        eval_every=0, features=s.a.features, split_seed=s.a.split_seed), progress=False)
    seconds = time.perf_counter() - t0
    log = [json.loads(line) for line in open(summary["log"]) if '"loss"' in line]
    draft0, _ = trained_draft(summary["final"])
    target = s.target(summary["target"], draft0.config.target_layers)
    curve = {}
    for step in curve_steps(s.cfg.steps):
        path = out / "final" if step == s.cfg.steps else out / "checkpoints" / f"step_{step}"
        draft, _ = trained_draft(path)
        curve[str(step)] = s.evaluate(draft, target)
    return {"seconds": seconds, "target": summary["target"],
            "skipped_steps": sum(bool(r.get("skipped")) for r in log),
            "train_loss": [r["loss"] for r in log], "lr": [r["lr"] for r in log],
            "real_tokens": [r["real_tokens"] for r in log], "curve": curve}


def reference_config(dcfg: Any) -> Any:
    """The Qwen3 config SpecForge's draft is built from: the exported one of ``dcfg``."""
    import transformers

    from lengthwise.dflash.export import exported_config

    c = exported_config(dcfg)
    c.pop("architectures")
    config = transformers.Qwen3Config(**c)
    config._attn_implementation = "eager"
    return config


def to_lengthwise(ref_draft: Any, dcfg: Any, folder: Path) -> Any:
    """The reference draft's weights in lengthwise's draft, read from the exported layout."""
    from safetensors.torch import save_file

    from lengthwise.dflash.export import exported_config
    from lengthwise.dflash.load import load_exported

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().clone() for k, v in ref_draft.state_dict().items()
             if not k.startswith("rotary_emb.")}
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(exported_config(dcfg)), encoding="utf-8")
    return load_exported(folder)


def mapping_check(online: Any, ref_draft: Any, dcfg: Any, target: Any, batch: dict[str, Any],
                  rows: list[list[int]], feats: Any, seed: int, folder: Path) -> dict[str, Any]:
    """The reference's loss and accuracy on one micro-batch against lengthwise's, same
    weights and anchors (the reference's anchor draw replaced for this check only)."""
    import torch

    from lengthwise.dflash.blocks import make_blocks
    from lengthwise.dflash.loss import block_hidden, head_loss

    ours = to_lengthwise(ref_draft, dcfg, folder)
    blocks = make_blocks(batch, rows, step=0, seed=seed, num_anchors=online.num_anchors,
                         block_size=dcfg.block_size, gamma=dcfg.gamma)
    keep = blocks.anchors >= 0
    fixed = (torch.where(keep, blocks.anchors, 0), keep)
    rb = reference_batch(batch, feats)
    online.eval()
    online._sample_anchor_positions = lambda *args, **kwargs: fixed
    try:
        with torch.no_grad():
            ref_loss, ref_acc, _ = online(**rb)
            hidden = block_hidden(ours, target, blocks, feats=rb["hidden_states"])
            s = head_loss(hidden, target.lm_head, blocks.labels, blocks.weights)
    finally:
        del online._sample_anchor_positions
        online.train()
    loss = float(s.weighted) / s.weight
    acc = s.correct / s.count
    return {"reference_loss": float(ref_loss), "lengthwise_loss": loss,
            "reference_accuracy": float(ref_acc), "lengthwise_accuracy": acc,
            "abs_loss_difference": abs(float(ref_loss) - loss)}


def draft_shape(s: Setup, folder: str) -> tuple[Any, Any]:
    """The target (its mask token's row added when missing) and the draft config the
    recipe builds for it (``_models`` and ``new_draft`` of ``lengthwise.dflash.recipe``)."""
    from lengthwise.dflash.mask_token import ensure_mask_token
    from lengthwise.dflash.model import DFlashConfig
    from lengthwise.dflash.objective import target_layer_ids
    from lengthwise.dflash.target import Target, load_target, load_tokenizer

    cfg = s.cfg
    model = load_target(folder)
    layers = target_layer_ids(model.config.num_hidden_layers, cfg.num_features)
    mask = ensure_mask_token(load_tokenizer(folder), model)
    target = Target(model, layers=layers)
    dcfg = DFlashConfig.from_target(model.config, num_layers=cfg.draft_layers,
                                    block_size=cfg.block_size, gamma=cfg.gamma,
                                    target_layers=layers, mask_token_id=mask.id)
    dcfg.target_vocab_size = int(target.embed.weight.shape[0])
    return target, dcfg


def train_reference(s: Setup, sf: dict[str, Any], work: Path) -> dict[str, Any]:
    """SpecForge's draft and objective on lengthwise's plan, optimizer and schedule."""
    import torch

    from lengthwise.train.schedule import lr_factor

    torch.set_num_threads(2)
    cfg = s.cfg
    target, dcfg = draft_shape(s, s.a.target)
    layers, mask_id = dcfg.target_layers, dcfg.mask_token_id
    torch.manual_seed(cfg.seed)
    ref_draft = sf["draft"](reference_config(dcfg)).float().train()
    online = sf["online"](draft_model=ref_draft, target_lm_head=target.lm_head,
                          target_embed_tokens=target.embed, mask_token_id=mask_id,
                          block_size=cfg.block_size, attention_backend="eager",
                          num_anchors=cfg.num_anchors, loss_decay_gamma=dcfg.gamma,
                          loss_type="dflash")
    feats_of = s.train_features(layers)
    plan = s.plan()
    tmp = Path(tempfile.mkdtemp(prefix=f"ref_{s.seed}_", dir=work))
    batch0, rows0 = plan[0]
    check = mapping_check(online, ref_draft, dcfg, target, batch0, rows0,
                          feats_of(batch0, rows0)[0], cfg.seed, tmp / "check")
    params = [p for p in ref_draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(  # lengthwise's optimizer settings (TrainLoop)
        [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
         {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: lr_factor(k, steps=cfg.steps, warmup=cfg.warmup_steps,
                                       schedule=cfg.schedule))
    losses, lrs, tokens, curve = [], [], [], {}
    marks = set(curve_steps(cfg.steps))
    seconds = 0.0  # training steps only: the held-out passes left out
    for step, (batch, rows) in enumerate(plan, start=1):
        t0 = time.perf_counter()
        rb = reference_batch(batch, feats_of(batch, rows)[0])
        loss, _, _ = online(**rb)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.clip)
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        tokens.append(int(batch["real_tokens"]))
        seconds += time.perf_counter() - t0
        if step in marks:
            ours = to_lengthwise(ref_draft, dcfg, tmp / f"step_{step}")
            curve[str(step)] = s.evaluate(ours, target)
    shutil.rmtree(tmp, ignore_errors=True)
    return {"seconds": seconds, "mapping_check": check, "train_loss": losses,
            "lr": lrs, "real_tokens": tokens, "curve": curve, "target_layers": layers,
            "mask_token_id": mask_id}


def pooled(per: dict[str, list[Any]], slot_counts: list[list[int]]) -> dict[str, Any]:
    """Figures over every held-out chat: weighted loss, accuracy and per-slot accuracy
    (``slot_counts``: supervised slots per chat and block position)."""
    from lengthwise.dflash.objective import simulated_acceptance_length

    w = np.asarray(per["weight"], dtype=np.float64)
    n = np.asarray(per["count"], dtype=np.float64)
    counts = np.asarray(slot_counts, dtype=np.float64)
    slots = np.nan_to_num(np.asarray(per["slot_accuracy"], dtype=np.float64))
    slot = (slots * counts).sum(axis=0) / counts.sum(axis=0)
    return {"loss": float(np.dot(per["loss"], w) / w.sum()),
            "accuracy": float(np.dot(per["accuracy"], n) / n.sum()),
            "slot_accuracy": [float(x) for x in slot],
            "simulated_acceptance_length": simulated_acceptance_length(slot)}


def differences(res: dict[str, Any]) -> dict[str, Any]:
    """lengthwise minus reference at every checkpoint: paired by seed and by chat."""
    runs = res.get("runs", {})
    seeds = sorted(s for s in runs if all(t in runs[s] for t in TRAINERS))
    out: dict[str, Any] = {}
    if not seeds:
        return out
    sc = res["held_out_slot_counts"]
    for step in runs[seeds[0]]["lengthwise"]["curve"]:
        row: dict[str, Any] = {}
        for fig in FIGURES:
            by_seed = [pooled(runs[s]["lengthwise"]["curve"][step], sc)[fig]
                       - pooled(runs[s]["reference"]["curve"][step], sc)[fig] for s in seeds]
            by_chat = np.mean([np.subtract(runs[s]["lengthwise"]["curve"][step][fig],
                                           runs[s]["reference"]["curve"][step][fig])
                               for s in seeds], axis=0)
            row[fig] = {"by_seed": t_interval(by_seed), "by_chat": t_interval(list(by_chat))}
        slot_diff = [np.subtract(pooled(runs[s]["lengthwise"]["curve"][step], sc)["slot_accuracy"],
                                 pooled(runs[s]["reference"]["curve"][step], sc)["slot_accuracy"])
                     for s in seeds]
        row["slot_accuracy"] = [t_interval([float(d[k]) for d in slot_diff])
                                for k in range(len(slot_diff[0]))]
        chat_diff = np.nanmean([np.subtract(runs[s]["lengthwise"]["curve"][step]["slot_accuracy"],
                                            runs[s]["reference"]["curve"][step]["slot_accuracy"])
                                for s in seeds], axis=0)  # (chats, positions)
        row["slot_accuracy_by_chat"] = [t_interval([float(x) for x in chat_diff[:, k]])
                                        for k in range(chat_diff.shape[1])]
        out[step] = row
    return out


def _save(res: dict[str, Any], path: Path) -> None:
    res["differences"] = differences(res)
    path.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")


def run(a: argparse.Namespace) -> dict[str, Any]:
    """Both trainers for every seed not in the JSON yet, saved as each finishes."""
    sf = _specforge(a.specforge)
    path = Path(a.json)
    res = json.loads(path.read_text()) if path.is_file() else {}
    setup = {"prepared": a.prepared, "features": a.features, "target": a.target,
             "steps": a.steps, "eval_samples": a.eval_samples, "split_seed": a.split_seed,
             "shape": SHAPE, "eval_anchors": EVAL_ANCHORS, "curve": curve_steps(a.steps),
             "specforge_commit": sf["commit"]}
    if res.get("setup") not in (None, setup):
        raise SystemExit(f"{path} holds runs of other settings; give another --json")
    res["setup"] = setup
    res.setdefault("runs", {})
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    for seed in a.seeds:
        if all(t in res["runs"].get(str(seed), {}) for t in TRAINERS):
            continue
        s = Setup(a, seed)
        res["held_out_chats"] = [int(j) for j in s.chats.ids]
        res["held_out_slot_counts"] = s.slot_counts
        part = work / f"reference_{seed}.json"
        part.unlink(missing_ok=True)
        _say(f"seed {seed}: both trainers (the reference in its own process)")
        child = subprocess.Popen([sys.executable, __file__, "--trainer", "reference",
                                  "--part", str(part), "--seeds", str(seed),
                                  *_common_args(a)])
        ours = train_lengthwise(s, work)
        _say(f"seed {seed}: lengthwise done ({ours['seconds']:.0f} s)")
        if child.wait() != 0:
            raise SystemExit(f"the reference run of seed {seed} failed (exit {child.returncode})")
        ref = json.loads(part.read_text(encoding="utf-8"))
        ours["same_batches"] = ours["real_tokens"] == ref["real_tokens"]
        ours["same_lr"] = bool(np.allclose(ours["lr"], ref["lr"], rtol=1e-12, atol=0))
        res["runs"][str(seed)] = {"lengthwise": ours, "reference": ref}
        _save(res, path)
        _say(f"seed {seed}: done ({ref['seconds']:.0f} s for the reference)")
    return res


def _common_args(a: argparse.Namespace) -> list[str]:
    return ["--specforge", a.specforge, "--prepared", a.prepared, "--target", a.target,
            "--features", a.features, "--work", a.work, "--steps", str(a.steps),
            "--eval-samples", str(a.eval_samples), "--split-seed", str(a.split_seed)]


def run_reference(a: argparse.Namespace) -> None:
    """One reference run (``--trainer reference``): its result written to ``--part``."""
    sf = _specforge(a.specforge)
    s = Setup(a, a.seeds[0])
    _say(f"seed {s.seed}: reference")
    ref = train_reference(s, sf, Path(a.work))
    Path(a.part).write_text(json.dumps(ref) + "\n", encoding="utf-8")


def _fmt(iv: dict[str, Any], digits: int = 3) -> str:
    if iv.get("mean") is None:
        return "n/a"
    half = iv.get("half")
    pm = "" if half is None or not math.isfinite(half) else f" ± {half:.{digits}f}"
    return f"{iv['mean']:+.{digits}f}{pm}"


def render_md(res: dict[str, Any]) -> str:
    """REFERENCE_TRAINER_RESULTS.md from the JSON."""
    s = res["setup"]
    runs = res["runs"]
    seeds = sorted(runs, key=int)
    sh = s["shape"]
    sc = res["held_out_slot_counts"]
    lines = [
        "# lengthwise's DFlash trainer against the reference trainer (SpecForge)",
        "",
        "Generated by `python benchmarks/reference_trainer.py --render` from "
        "`REFERENCE_TRAINER.json`; measured with `python benchmarks/reference_trainer.py "
        f"--specforge DIR --steps {s['steps']} --seeds {' '.join(seeds)}`.",
        "",
        f"- Reference: sgl-project/SpecForge at commit `{s['specforge_commit']}`: its "
        "`DFlashDraftModel` (its own initialisation) and `OnlineDFlashModel` (anchor "
        "sampling, mask, labels, decayed cross-entropy), imported from the checkout.",
        "- It runs on the CPU in float32 with its `eager` attention backend: the dense mask of "
        "`create_dflash_sdpa_mask` and its eager attention, which SpecForge offers where flex "
        "attention is missing. Nothing of it is stubbed.",
        f"- Data: `{s['prepared']}`, features read from the cache `{s['features']}`, target "
        f"`{s['target']}`. The same {s['eval_samples']} chats are held out in every run "
        f"(split seed {s['split_seed']}, as `benchmarks/draft_levers.py`).",
        f"- Draft: {sh['draft_layers']} layers, block {sh['block_size']}, "
        f"{sh['num_features']} target layers, {sh['num_anchors']} anchors per sample.",
        f"- Both train {s['steps']} steps on the same micro-batches in the same order "
        f"(lengthwise's stratified plan of at most {sh['max_tokens']} tokens, replayed). "
        "They share AdamW (betas 0.9, 0.95, no weight decay), the warm-up-then-cosine "
        "schedule, and clipping at 1.0.",
        "- SpecForge's own recipe differs in its optimizer defaults (AdamW betas 0.9, 0.999; "
        "cosine to 0; warm-up steps rounded down): they were set to lengthwise's, so the "
        "comparison is of the draft, its initialisation and the objective. The reference "
        "draws its own anchors (its sampler), as many per sample as lengthwise.",
        f"- Held-out evaluation: lengthwise's teacher-forced pass at {s['eval_anchors']} "
        "anchors per chat (seed 0, the same positions for every draft). The reference's "
        "weights are read into lengthwise's draft through the exported layout.",
        "",
        "## Checks",
        "",
        "| seed | same batches | same LR | skipped steps (lengthwise) | "
        "mapping: reference loss | lengthwise loss on its weights | abs. difference |",
        "|---|---|---|---|---|---|---|",
    ]
    for seed in seeds:
        r = runs[seed]
        c = r["reference"]["mapping_check"]
        lines.append(f"| {seed} | {r['lengthwise']['same_batches']} | "
                     f"{r['lengthwise']['same_lr']} | {r['lengthwise']['skipped_steps']} | "
                     f"{c['reference_loss']:.5f} | {c['lengthwise_loss']:.5f} | "
                     f"{c['abs_loss_difference']:.2e} |")
    lines += ["", "## Held-out curve (pooled over the chats; mean over seeds)", "",
              "| step | trainer | loss | accuracy | simulated acceptance | "
              "accuracy per block position 1..7 |", "|---|---|---|---|---|---|"]
    for step in map(str, s["curve"]):
        for t in TRAINERS:
            p = [pooled(runs[seed][t]["curve"][step], sc) for seed in seeds]
            slots = np.mean([x["slot_accuracy"] for x in p], axis=0)
            lines.append(
                f"| {step} | {t} | {np.mean([x['loss'] for x in p]):.3f} | "
                f"{np.mean([x['accuracy'] for x in p]):.3f} | "
                f"{np.mean([x['simulated_acceptance_length'] for x in p]):.3f} | "
                + " ".join(f"{v:.3f}" for v in slots) + " |")
    diffs = res.get("differences", {})
    lines += ["", "## lengthwise minus reference (95 % t-intervals)", "",
              f"By seed: the pooled figure's difference per seed ({len(seeds)} "
              f"seed{'s' if len(seeds) > 1 else ''}; no interval from one). By "
              "chat: the difference per held-out chat, averaged over the seeds.", "",
              "| step | figure | by seed | by chat |", "|---|---|---|---|"]
    for step, row in diffs.items():
        for fig in FIGURES:
            lines.append(f"| {step} | {fig} | {_fmt(row[fig]['by_seed'])} | "
                         f"{_fmt(row[fig]['by_chat'])} |")
    last = str(s["curve"][-1])
    if last in diffs:
        d = diffs[last]
        n = len(d["slot_accuracy"])
        lines += ["", f"Accuracy per block position at step {last}, lengthwise minus "
                  "reference:", "",
                  "| position | " + " | ".join(str(k + 1) for k in range(n)) + " |",
                  "|---" * (1 + n) + "|",
                  "| by seed | " + " | ".join(_fmt(iv) for iv in d["slot_accuracy"]) + " |",
                  "| by chat | " + " | ".join(_fmt(iv) for iv in d["slot_accuracy_by_chat"])
                  + " |", "", "## Verdict at the last step", ""]
        for fig, higher in FIGURES.items():
            iv = d[fig]["by_chat"]
            if iv.get("lo") is None or not math.isfinite(iv["half"]):
                continue
            better = iv["lo"] > 0 if higher else iv["hi"] < 0
            worse = iv["hi"] < 0 if higher else iv["lo"] > 0
            word = ("lengthwise better" if better else "lengthwise worse" if worse
                    else "no difference resolved")
            lines.append(f"- {fig}: lengthwise minus reference {_fmt(iv)} over "
                         f"{iv['n']} held-out chats: {word}.")
    lines += ["", "## Training loss (mean over the steps of each window and over seeds)", "",
              "| steps | lengthwise | reference |", "|---|---|---|"]
    width = max(1, s["steps"] // 8)
    for lo in range(0, s["steps"], width):
        cells = [np.mean([np.mean(runs[seed][t]["train_loss"][lo:lo + width])
                          for seed in seeds]) for t in TRAINERS]
        lines.append(f"| {lo + 1}-{min(lo + width, s['steps'])} | {cells[0]:.3f} | "
                     f"{cells[1]:.3f} |")
    lines += ["", "## Training time (seconds)", "",
              "Both trainers ran at once, in two processes on a shared, loaded 2-core "
              "machine: these times are not a speed comparison.", "",
              "| seed | lengthwise (train_draft, all of it) | reference (its steps) |",
              "|---|---|---|"]
    for seed in seeds:
        r = runs[seed]
        lines.append(f"| {seed} | {r['lengthwise']['seconds']:.0f} | "
                     f"{r['reference']['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--specforge", help="a checkout of sgl-project/SpecForge")
    p.add_argument("--prepared", default="/work/cache/smol/prepared120")
    p.add_argument("--target", default="/work/cache/smol/target")
    p.add_argument("--features", default="/work/cache/smol/fc/features")
    p.add_argument("--work", default="/tmp/reftrainer/runs", help="run folders")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--eval-samples", type=int, default=16)
    p.add_argument("--split-seed", type=int, default=0)
    p.add_argument("--json", default=str(JSON_PATH))
    p.add_argument("--md", default=str(MD_PATH))
    p.add_argument("--render", action="store_true", help="only write the Markdown from the JSON")
    p.add_argument("--trainer", choices=("both", "reference"), default="both",
                   help="reference: one reference run only, written to --part")
    p.add_argument("--part", help="where --trainer reference writes its result")
    a = p.parse_args(argv)
    if a.trainer == "reference":
        run_reference(a)
        return
    if a.render:  # the differences recomputed from the runs, the JSON rewritten with them
        res = json.loads(Path(a.json).read_text(encoding="utf-8"))
        _save(res, Path(a.json))
    else:
        if not a.specforge:
            p.error("--specforge DIR is needed to train (or give --render)")
        res = run(a)
    Path(a.md).write_text(render_md(res), encoding="utf-8")
    print(f"wrote {a.md}")


if __name__ == "__main__":
    main()
