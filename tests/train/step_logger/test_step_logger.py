"""StepLogger: record schema, reductions, corrected loss, background writing, forwarding."""

from __future__ import annotations

import json
import sys
import threading
import types
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.planning.config import PlanConfig
from lengthwise.train import StepLogger, bucket_token_shares

STEP_KEYS = {
    "step", "epoch", "loss", "lr", "grad_norm", "real_tokens", "padded_tokens",
    "tokens_per_second", "samples", "buckets", "bucket_loss", "corrected_loss",
    "padding_efficiency", "seconds", "micro_batches", "skipped", "skipped_total", "time",
}


def read_log(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def roughness(x, width=51):
    """docs/metrics.md loss_roughness: std of x minus its centred rolling mean."""
    x = np.asarray(x, dtype=float)
    mean = np.convolve(x, np.ones(width) / width, mode="valid")
    half = width // 2
    return float(np.std(x[half : len(x) - half] - mean))


def test_writes_one_record_per_step_with_the_documented_fields(tmp_path):
    path = tmp_path / "run" / "train_log.jsonl"
    with StepLogger(path, bucket_shares={0: 3, 1: 1}) as log:
        log.record_micro(loss=2.0, real_tokens=30, padded_tokens=40, samples=3, bucket=0)
        log.record_micro(loss=4.0, real_tokens=10, padded_tokens=20, samples=1, bucket=1)
        first = log.step(step=7, epoch=1, lr=1e-3, grad_norm=0.25)
        log.record_micro(loss=1.0, real_tokens=20, padded_tokens=20, samples=2, bucket=0)
        log.step(step=8, epoch=1, lr=2e-3, grad_norm=0.5, eval_note="x")
    records = read_log(path)
    assert [r["step"] for r in records] == [7, 8]
    assert STEP_KEYS <= set(records[0]) and records[0] == json.loads(json.dumps(first))
    a, b = records
    assert a["loss"] == pytest.approx((2.0 * 30 + 4.0 * 10) / 40)
    assert (a["real_tokens"], a["padded_tokens"], a["samples"]) == (40, 60, 4)
    assert a["padding_efficiency"] == pytest.approx(40 / 60)
    assert a["tokens_per_second"] == pytest.approx(a["real_tokens"] / a["seconds"])
    assert a["tokens_per_second"] > 0
    assert (a["epoch"], a["lr"], a["grad_norm"], a["micro_batches"]) == (1, 1e-3, 0.25, 2)
    assert a["buckets"] == [0, 1] and b["buckets"] == [0]
    assert a["bucket_loss"] == {"0": 2.0, "1": 4.0}
    assert a["corrected_loss"] == pytest.approx(a["loss"])  # no earlier step to correct with
    # step 8 is all bucket 0, whose earlier mean 2.0 sits 0.5 below the share-weighted 2.5
    assert b["corrected_loss"] == pytest.approx(1.0 + 0.5)
    # bucket 0's running loss is now the token-weighted mean of both of its steps
    assert b["bucket_loss"]["0"] == pytest.approx((2.0 * 30 + 1.0 * 20) / 50)
    assert b["eval_note"] == "x" and b["skipped"] is False


def test_explicit_loss_and_missing_counts(tmp_path):
    log = StepLogger(None)
    rec = log.step(0, loss=1.5)
    assert rec["loss"] == 1.5 and rec["real_tokens"] is None and rec["tokens_per_second"] is None
    assert rec["buckets"] == [] and rec["corrected_loss"] is None
    log.record_micro(loss=9.0, real_tokens=5)
    assert log.step(loss=2.5)["loss"] == 2.5  # the given loss wins over recorded ones
    assert log.step()["step"] == 2  # step numbers continue when left out
    log.close()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.01, 20.0), st.integers(1, 5000), st.integers(0, 5000),
            st.integers(1, 64), st.integers(0, 7),
        ),
        min_size=1, max_size=12,
    )
)
def test_step_figures_match_direct_computation(micro):
    log = StepLogger(None)
    losses, real, extra_pad, samples, buckets = (list(c) for c in zip(*micro, strict=True))
    padded = [r + e for r, e in zip(real, extra_pad, strict=True)]
    rec = log.log_step(0, losses=losses, real_tokens=real, padded_tokens=padded,
                       samples=samples, buckets=buckets)
    log.close()
    w = np.array(real, dtype=float)
    assert rec["loss"] == pytest.approx(float(np.dot(losses, w) / w.sum()))
    assert rec["real_tokens"] == sum(real) and rec["padded_tokens"] == sum(padded)
    assert rec["samples"] == sum(samples) and rec["buckets"] == sorted(set(buckets))
    for b in set(buckets):
        sel = [i for i, x in enumerate(buckets) if x == b]
        expected = sum(losses[i] * real[i] for i in sel) / sum(real[i] for i in sel)
        assert rec["bucket_loss"][str(b)] == pytest.approx(expected)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.05, 1.0), min_size=2, max_size=6).flatmap(
        lambda shares: st.tuples(
            st.just(shares),
            st.lists(st.floats(0.5, 10.0), min_size=len(shares), max_size=len(shares)),
            st.lists(st.integers(0, len(shares) - 1), min_size=1, max_size=30),
        )
    )
)
def test_corrected_loss_of_constant_buckets_is_their_share_weighted_mean(case):
    shares, level, order = case
    log = StepLogger(None, bucket_shares=shares)
    for step, b in enumerate(order):
        rec = log.log_step(step, losses=[level[b]], real_tokens=[7], buckets=[b])
    log.close()
    seen = sorted(set(order[:-1]))
    if order[-1] in seen:  # the last step's bucket is known from earlier steps
        expected = sum(shares[b] * level[b] for b in seen) / sum(shares[b] for b in seen)
    else:  # a bucket never seen before has no known offset
        expected = level[order[-1]]
    assert rec["corrected_loss"] == pytest.approx(expected)


def _single_bucket_run(band: np.ndarray, seed: int, steps: int = 1200):
    """Steps of one random bucket each; returns raw, corrected and per-step sampling noise."""
    rng = np.random.default_rng(seed)
    shares = np.array([0.5, 0.3, 0.2])
    log = StepLogger(None, bucket_shares=shares, window=50)
    raw, corrected, noise = [], [], []
    for t in range(steps):
        trend = 2.0 + 3.0 * np.exp(-t / 300)
        b = int(rng.choice(3, p=shares))
        tokens = rng.integers(50, 200, size=4)
        draw = rng.normal(0.0, 0.05, size=4)
        rec = log.log_step(t, losses=list(trend + band[b] + draw), real_tokens=list(tokens),
                           buckets=[b] * 4)
        raw.append(rec["loss"])
        corrected.append(rec["corrected_loss"])
        noise.append(float(np.average(draw, weights=tokens)))
    log.close()
    return np.array(raw), np.array(corrected), np.array(noise)


@pytest.mark.parametrize("seed", [0, 1])
def test_corrected_loss_keeps_the_noise_when_buckets_do_not_differ(seed):
    raw, corrected, _ = _single_bucket_run(np.zeros(3), seed)
    stable = slice(200, None)
    assert roughness(corrected[stable]) == pytest.approx(roughness(raw[stable]), rel=0.15)


@pytest.mark.parametrize("seed", [0, 1])
def test_corrected_loss_falls_to_the_sampling_noise_when_buckets_differ(seed):
    raw, corrected, noise = _single_bucket_run(np.array([0.0, 1.0, 2.0]), seed)
    stable = slice(200, None)
    assert roughness(raw[stable]) > 0.5  # the raw loss really jumps between bands
    assert roughness(corrected[stable]) == pytest.approx(roughness(noise[stable]), rel=0.15)


def test_without_shares_the_observed_token_shares_stand_in():
    log = StepLogger(None)
    for step in range(40):
        b = step % 2
        log.log_step(step, losses=[1.0 if b == 0 else 3.0], real_tokens=[300 if b == 0 else 100],
                     buckets=[b])
    rec = log.log_step(40, losses=[1.0], real_tokens=[300], buckets=[0])
    log.close()
    # bucket 0 sits 0.5 below the observed-token-share mean 0.75 * 1 + 0.25 * 3
    assert rec["corrected_loss"] == pytest.approx(0.75 * 1.0 + 0.25 * 3.0)


def test_bucket_running_loss_only_covers_the_window():
    log = StepLogger(None, window=5)
    for step in range(20):
        rec = log.log_step(step, losses=[float(step)], real_tokens=[1], buckets=[0])
    assert rec["bucket_loss"]["0"] == pytest.approx(np.mean([15, 16, 17, 18, 19]))
    # a bucket that stops appearing keeps its last entries
    for step in range(20, 40):
        rec = log.log_step(step, losses=[0.0], real_tokens=[1], buckets=[1])
    assert rec["bucket_loss"]["0"] == pytest.approx(np.mean([17, 18, 19]))
    log.close()


def test_skipped_steps_are_counted_and_kept_out_of_bucket_losses(tmp_path):
    path = tmp_path / "log.jsonl"
    with StepLogger(path) as log:
        log.log_step(0, losses=[1.0], buckets=[0])
        spike = log.log_step(1, losses=[50.0], buckets=[0], skipped=True)
        log.log_step(2, losses=[1.0], buckets=[0])
    records = read_log(path)
    assert spike["loss"] == 50.0 and spike["bucket_loss"] == {"0": 1.0}
    assert [r["skipped"] for r in records] == [False, True, False]
    assert [r["skipped_total"] for r in records] == [0, 1, 1]


def test_nonfinite_micro_losses_show_in_loss_but_not_in_bucket_windows():
    log = StepLogger(None)
    log.log_step(0, losses=[1.0], buckets=[0])
    rec = log.log_step(1, losses=[float("nan")], buckets=[0])
    log.close()
    assert np.isnan(rec["loss"]) and rec["bucket_loss"] == {"0": 1.0}


def test_tensor_losses_are_detached_and_read_at_step():
    torch = pytest.importorskip("torch")
    w = torch.tensor(2.0, requires_grad=True)
    log = StepLogger(None)
    log.record_micro(loss=w * 1.5, real_tokens=1, bucket=0)
    log.record_micro(loss=torch.tensor([4.0]), real_tokens=3, bucket=1)
    rec = log.step(0, lr=torch.tensor(0.5), grad_norm=np.float32(2.0))
    log.close()
    assert rec["loss"] == pytest.approx((3.0 + 12.0) / 4)
    assert rec["lr"] == 0.5 and rec["grad_norm"] == 2.0
    assert all(type(v) is float for v in rec["bucket_loss"].values())


def test_events_and_only_rank_zero_writes(tmp_path):
    main, other = tmp_path / "r0.jsonl", tmp_path / "r1.jsonl"
    with StepLogger(main) as log0, StepLogger(other, rank=1, world_size=2) as log1:
        for log in (log0, log1):
            log.event("checkpoint_begin", step=3, path="ckpt/step_3")
            log.log_step(3, losses=[1.0])
    lines = read_log(main)
    assert lines[0]["event"] == "checkpoint_begin" and lines[0]["step"] == 3
    assert "time" in lines[0] and "event" not in lines[1]
    assert not other.exists()


def test_append_mode_continues_a_file_and_w_truncates(tmp_path):
    path = tmp_path / "log.jsonl"
    for mode, expected in (("a", 1), ("a", 2), ("w", 1)):
        with StepLogger(path, mode=mode) as log:
            log.step(0, loss=1.0)
        assert len(read_log(path)) == expected


class _BlockedFile:
    """File stand-in whose writes wait until released: a disk that has stalled."""

    def __init__(self, inner):
        self.inner = inner
        self.release = threading.Event()

    def write(self, text):
        self.release.wait()
        return self.inner.write(text)

    def flush(self):
        self.inner.flush()

    def close(self):
        self.inner.close()


def test_step_does_not_wait_for_the_disk(tmp_path):
    path = tmp_path / "log.jsonl"
    log = StepLogger(path, max_queue=3)
    blocked = _BlockedFile(log._writer.file)
    log._writer.file = blocked
    first, stepped = threading.Event(), threading.Event()

    def loop():
        for step in range(3):  # the writer holds one record, the queue the others
            log.step(step, loss=1.0)
        first.set()
        for step in range(3, 6):
            log.step(step, loss=1.0)
        stepped.set()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    assert first.wait(30)
    assert not stepped.wait(0.3)  # a full queue is the only thing a step ever waits for
    blocked.release.set()
    thread.join(30)
    assert stepped.is_set()
    log.close()
    assert [r["step"] for r in read_log(path)] == list(range(6))


def test_flush_makes_records_visible_before_close(tmp_path):
    path = tmp_path / "log.jsonl"
    log = StepLogger(path, flush_every_s=3600)
    log.step(0, loss=1.0)
    log.flush()
    assert len(read_log(path)) == 1
    log.close()
    log.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        log.step(1, loss=1.0)


class _FullDisk(_BlockedFile):
    def write(self, text):
        raise OSError(28, "No space left on device")


def test_a_failed_write_is_reported_on_the_next_call(tmp_path):
    log = StepLogger(tmp_path / "log.jsonl")
    log._writer.file = _FullDisk(log._writer.file)
    log.step(0, loss=1.0)
    with pytest.raises(RuntimeError, match="writing the training log .* failed: .*No space"):
        log.flush()


@pytest.mark.parametrize(
    ("value", "kind"),
    [({"a", "b"}, "builtins.set"), (json, "module"),
     (__import__("datetime").datetime(2024, 1, 1), "datetime.datetime"),
     ({"nested": [1, {2}]}, "builtins.set")],
)
def test_a_field_json_cannot_hold_fails_at_its_call_and_loses_nothing(tmp_path, value, kind):
    path = tmp_path / "log.jsonl"
    log = StepLogger(path)
    log.step(0, loss=1.0)
    log.record_micro(loss=2.0, real_tokens=10, samples=1)
    with pytest.raises(TypeError, match=rf"step\(tags=\.\.\.\): JSON cannot hold a .*{kind}"):
        log.step(1, tags=value)
    rec = log.step(1, tags=["ok"])  # the same step again: its micro-batch was kept
    assert (rec["loss"], rec["real_tokens"], rec["micro_batches"]) == (2.0, 10, 1)
    with pytest.raises(TypeError, match=r"event\(where=\.\.\.\)"):
        log.event("note", where=value)
    for step in range(2, 5):
        log.step(step, loss=float(step))
    log.close()
    assert [r.get("step") for r in read_log(path)] == [0, 1, 2, 3, 4]
    assert read_log(path)[1]["tags"] == ["ok"]


def test_a_failed_log_step_can_be_repeated():
    log = StepLogger(None)
    with pytest.raises(TypeError, match=r"step\(when=\.\.\.\)"):
        log.log_step(0, losses=[1.0, 3.0], real_tokens=[1, 1], when={1})
    with pytest.raises(ValueError, match="non-negative integer"):
        log.log_step(0, losses=[1.0, 3.0], real_tokens=[1, -1])
    rec = log.log_step(0, losses=[1.0, 3.0], real_tokens=[1, 1], when=[1])
    assert (rec["micro_batches"], rec["loss"], rec["real_tokens"]) == (2, 2.0, 2)
    log.close()


def test_bad_step_arguments_keep_the_recorded_micro_batches():
    log = StepLogger(None)
    log.record_micro(loss=3.0, real_tokens=4)
    for bad in ({"lr": "fast"}, {"epoch": -1}, {"grad_norm": [1, 2]}, {"loss": "x"}):
        with pytest.raises((TypeError, ValueError)):
            log.step(0, **bad)
    assert log.step(0)["loss"] == 3.0
    log.close()


def test_a_second_thread_is_refused_and_the_first_loop_is_intact(tmp_path):
    path = tmp_path / "log.jsonl"
    log = StepLogger(path)
    errors, go = [], threading.Event()

    def loop(n):
        go.wait()
        try:
            for _ in range(n):
                log.record_micro(loss=1.0, real_tokens=2, samples=1)
                log.record_micro(loss=1.0, real_tokens=2, samples=1)
                log.step()
        except RuntimeError as exc:
            errors.append(str(exc))

    log.step(0, loss=1.0)  # the main thread owns the logger now
    threads = [threading.Thread(target=loop, args=(50,), name=f"loop-{i}") for i in range(2)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(30)
    assert len(errors) == 2 and all("is logging with this logger" in e for e in errors)
    assert "'MainThread'" in errors[0]
    # events may come from any thread (a checkpoint writer, for instance)
    t = threading.Thread(target=log.event, args=("checkpoint_written",), kwargs={"step": 1})
    t.start()
    t.join()
    for _ in range(3):
        log.record_micro(loss=1.0, real_tokens=2, samples=1)
        log.record_micro(loss=1.0, real_tokens=2, samples=1)
        log.step()
    log.close()
    steps = [r["step"] for r in read_log(path) if "step" in r and "event" not in r]
    assert steps == [0, 1, 2, 3]
    assert all(r["micro_batches"] == 2 for r in read_log(path)[1:] if "event" not in r)


def test_a_finished_thread_hands_the_logger_on():
    log = StepLogger(None)
    worker = threading.Thread(target=log.step, args=(0,), kwargs={"loss": 1.0})
    worker.start()
    worker.join()
    assert log.step(1, loss=1.0)["step"] == 1  # the first thread has ended
    log.close()


@pytest.mark.parametrize("how", ["delete", "move", "replace"])
def test_a_log_file_that_vanishes_is_reopened_and_nothing_is_lost(tmp_path, how):
    path = tmp_path / "logs" / "log.jsonl"
    log = StepLogger(path, flush_every_s=3600)
    for step in range(3):
        log.step(step, loss=1.0)
    log.flush()
    if how == "delete":
        path.unlink()
    elif how == "move":
        path.rename(tmp_path / "moved.jsonl")
    else:
        path.unlink()
        path.write_text("")
    for step in range(3, 6):
        log.step(step, loss=1.0)
    with pytest.warns(UserWarning, match=r"was (deleted or moved|replaced).* 3 line\(s\)"):
        log.flush()
    log.step(6, loss=1.0)
    log.close()
    assert log.reopened == 1
    lines = read_log(path)
    assert lines[0]["event"] == "log_reopened" and lines[0]["rewritten_lines"] == 3
    assert [r["step"] for r in lines[1:]] == [3, 4, 5, 6]
    if how == "move":
        assert [r["step"] for r in read_log(tmp_path / "moved.jsonl")] == [0, 1, 2, 3, 4, 5]


def test_a_log_whose_folder_vanishes_is_recreated(tmp_path):
    import shutil

    path = tmp_path / "logs" / "log.jsonl"
    with StepLogger(path, flush_every_s=3600) as log:
        log.step(0, loss=1.0)
        log.flush()
        shutil.rmtree(tmp_path / "logs")
        log.step(1, loss=1.0)
        with pytest.warns(UserWarning, match="reopened"):
            log.flush()
    assert [r.get("step") for r in read_log(path)] == [None, 1]


def test_a_log_path_under_a_file_or_at_a_folder_says_so(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(NotADirectoryError, match=r"afile is a file, not a folder"):
        StepLogger(tmp_path / "afile" / "sub" / "log.jsonl")
    with pytest.raises(IsADirectoryError, match=r"is a folder; give a file path"):
        StepLogger(tmp_path)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"losses": [1.0, 2.0], "buckets": [0]}, "differ in length"),
        ({"losses": [1.0], "buckets": [-1]}, "non-negative integer"),
        ({"losses": [1.0], "buckets": [5]}, "no entry in bucket_shares"),
        ({"losses": [1.0], "real_tokens": [2.5]}, "non-negative integer"),
        ({"losses": [1.0], "loss_note": 1, "lr": "x"}, "real number"),
        ({"losses": [1.0], "corrected": 1, "samples": [-1]}, "non-negative integer"),
    ],
)
def test_bad_input_raises_clear_errors(kwargs, message):
    log = StepLogger(None, bucket_shares=[0.5, 0.5])
    with pytest.raises((ValueError, TypeError), match=message):
        log.log_step(0, **kwargs)
    log.close()


def test_bad_configuration_raises():
    with pytest.raises(ValueError, match="reuse record keys"):
        StepLogger(None).step(0, loss=1.0, tokens_per_second=3)
    with pytest.raises(ValueError, match="all be zero"):
        StepLogger(None, bucket_shares=[0, 0])
    with pytest.raises(ValueError, match="window"):
        StepLogger(None, window=0)
    with pytest.raises(ValueError, match="num_buckets"):
        StepLogger(None, num_buckets=2).log_step(0, losses=[1.0], buckets=[2])


def test_bucket_token_shares_from_a_plan():
    plan = SimpleNamespace(
        bucket=np.array([1, 0, 1]), offsets=np.array([0, 2, 3, 5]),
        indices=np.array([4, 0, 1, 2, 3]), lengths=np.array([10, 20, 30, 40, 50]),
    )
    shares = bucket_token_shares(plan)
    assert shares == pytest.approx({0: 20 / 150, 1: 130 / 150})
    assert bucket_token_shares(plan, by="samples") == pytest.approx({0: 0.2, 1: 0.8})
    with pytest.raises(ValueError, match="by must be"):
        bucket_token_shares(plan, by="rows")


def test_tensorboard_forwarding_writes_an_event_file(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = tmp_path / "tb"
    with StepLogger(None, tensorboard_dir=tb, bucket_shares=[1.0, 1.0]) as log:
        for step in range(3):
            log.log_step(step, losses=[1.0 + step, 2.0], real_tokens=[1, 1], buckets=[0, 1],
                         lr=0.1)
    assert list(tb.glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(tb))
    acc.Reload()
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx([1.5, 2.0, 2.5])
    assert [e.step for e in acc.Scalars("train/loss")] == [0, 1, 2]
    assert acc.Scalars("bucket_loss/1")[-1].value == pytest.approx(2.0)


def test_wandb_forwarding_uses_the_module_when_present(monkeypatch):
    calls = []
    fake = types.ModuleType("wandb")
    fake.run = None
    fake.init = lambda **kw: calls.append(("init", kw))
    fake.log = lambda data, step: calls.append(("log", step, data))
    fake.finish = lambda: calls.append(("finish",))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with StepLogger(None, wandb={"project": "p"}) as log:
        log.log_step(4, losses=[2.0], buckets=[0])
    assert calls[0] == ("init", {"project": "p"}) and calls[-1] == ("finish",)
    _, step, data = calls[1]
    assert step == 4 and data["train/loss"] == 2.0 and data["bucket_loss/0"] == 2.0


def test_wandb_requested_but_missing_raises_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` fail
    with pytest.raises(ImportError, match="pip install wandb"):
        StepLogger(None, wandb=True)
    StepLogger(None, wandb=False).close()  # not requested: nothing is imported


def test_bucket_token_shares_of_a_real_epoch_plan():
    import lengthwise

    lengths = np.random.default_rng(0).integers(16, 2000, size=3000)
    plan = lengthwise.plan_epoch(lengths, PlanConfig(max_tokens=8192, buckets=4))
    totals: dict[int, float] = {}
    for k in range(len(plan.bucket)):
        b = int(plan.bucket[k])
        totals[b] = totals.get(b, 0.0) + float(plan.lengths[plan.batch(k)].sum())
    expected = {b: t / sum(totals.values()) for b, t in totals.items()}
    assert bucket_token_shares(plan) == pytest.approx(expected)


def test_sample_weights_weight_the_per_sample_losses_without_changing_real_tokens():
    from lengthwise.train import StepLogger

    log = StepLogger(None)
    losses = [1.0, 2.0, 4.0]
    log.record_micro(loss=2.0, real_tokens=10, sample_losses=losses, sample_weights=[1, 1, 4])
    weighted = log.step(0)
    log.record_micro(loss=2.0, real_tokens=[1, 1, 4], sample_losses=losses)
    by_tokens = log.step(1)
    assert weighted["real_tokens"] == 10 and by_tokens["real_tokens"] == 6
    assert weighted["loss_sample_std"] == pytest.approx(by_tokens["loss_sample_std"])
    log.record_micro(loss=2.0, sample_losses=losses)
    assert log.step(2)["loss_sample_std"] != pytest.approx(weighted["loss_sample_std"])
    with pytest.raises(ValueError, match="sample_weights"):
        log.record_micro(loss=1.0, sample_weights=[1.0])
    with pytest.raises(ValueError, match="one per sample"):
        log.record_micro(loss=1.0, sample_losses=[1.0, 2.0], sample_weights=[1.0])
    log.close()


@pytest.mark.parametrize("kind", ["int", "numpy", "tensor", "default"])
def test_step_numbers_above_2_pow_53_are_logged_exactly(tmp_path, kind):
    import torch

    first = 2**53 + 1  # the first integer a float64 cannot hold
    path = tmp_path / "log.jsonl"
    with StepLogger(path) as log:
        for offset in range(3):
            step = {"int": first + offset, "numpy": np.uint64(first + offset),
                    "tensor": torch.tensor(first + offset), "default": None}[kind]
            if kind == "default" and offset == 0:
                step = first
            log.step(step, loss=1.0, epoch=np.int64(first))
    records = read_log(path)
    assert [r["step"] for r in records] == [first, first + 1, first + 2]
    assert all(type(r["step"]) is int and r["epoch"] == first for r in records)


def test_a_negative_integer_step_is_refused():
    log = StepLogger(None)
    with pytest.raises(ValueError, match="step must be a non-negative integer"):
        log.step(-(2**60), loss=1.0)
    log.close()
