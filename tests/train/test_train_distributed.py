"""Two real processes over gloo: StepLogger reduction, SpikeGuard agreement, DCP resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _ports import free_port

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available", allow_module_level=True)

WORKER = Path(__file__).with_name("_dist_worker.py")




@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE="2", OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), str(out)], env=dict(env, RANK=str(r)),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(2)
    ]
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            texts = [p.communicate()[0] for p in procs]
            pytest.fail("distributed worker timed out:\n" + "\n----\n".join(texts))
    for proc, text in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, text
    results = [json.loads((out / f"result_rank{r}.json").read_text()) for r in range(2)]
    return out, results


def test_step_logger_sums_counts_and_token_weights_losses(two_ranks):
    out, results = two_ranks
    lines = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "event" not in x]
    events = [x for x in lines if "event" in x]
    assert [x["step"] for x in steps] == [0, 1, 2]
    assert [e["rank"] for e in events] == [0]  # only rank 0 writes
    for step, rec in enumerate(steps):
        assert rec["real_tokens"] == 300 and rec["padded_tokens"] == 352
        assert rec["samples"] == 8 and rec["micro_batches"] == 3
        assert rec["buckets"] == [0, 1, 2]
        expected = ((1.0 + step) * 100 + 3.0 * 50 + 2.0 * 150) / 300
        assert rec["loss"] == pytest.approx(expected)
        # running per-bucket means over steps 0..step
        b0 = sum(1.0 + s for s in range(step + 1)) / (step + 1)
        assert rec["bucket_loss"] == pytest.approx({"0": b0, "1": 2.0, "2": 3.0})
        # corrected: the loss minus the mix's offset from the earlier steps' bucket means
        if step == 0:
            assert rec["corrected_loss"] == pytest.approx(expected)
        else:
            m0 = sum(1.0 + s for s in range(step)) / step
            ref = 0.5 * m0 + 0.3 * 2.0 + 0.2 * 3.0
            offset = (100 * (m0 - ref) + 150 * (2.0 - ref) + 50 * (3.0 - ref)) / 300
            assert rec["corrected_loss"] == pytest.approx(expected - offset)
    # every rank returns the same reduced record
    for r0, r1 in zip(results[0]["records"], results[1]["records"], strict=True):
        assert r0["loss"] == r1["loss"] and r0["bucket_loss"] == r1["bucket_loss"]


def test_spike_guard_decides_the_same_on_every_rank(two_ranks):
    _, results = two_ranks
    a, b = results[0]["guard_decisions"], results[1]["guard_decisions"]
    assert a == b
    assert a[9] is True and sum(a) == 1
    assert results[0]["guard_skipped"] == results[1]["guard_skipped"] == 1


def test_dcp_checkpoint_resumes_each_rank_exactly(two_ranks):
    out, results = two_ranks
    for res in results:
        assert res["loaded_step"] == 3
        assert res["loaded_extra"] == {"rank": res["rank"]}
        assert res["second"] == res["first"]  # bit-identical continuation
        assert "COMPLETE" in res["checkpoint_files"] and ".metadata" in res["checkpoint_files"]
    assert results[0]["first"] != results[1]["first"]  # ranks really had their own data
    manifest = json.loads((out / "ckpt" / "step_3" / "COMPLETE").read_text())
    assert manifest["backend"] == "dcp" and manifest["world_size"] == 2
    names = [json.loads(x)["event"] for x in (out / "ckpt_log.jsonl").read_text().splitlines()]
    assert names == ["checkpoint_begin", "checkpoint_end", "checkpoint_written"]
    assert not list((out / "ckpt").glob("*.tmp"))
