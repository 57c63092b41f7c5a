"""docs/pytorch.md's own Accelerate loop under ``accelerate launch`` with 2 CPU processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _ports import free_port

pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).with_name("_accelerate_loop.py")


def _env(tmp_path: Path) -> dict[str, str]:
    """This checkout's package, no launcher variables, no accelerate config file."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK")}
    src = str(Path(__file__).parents[1] / "src")
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([src, env.get("PYTHONPATH", "")]),
               HF_HOME=str(tmp_path / "hf"))
    return env


def _launch(script: Path, out: Path) -> Path:
    """``accelerate launch`` of ``script`` with 2 CPU processes, writing into ``out``."""
    proc = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch",
         "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
         "--main_process_port", str(free_port()), "--mixed_precision", "no",
         "--dynamo_backend", "no", str(script), str(out)],
        env=_env(out), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.mark.slow
def test_own_loop_trains_every_sample_once_over_two_processes(tmp_path):
    # on a machine with GPUs the same command runs on them; here it starts 2 CPU processes
    out = _launch(SCRIPT, tmp_path)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    sys.path.insert(0, str(SCRIPT.parent))
    from _accelerate_loop import LENGTHS, MAX_TOKENS

    assert [r["num_processes"] for r in ranks] == [2, 2]
    assert ranks[0]["steps"] == ranks[1]["steps"] > 0
    assert ranks[0]["weights"] == ranks[1]["weights"]  # gradients were synchronised
    for epoch in range(2):
        assert len(ranks[0]["seen"][epoch]) == len(ranks[1]["seen"][epoch])
        trained = sorted(i for r in ranks for b in r["seen"][epoch] for i in b)
        assert trained == list(range(LENGTHS.size))
        assert all(len(b) * int(LENGTHS[b].max()) <= MAX_TOKENS
                   for r in ranks for b in r["seen"][epoch])
    # a sampler planned for one process is refused under this launcher, naming the fix
    for r in ranks:
        assert "num_replicas=1" in r["refused"] and "WORLD_SIZE=2" in r["refused"]
        assert "Accelerator(cpu=True)" in r["refused"]


_PLAIN = """
import json, os, sys
from accelerate import Accelerator
import lengthwise
acc = Accelerator()
try:
    lengthwise.BucketBatchSampler([3, 1, 2, 5], lengthwise.PlanConfig(batch_size=1),
                                  num_replicas=acc.num_processes, rank=acc.process_index)
    refused = None
except lengthwise.errors.ConfigError as exc:
    refused = str(exc)
kind = str(acc.distributed_type)
acc.end_training()  # leaves the gloo group of 2 Accelerate set up before the interpreter exits
import torch.distributed as dist
with open(os.path.join(sys.argv[1], f"p{os.environ['RANK']}.json"), "w") as fh:
    json.dump([acc.num_processes, kind, refused, dist.is_initialized()], fh)
"""


@pytest.mark.slow
def test_a_plain_accelerator_on_cpu_sees_one_process_and_its_sampler_is_refused(tmp_path):
    """docs/pytorch.md: without cpu=True, each of 2 launched CPU processes sees only itself."""
    if torch.accelerator.is_available():
        pytest.skip("on a machine with an accelerator a plain Accelerator sees every process")
    script = tmp_path / "plain.py"
    script.write_text(_PLAIN)
    out = _launch(script, tmp_path)
    for rank in range(2):
        processes, kind, refused, group_left = json.loads((out / f"p{rank}.json").read_text())
        assert group_left is False  # no gloo group torn down by the interpreter's exit
        assert (processes, kind) == (1, "DistributedType.NO")
        # (Accelerate has even initialised a group of 2; the sampler names it)
        assert "num_replicas=1, but" in refused and "one of 2" in refused
