"""Two gloo processes leave their group together: no rank tears its side down while a peer
still works (a gloo group destroyed early, or at interpreter shutdown, can abort a process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _ports import free_port

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available", allow_module_level=True)

WORKER = textwrap.dedent("""
    import json, os, sys, time
    import torch.distributed as tdist
    from lengthwise.train.device import leave_group, setup_distributed

    out = sys.argv[1]
    rank = int(os.environ["RANK"])
    if sys.argv[2] == "own":  # a group the caller made stays the caller's
        tdist.init_process_group("gloo")
        leave_group(wait=True)
        kept = tdist.is_initialized()
        tdist.destroy_process_group()
        json.dump({"kept": kept}, open(f"{out}/rank{rank}.json", "w"))
        sys.exit(0)
    group = setup_distributed("cpu")
    if rank == 0:
        time.sleep(1.0)  # rank 0's own work after training (the summary, the plot)
    done = time.time()
    leave_group(wait=True)
    json.dump({"world": group.world_size, "done": done, "left": time.time(),
               "still_in": tdist.is_initialized()}, open(f"{out}/rank{rank}.json", "w"))
""")


def _two_ranks(tmp_path: Path, mode: str) -> list[dict]:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE="2", OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path), mode],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    try:
        texts = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for proc, text in zip(procs, texts, strict=True):
        assert proc.returncode == 0, text
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def test_ranks_leave_the_group_together_after_a_command(tmp_path):
    ranks = _two_ranks(tmp_path, "joined")
    assert [r["world"] for r in ranks] == [2, 2]
    assert not any(r["still_in"] for r in ranks)
    # rank 1 finished first, yet left only once rank 0's last work was done
    assert ranks[1]["done"] < ranks[0]["done"] <= ranks[1]["left"]


def test_a_group_the_caller_made_is_left_to_the_caller(tmp_path):
    assert [r["kept"] for r in _two_ranks(tmp_path, "own")] == [True, True]
