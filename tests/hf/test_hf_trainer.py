"""transformers.Trainer on planned micro-batches: a tiny random Llama, resume, bad input, 2 ranks.

Run as a script, this file is one rank of a 2-process Trainer run (see ``_rank_main``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from _ports import free_port, rank_finished, script_env
from torch.utils.data import Dataset

pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainingArguments,
)

from lengthwise.hf.trainer import (  # noqa: E402
    STATE_FILE,
    LengthwiseTrainer,
    make_sampler,
    use_lengthwise,
)
from lengthwise.planning.config import PlanConfig  # noqa: E402
from lengthwise.planning.plan import plan_epoch  # noqa: E402
from lengthwise.pytorch.collate import PadCollator  # noqa: E402
from lengthwise.pytorch.sampler import ResumeError  # noqa: E402

VOCAB = 64
ACCUM = 2
PLAN = PlanConfig(max_tokens=256, pad_multiple=8)


def _lengths(n=64):
    return np.random.default_rng(0).integers(2, 40, n)


class Tokens(Dataset):
    """Row i: random token ids of length lengths[i], and its own index."""

    def __init__(self, lengths):
        self.lengths = lengths

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        return {"input_ids": rng.integers(1, VOCAB, self.lengths[i]).tolist(), "index": i}


class Recorder:
    """A collator that records the sample indices of every micro-batch it builds."""

    def __init__(self):
        self.seen: list[list[int]] = []
        self.pad = PadCollator(pad_token_id=0, pad_multiple=8, metadata=False)

    def __call__(self, samples):
        self.seen.append([s["index"] for s in samples])
        return self.pad(samples)


def _model():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))


def _args(out, **kw):
    base = dict(output_dir=str(out), use_cpu=True, report_to=[], num_train_epochs=1,
                gradient_accumulation_steps=ACCUM, learning_rate=1e-3, logging_steps=1,
                save_strategy="no", remove_unused_columns=False, disable_tqdm=True, seed=3)
    base.update(kw)
    return TrainingArguments(**base)


def _trainer(out, lengths=None, plan=PLAN, **kw):
    lengths = _lengths() if lengths is None else lengths
    rec = Recorder()
    trainer = LengthwiseTrainer(model=_model(), args=_args(out, **kw),
                                train_dataset=Tokens(_lengths()), data_collator=rec,
                                lengths=lengths, plan=plan)
    return trainer, rec


def _plan_batches(epoch=0, world=1, rank=0, seed=3):
    plan = plan_epoch(_lengths(), replace(PLAN, world_size=world, grad_accum=ACCUM), seed=seed,
                      epoch=epoch)
    return [b.tolist() for b in plan.rank_batches(rank)], plan


def test_trainer_trains_a_tiny_llama_on_the_planned_batches(tmp_path):
    trainer, rec = _trainer(tmp_path)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    out = trainer.train()
    want, plan = _plan_batches()
    assert rec.seen == want  # every micro-batch, in the planned order
    assert out.global_step == -(-plan.num_batches // ACCUM)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == out.global_step and np.isfinite(losses).all()
    after = list(trainer.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert trainer.lengthwise_sampler.config.grad_accum == ACCUM
    assert trainer.lengthwise_sampler.seed == 3  # TrainingArguments.seed


def _counts(batches):
    lengths = _lengths()
    return sum(len(b) for b in batches), int(sum(lengths[i] for b in batches for i in b))


def test_final_metrics_count_the_planned_samples_and_tokens(tmp_path):
    # Trainer alone would count max_steps * per_device_train_batch_size * accum = 3 * 7 * 2
    trainer, rec = _trainer(tmp_path, max_steps=3, per_device_train_batch_size=7,
                            logging_steps=1000)
    out = trainer.train()
    want, _ = _plan_batches()
    samples, tokens = _counts(want[: 3 * ACCUM])
    # the loader collates one micro-batch ahead; only the trained ones count
    assert rec.seen[: 3 * ACCUM] == want[: 3 * ACCUM] and samples != 3 * 7 * ACCUM
    m = out.metrics
    assert (m["train_samples"], m["train_tokens"]) == (samples, tokens)
    assert m["train_samples_per_second"] == round(samples / m["train_runtime"], 3)
    assert m["train_tokens_per_second"] == round(tokens / m["train_runtime"], 3)
    assert out.training_loss == m["train_loss"]
    final = trainer.state.log_history[-1]  # what the callbacks printed
    assert final["train_samples"] == samples and final["train_loss"] == m["train_loss"]


def test_use_lengthwise_on_an_existing_trainer(tmp_path):
    rec = Recorder()
    trainer = Trainer(model=_model(), args=_args(tmp_path, data_seed=5),
                      train_dataset=Tokens(_lengths()), data_collator=rec)
    sampler = use_lengthwise(trainer, _lengths(), PLAN)
    assert sampler.seed == 5  # data_seed wins over seed
    out = trainer.train()
    assert rec.seen == _plan_batches(seed=5)[0]
    assert out.metrics["train_samples"] == len(_lengths())  # one whole epoch
    assert out.metrics["train_tokens"] == int(_lengths().sum())


def _trainer_sampler(out, config, **keywords):
    trainer = LengthwiseTrainer(model=_model(), args=_args(out), train_dataset=Tokens(_lengths()),
                                data_collator=Recorder(), lengths=_lengths(), plan=config,
                                **keywords)
    return trainer.lengthwise_sampler


@pytest.mark.parametrize("make, who", [
    (_trainer_sampler, "LengthwiseTrainer"),
    (lambda out, config, **kw: use_lengthwise(
        Trainer(model=_model(), args=_args(out), train_dataset=Tokens(_lengths())), _lengths(),
        config, **kw), "use_lengthwise"),
    (lambda out, config, **kw: make_sampler(
        Trainer(model=_model(), args=_args(out), train_dataset=Tokens(_lengths())), _lengths(),
        config, **kw), "make_sampler"),
])
def test_plan_options_as_keywords_train_as_their_config(tmp_path, plan_keywords, make, who):
    def build(config, **keywords):
        sampler = make(tmp_path, config, **keywords)
        return (sampler.seed, sampler.grad_accum), list(sampler)

    plan_keywords(build, who, max_tokens=256, pad_multiple=8)


def test_trainer_resume_continues_with_the_plan(tmp_path):
    e0, plan = _plan_batches(0)
    e1, _ = _plan_batches(1)
    steps_per_epoch = -(-plan.num_batches // ACCUM)
    at = steps_per_epoch + 2  # a checkpoint two optimizer steps into epoch 1
    first, rec1 = _trainer(tmp_path / "a", num_train_epochs=2, save_strategy="steps",
                           save_steps=at)
    first.train()
    assert rec1.seen == e0 + e1
    checkpoint = tmp_path / "a" / f"checkpoint-{at}"
    with open(checkpoint / STATE_FILE) as fh:
        saved = json.load(fh)
    done = 2 * ACCUM  # micro-batches of epoch 1 before the checkpoint
    assert (saved["epoch"], saved["yielded"]) == (1, done)

    second, rec2 = _trainer(tmp_path / "a", num_train_epochs=2, save_strategy="no")
    resumed = second.train(resume_from_checkpoint=str(checkpoint))
    assert rec2.seen == e1[done:]
    # the resumed call counts what it trained, not the steps before the checkpoint
    assert (resumed.metrics["train_samples"], resumed.metrics["train_tokens"]) == _counts(
        e1[done:])
    for a, b in zip(first.model.parameters(), second.model.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_resume_with_another_plan_is_refused(tmp_path):
    first, _ = _trainer(tmp_path, save_strategy="steps", save_steps=2, max_steps=2)
    first.train()
    checkpoint = tmp_path / "checkpoint-2"
    other, _ = _trainer(tmp_path, plan=PlanConfig(max_tokens=128, pad_multiple=8))
    with pytest.raises(ResumeError, match="max_tokens is 128, the saved state has 256"):
        other.train(resume_from_checkpoint=str(checkpoint))
    # a checkpoint of another world size cannot be placed by Trainer's step count
    path = checkpoint / STATE_FILE
    saved = json.loads(path.read_text())
    path.write_text(json.dumps({**saved, "world_size": 4}))
    same, _ = _trainer(tmp_path)
    with pytest.raises(ResumeError, match="trained on 4 data-parallel ranks"):
        same.train(resume_from_checkpoint=True)


def test_lengths_that_do_not_match_the_training_set(tmp_path):
    with pytest.raises(ValueError, match="lengths for 63 samples but the dataset has 64 rows"):
        _trainer(tmp_path, lengths=_lengths()[:-1])


def test_trainer_settings_that_would_shard_again_are_refused(tmp_path):
    with pytest.raises(ValueError, match="split_batches=True cannot be used"):
        _trainer(tmp_path, accelerator_config={"split_batches": True})
    with pytest.raises(ValueError, match=r"\['grad_accum'\] come from the trainer"):
        _trainer(tmp_path, plan=replace(PLAN, grad_accum=4))


# ---------------------------------------------------------------- TRL's SFTTrainer


def _sft_trainer(out, **kw):
    """TRL's SFTTrainer on 64 texts, with a word-level tokenizer built here (no downloads)."""
    import datasets
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    words = {"<pad>": 0, "</s>": 1, **{f"w{i}": i + 2 for i in range(VOCAB - 2)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>")
    rng = np.random.default_rng(1)
    texts = [f"w{i} " + " ".join(f"w{j}" for j in rng.integers(0, VOCAB - 2, n))
             for i, n in enumerate(_lengths())]  # the first word makes every row unique
    args = SFTConfig(output_dir=str(out), use_cpu=True, report_to=[], num_train_epochs=1,
                     gradient_accumulation_steps=ACCUM, learning_rate=1e-3, logging_steps=1000,
                     save_strategy="no", disable_tqdm=True, seed=3, max_length=None, **kw)
    trainer = SFTTrainer(model=_model(), args=args,
                         train_dataset=datasets.Dataset.from_dict({"text": texts}),
                         processing_class=tokenizer)
    rows = {tuple(ids): i for i, ids in enumerate(trainer.train_dataset["input_ids"])}
    seen: list[list[int]] = []
    collate = trainer.data_collator

    def record(examples):
        seen.append([rows[tuple(e["input_ids"])] for e in examples])
        return collate(examples)

    trainer.data_collator = record
    return trainer, seen


def _sft_lengths(trainer):
    from lengthwise.hf.lengths import compute_lengths

    return compute_lengths(trainer.train_dataset, cache=False)


def test_trl_sft_trainer_trains_on_the_planned_batches(tmp_path):
    pytest.importorskip("trl")
    trainer, seen = _sft_trainer(tmp_path)
    lengths = _sft_lengths(trainer)
    sampler = use_lengthwise(trainer, lengths, PLAN)
    out = trainer.train()
    plan = plan_epoch(lengths, replace(PLAN, grad_accum=ACCUM), seed=3, epoch=0)
    assert seen == [b.tolist() for b in plan.rank_batches(0)]
    assert sorted(i for b in seen for i in b) == list(range(len(lengths)))
    assert out.global_step == -(-plan.num_batches // ACCUM) and sampler.seed == 3
    assert (out.metrics["train_samples"], out.metrics["train_tokens"]) == (
        len(lengths), int(lengths.sum()))


# ---------------------------------------------------------------- two processes


class _RawLoss(LengthwiseTrainer):
    """Keeps the final train_loss as this rank computed it, before the ranks agree on one."""

    raw_loss = None

    def log(self, logs, *args, **kwargs):
        if "train_runtime" in logs:
            self.raw_loss = logs["train_loss"]
        super().log(logs, *args, **kwargs)


def _rank_main(out_dir: str) -> None:
    rec = Recorder()
    # no logging step before the end: each rank's final loss is its own until reduced
    args = _args(out_dir, ddp_backend="gloo", logging_steps=1000)
    trainer = _RawLoss(model=_model(), args=args, train_dataset=Tokens(_lengths()),
                       data_collator=rec, lengths=_lengths(), plan=PLAN)
    out = trainer.train()
    checksum = float(sum(p.double().sum() for p in trainer.model.parameters()))
    result = {"seen": rec.seen, "steps": out.global_step, "world": args.world_size,
              "checksum": checksum, "loss": out.training_loss, "raw_loss": trainer.raw_loss,
              "samples": out.metrics["train_samples"], "tokens": out.metrics["train_tokens"]}
    try:
        import trl  # noqa: F401
    except ImportError:
        pass
    else:
        sft, seen = _sft_trainer(os.path.join(out_dir, "sft"), ddp_backend="gloo")
        use_lengthwise(sft, _sft_lengths(sft), PLAN)
        sft_out = sft.train()
        result.update(sft_seen=seen, sft_loss=sft_out.training_loss,
                      sft_samples=sft_out.metrics["train_samples"])
    with open(os.path.join(out_dir, f"rank{args.process_index}.json"), "w") as fh:
        json.dump(result, fh)


@pytest.mark.slow
def test_trainer_two_processes_gloo(tmp_path):
    port = free_port()
    procs = []
    for rank in range(2):
        env = script_env(dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                              LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=str(port)))
        procs.append(subprocess.Popen([sys.executable, __file__, str(tmp_path)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (p, out) in enumerate(zip(procs, outs, strict=True)):
        assert rank_finished(p.returncode, out, tmp_path / f"rank{rank}.json"), out[-3000:]
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in res] == [2, 2]
    assert res[0]["steps"] == res[1]["steps"] > 0
    assert res[0]["checksum"] == pytest.approx(res[1]["checksum"], rel=1e-6)
    for rank in range(2):
        assert res[rank]["seen"] == _plan_batches(world=2, rank=rank)[0]  # not sharded again
    ids = [i for r in res for b in r["seen"] for i in b]
    assert sorted(ids) == list(range(len(_lengths())))
    # one train_loss on both ranks: the mean of what each rank had on its own
    assert res[0]["raw_loss"] != res[1]["raw_loss"]
    assert res[0]["loss"] == res[1]["loss"] == pytest.approx(
        (res[0]["raw_loss"] + res[1]["raw_loss"]) / 2)
    assert [r["samples"] for r in res] == [len(_lengths())] * 2  # over both ranks
    assert [r["tokens"] for r in res] == [int(_lengths().sum())] * 2
    if "sft_seen" not in res[0]:
        pytest.skip("trl is not installed: the SFTTrainer part did not run")
    # TRL's SFTTrainer through use_lengthwise: every sample exactly once over the 2 ranks
    sft_ids = sorted(i for r in res for b in r["sft_seen"] for i in b)
    assert sft_ids == list(range(len(_lengths())))
    assert res[0]["sft_loss"] == res[1]["sft_loss"]
    assert [r["sft_samples"] for r in res] == [len(_lengths())] * 2


_WHO = """
import json, os, sys
from accelerate import Accelerator
acc = Accelerator(cpu=True)
path = os.path.join(sys.argv[1], f"p{acc.process_index}.json")
with open(path, "w") as fh:
    json.dump([acc.process_index, acc.num_processes, str(acc.distributed_type)], fh)
"""


@pytest.mark.slow
@pytest.mark.parametrize(("flags", "processes"),
                         [(["--cpu"], 1), (["--multi_gpu"], 2)], ids=["cpu", "multi_gpu"])
def test_accelerate_launch_on_cpu_starts_what_the_docs_say(tmp_path, flags, processes):
    """docs/pytorch.md: --cpu starts one process whatever --num_processes says."""
    if torch.cuda.is_available():
        pytest.skip("--multi_gpu means GPUs on a machine that has them")
    script = tmp_path / "who.py"
    script.write_text(_WHO)
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"))  # no accelerate config file
    cmd = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", *flags,
           "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no", str(script), str(tmp_path)]
    subprocess.run(cmd, env=env, check=True, timeout=240, capture_output=True)
    found = sorted(json.loads(p.read_text()) for p in tmp_path.glob("p*.json"))
    assert [f[:2] for f in found] == [[r, processes] for r in range(processes)]
    if processes == 2:
        assert found[0][2].endswith("MULTI_CPU")


if __name__ == "__main__":
    _rank_main(sys.argv[1])
