"""A sampler that plans for another number of processes than the launcher started refuses.

The torchrun test builds a sampler before ``init_process_group`` in 2 real processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _ports import free_port

pytest.importorskip("torch")

from lengthwise.errors import ConfigError  # noqa: E402
from lengthwise.planning.config import PlanConfig
from lengthwise.pytorch.sampler import BucketBatchSampler  # noqa: E402

LENGTHS = [5, 3, 8, 2, 7, 1, 4, 6]


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("name", ["WORLD_SIZE", "LOCAL_WORLD_SIZE"])
def test_one_replica_under_two_processes_raises(clean_env, name):
    clean_env.setenv(name, "2")
    with pytest.raises(ConfigError) as err:
        BucketBatchSampler(LENGTHS, PlanConfig(batch_size=2))
    msg = str(err.value)
    assert "num_replicas=1" in msg and f"{name}=2" in msg and "init_process_group" in msg
    assert "check_world_size=False" in msg and "\n" not in msg


def test_matching_or_opted_out_samplers_build(clean_env):
    clean_env.setenv("WORLD_SIZE", "4")
    both = [BucketBatchSampler(LENGTHS, PlanConfig(batch_size=2), num_replicas=4, rank=r)
            for r in range(4)]
    seen = sorted(i for s in both for b in s for i in b)
    assert seen == list(range(len(LENGTHS)))
    # two tensor-parallel pairs: 2 data-parallel ranks among 4 processes
    shared = BucketBatchSampler(LENGTHS, PlanConfig(batch_size=2), num_replicas=2, rank=1,
                                check_world_size=False)
    assert shared.num_replicas == 2
    with pytest.raises(ConfigError, match="num_replicas=2, but WORLD_SIZE=4"):
        BucketBatchSampler(LENGTHS, PlanConfig(batch_size=2), num_replicas=2, rank=1)


def test_single_process_needs_nothing(clean_env):
    clean_env.setenv("WORLD_SIZE", "1")
    assert len(BucketBatchSampler(LENGTHS, PlanConfig(batch_size=2))) == 4


@pytest.mark.parametrize("world,rank", [("WORLD_SIZE", "RANK"), ("LOCAL_WORLD_SIZE", "LOCAL_RANK")])
def test_a_rank_another_process_has_is_refused(clean_env, world, rank):
    clean_env.setenv(world, "2")
    clean_env.setenv(rank, "1")
    with pytest.raises(ConfigError) as err:
        BucketBatchSampler(LENGTHS, PlanConfig(batch_size=2), num_replicas=2, rank=0)
    msg = str(err.value)
    assert "rank=0" in msg and f"{rank}=1" in msg and "\n" not in msg
    assert BucketBatchSampler(LENGTHS, PlanConfig(batch_size=2), num_replicas=2, rank=1).rank == 1
    # a data-parallel rank of another group, on purpose
    assert BucketBatchSampler(LENGTHS, PlanConfig(batch_size=2), num_replicas=2, rank=0,
                              check_world_size=False).rank == 0


WORKER = """
import json, os, sys
import torch.distributed as dist
from lengthwise import BucketBatchSampler, PlanConfig
lengths = list(range(1, 41))
out = {}
try:
    BucketBatchSampler(lengths, PlanConfig(batch_size=4))  # before init_process_group
    out["early"] = None
except ValueError as exc:
    out["early"] = str(exc)
dist.init_process_group("gloo")
sampler = BucketBatchSampler(lengths, PlanConfig(batch_size=4))  # after: the group's size, rank
out["batches"] = [b for b in sampler]
out["replicas"] = sampler.num_replicas
try:
    BucketBatchSampler(lengths, PlanConfig(batch_size=4), num_replicas=2, rank=0)  # rank 0 on both
    out["rank0"] = None
except ValueError as exc:
    out["rank0"] = str(exc)
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as fh:
    json.dump(out, fh)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_guard_fires_under_torchrun(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[2] / "src"),
                                           env.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script),
         str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for out in ranks:
        assert "num_replicas=1" in out["early"] and "WORLD_SIZE=2" in out["early"]
        assert out["replicas"] == 2
    assert ranks[0]["rank0"] is None  # rank 0 is rank 0; rank 1 may not say it is
    assert "rank=0" in ranks[1]["rank0"] and "rank 1 of 2" in ranks[1]["rank0"]
    trained = sorted(i for out in ranks for b in out["batches"] for i in b)
    assert trained == list(range(40))  # built after the group: every sample once


@pytest.mark.parametrize("name", ["WORLD_SIZE", "LOCAL_WORLD_SIZE"])
@pytest.mark.parametrize("value", ["abc", "0", "-2", "2.5", "²"])
def test_a_launcher_count_that_is_not_one_is_refused_naming_it(clean_env, name, value):
    """Not read as 'one process' (which would plan the whole epoch on every process)."""
    clean_env.setenv(name, value)
    with pytest.raises(ConfigError) as err:
        BucketBatchSampler(LENGTHS, PlanConfig(batch_size=2))
    assert str(err.value).startswith(f"{name}={value!r} is not a count of processes")
    assert "\n" not in str(err.value)
    assert len(BucketBatchSampler(LENGTHS, PlanConfig(batch_size=2), check_world_size=False)) == 4


def test_world_size_is_the_count_of_processes_where_both_are_set(clean_env):
    """LOCAL_WORLD_SIZE (the processes of one machine) is read only without WORLD_SIZE."""
    clean_env.setenv("WORLD_SIZE", "1")
    clean_env.setenv("LOCAL_WORLD_SIZE", "2")
    assert len(BucketBatchSampler(LENGTHS, PlanConfig(batch_size=2))) == 4
    clean_env.setenv("WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match="num_replicas=2, but WORLD_SIZE=4 says"):
        BucketBatchSampler(LENGTHS, PlanConfig(batch_size=2), num_replicas=2, rank=0)
