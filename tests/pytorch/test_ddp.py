"""Real DistributedDataParallel training (gloo, separate processes) fed by BucketBatchSampler.

Run as a script, this file is one rank of the training (see ``_worker``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from _ports import free_port, rank_finished, script_env

from lengthwise.planning.config import PlanConfig
from lengthwise.planning.plan import plan_epoch

VOCAB = 64
SEED = 11
ACCUM = 2
EPOCHS = 2
PLAN = PlanConfig(max_tokens=384, grad_accum=ACCUM, pad_multiple=8)


def _lengths():
    rng = np.random.default_rng(5)
    return np.concatenate([rng.integers(2, 16, 150), rng.integers(30, 48, 40)])




def _worker(rank: int, world: int, port: int, out_dir: str, stop_after: int | None,
            state_in: str | None) -> None:
    """Train a tiny language model with DDP; write what this rank saw to ``out_dir``.

    With ``stop_after``, save the sampler state after that many micro-batches of
    epoch 0 and stop; with ``state_in``, resume from such a state.
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, Dataset

    from lengthwise.pytorch.collate import PadCollator, model_inputs
    from lengthwise.pytorch.sampler import BucketBatchSampler

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    lengths = _lengths()

    class Tokens(Dataset):
        def __len__(self):
            return lengths.size

        def __getitem__(self, i):
            rng = np.random.default_rng(i)
            return {"input_ids": rng.integers(1, VOCAB, lengths[i]).tolist(), "index": i}

    collate = PadCollator(pad_token_id=0, pad_multiple=8)

    def collate_with_index(samples):
        batch = collate(samples)
        batch["index"] = [s["index"] for s in samples]
        return batch

    sampler = BucketBatchSampler(lengths, PLAN, seed=SEED)  # ranks from the process group
    assert (sampler.num_replicas, sampler.rank) == (world, rank)
    sampler.check_dataset(Tokens())
    epoch0 = 0
    if state_in is not None:
        with open(state_in) as fh:
            sampler.load_state_dict(json.load(fh))
        epoch0 = sampler.epoch
    loader = DataLoader(Tokens(), batch_sampler=sampler, collate_fn=collate_with_index)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    seen: list[list[list[int]]] = []
    steps, losses = 0, []
    for epoch in range(epoch0, EPOCHS):
        sampler.set_epoch(epoch)
        n = len(sampler)
        first = n - sampler.remaining()
        seen.append([])
        for pos, batch in enumerate(loader, start=first):
            inputs = model_inputs(batch)
            sync = (pos + 1) % ACCUM == 0 or pos + 1 == n
            with contextlib.nullcontext() if sync else ddp.no_sync():
                logits = ddp(inputs["input_ids"])[:, :-1]
                target = inputs["labels"][:, 1:].masked_fill(
                    inputs["attention_mask"][:, 1:] == 0, -100)
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, VOCAB), target.reshape(-1), ignore_index=-100)
                (loss / ACCUM).backward()
            losses.append(float(loss))
            if sync:
                opt.step()
                opt.zero_grad()
                steps += 1
            seen[-1].append(batch["index"])
            if stop_after is not None and pos + 1 == stop_after:
                if rank == 0:
                    with open(os.path.join(out_dir, "state.json"), "w") as fh:
                        json.dump(sampler.state_dict(), fh)
                break
        if stop_after is not None:
            break
    checksum = float(sum(p.double().sum() for p in model.parameters()))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump({"seen": seen, "steps": steps, "checksum": checksum,
                   "losses": losses}, fh)
    dist.barrier()
    dist.destroy_process_group()


def _launch(world: int, out_dir, stop_after=None, state_in=None) -> list[dict]:
    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(world), str(port),
                               str(out_dir), json.dumps(stop_after), json.dumps(state_in)],
                              env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
             for r in range(world)]
    try:
        outs = [p.communicate(timeout=240)[0] for p in procs]  # an uneven rank would hang
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, out) in enumerate(zip(procs, outs, strict=True)):
        assert rank_finished(p.returncode, out, os.path.join(out_dir, f"rank{r}.json")), out
    results = []
    for r in range(world):
        with open(os.path.join(out_dir, f"rank{r}.json")) as fh:
            results.append(json.load(fh))
    return results


def test_ddp_two_processes_full_epochs(tmp_path):
    world = 2
    results = _launch(world, tmp_path)
    lengths = _lengths()
    # both ranks took the same number of optimizer steps, and DDP kept them in sync
    assert results[0]["steps"] == results[1]["steps"] > 0
    assert results[0]["checksum"] == pytest.approx(results[1]["checksum"], rel=1e-6)
    assert all(np.isfinite(r["losses"]).all() for r in results)
    for epoch in range(EPOCHS):
        per_rank = [[i for b in r["seen"][epoch] for i in b] for r in results]
        assert not set(per_rank[0]) & set(per_rank[1])  # disjoint
        assert sorted(per_rank[0] + per_rank[1]) == list(range(lengths.size))  # exactly once
        plan = plan_epoch(lengths, replace(PLAN, world_size=world), seed=SEED, epoch=epoch)
        for r in range(world):
            assert results[r]["seen"][epoch] == [b.tolist() for b in plan.rank_batches(r)]
    steps_per_epoch = -(-plan.num_batches // ACCUM)
    assert results[0]["steps"] == EPOCHS * steps_per_epoch


@pytest.mark.slow
def test_ddp_elastic_restart_two_to_three_processes(tmp_path):
    lengths = _lengths()
    before = _launch(2, tmp_path, stop_after=5)
    with open(tmp_path / "state.json") as fh:
        assert json.load(fh)["yielded"] == 5
    after = _launch(3, tmp_path, state_in=str(tmp_path / "state.json"))
    assert len({r["steps"] for r in after}) == 1
    trained = [i for r in before + after for b in r["seen"][0] for i in b]
    assert sorted(trained) == list(range(lengths.size))  # epoch 0: exactly once overall
    epoch1 = [i for r in after for b in r["seen"][1] for i in b]
    assert sorted(epoch1) == list(range(lengths.size))  # epoch 1: a fresh full epoch


if __name__ == "__main__":
    rank_, world_, port_, out_ = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                  sys.argv[4])
    _worker(rank_, world_, port_, out_, json.loads(sys.argv[5]), json.loads(sys.argv[6]))
