"""A simple simulation of training that writes logs whose diagnosis is known by construction.

The per-step loss is a decaying curve plus the effect of the step's batch
composition plus noise. Each sample of length ``L`` shifts the per-token loss
by ``-length_effect * log(L / median)`` (long documents are easier per token),
and a step's loss averages that over its tokens. The batching ``order`` decides
the composition:

* ``"random"``: every step draws samples at random (no buckets logged);
* ``"bucketed"``: every step's samples come from one length bucket, buckets
  in random order (the reference run's "fluffy" loss: bands);
* ``"stratified"``: every step draws the same share from each bucket (clean);
* ``"sorted_megabatch"``: ``megabatch`` steps' worth of samples are sorted by
  length and cut into steps (a sawtooth with period ``megabatch``).

On top: checkpoint events every ``checkpoint_every`` steps, optionally with a
spike right after each save (``checkpoint_spikes``) and a throughput stall,
``random_spikes`` spikes at random steps away from checkpoints, and NaN losses
at ``nan_steps``. Rows carry the fields of the project's step logger.

Example::

    >>> run = simulate_run("sorted_megabatch", steps=600, megabatch=40, seed=1)
    >>> run.labels["period"], run.labels["bands"]
    (40, 1)
    >>> sorted(run.records[0])[:4]
    ['bucket', 'corrected_loss', 'epoch', 'grad_norm']
"""

from __future__ import annotations

import gzip
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.atomic import atomic_open
from lengthwise.doctor.bands import MODE_FLOOR, VALLEY, merge_peaks
from lengthwise.errors import ConfigError
from lengthwise.finite_json import finite_json_line

ORDERS = ("random", "bucketed", "stratified", "sorted_megabatch")


@dataclass
class SimulatedRun:
    """Log rows (steps and events, in log order), the true findings, and the settings."""

    records: list[dict[str, Any]]
    labels: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the rows as JSON lines (gzip when the name ends in ``.gz``); a NaN loss as null."""
        path = Path(path)
        text = "".join(finite_json_line(r) + "\n" for r in self.records)
        data = text.encode()
        with atomic_open(path) as fh:
            fh.write(gzip.compress(data) if path.name.endswith(".gz") else data)
        return path


def population_bands(comp: np.ndarray, noise: float) -> int:
    """Bands of the per-step loss offset: clear modes of its density (composition + noise).

    ``comp`` is a large sample of the composition effect; its histogram convolved
    with the Gaussian step noise is the true density of the detrended loss, and
    its modes separated by a valley of at least 20 % are the bands.
    """
    lo, hi = float(comp.min()) - 5 * noise, float(comp.max()) + 5 * noise
    bins = 4096
    counts, edges = np.histogram(comp, bins=bins, range=(lo, hi))
    dx = edges[1] - edges[0]
    freq = np.fft.rfftfreq(bins, d=dx)
    f = np.fft.irfft(np.fft.rfft(counts) * np.exp(-0.5 * (2 * np.pi * freq * noise) ** 2), bins)
    f = np.maximum(f, 0.0)
    return len(merge_peaks(f, VALLEY, MODE_FLOOR))


def simulate_run(
    order: str = "bucketed",
    *,
    steps: int = 3000,
    seed: int = 0,
    num_buckets: int = 3,
    batch_size: int = 8,
    noise: float = 0.02,
    length_effect: float = 0.3,
    megabatch: int = 50,
    warmup: int | None = None,
    checkpoint_every: int | None = None,
    checkpoint_spikes: bool = False,
    random_spikes: int = 0,
    spike_height: float = 0.8,
    spike_recovery: float = 4.0,
    nan_steps: tuple[int, ...] = (),
    log_bucket: bool = True,
    median_length: float = 1050.0,
    sigma: float = 0.5,
    max_len: int = 8192,
    sample_std: float | None = None,
) -> SimulatedRun:
    """Simulate one run; see the module docstring for the model."""
    if order not in ORDERS:
        raise ConfigError(f"unknown order {order!r}; choose one of {', '.join(ORDERS)}")
    if steps < 100:
        raise ConfigError(f"steps must be at least 100, got {steps}")
    rng = np.random.default_rng(seed)
    pool, edges, members = _length_pool(rng, median_length, sigma, max_len, num_buckets)
    warmup = max(1, steps // 20) if warmup is None else warmup

    lengths, step_buckets = _compose(order, steps, batch_size, num_buckets, megabatch, members,
                                     pool, edges, rng)
    comp = _composition_effect(lengths, length_effect, median_length)
    t = np.arange(1, steps + 1, dtype=np.float64)
    base = 2.0 + 2.5 * np.exp(-t / (steps / 8.0))
    loss, corrected, sample_sd = _noisy_losses(base, comp, noise, sample_std, lengths.shape[1],
                                               rng)

    checkpoints = (
        list(range(checkpoint_every, steps + 1, checkpoint_every)) if checkpoint_every else []
    )
    spikes = _spike_steps(checkpoints, checkpoint_spikes, random_spikes, steps, rng)
    bump = _spike_bump(spikes, steps, spike_height, spike_recovery, rng)
    loss = loss + bump
    for s in nan_steps:
        if 1 <= s <= steps:
            loss[s - 1] = math.nan

    stall = set(c + 1 for c in checkpoints) if checkpoint_spikes else set()
    records = _step_records(
        lengths, step_buckets if log_bucket else None, loss=loss,
        lr=_learning_rate(t, steps, warmup), bump=bump, corrected=corrected,
        sample_sd=sample_sd, checkpoints=set(checkpoints), stall=stall, rng=rng,
    )

    big, _ = _compose(order, 20_000, batch_size, num_buckets, megabatch, members, pool, edges,
                      np.random.default_rng(seed + 7919))
    population = (big * -length_effect * np.log(big / median_length)).sum(axis=1) / big.sum(axis=1)
    labels = _labels(order, population, noise, megabatch, spikes,
                     checkpoints, checkpoint_spikes, nan_steps, steps)
    if sample_std is not None:
        labels["noise_shares"] = noise_shares(comp, step_buckets, noise,
                                              sample_std**2 / lengths.shape[1])
    config = {
        "order": order, "steps": steps, "seed": seed, "num_buckets": num_buckets,
        "batch_size": batch_size, "noise": noise, "length_effect": length_effect,
        "megabatch": megabatch, "checkpoint_every": checkpoint_every,
        "checkpoint_spikes": checkpoint_spikes, "random_spikes": random_spikes,
        "spike_height": spike_height, "nan_steps": list(nan_steps), "log_bucket": log_bucket,
        "sample_std": sample_std,
    }
    return SimulatedRun(records=records, labels=labels, config=config)


def _length_pool(
    rng: np.random.Generator, median_length: float, sigma: float, max_len: int, num_buckets: int
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """A large log-normal pool of lengths, its bucket edges and each bucket's members."""
    pool = np.clip(rng.lognormal(math.log(median_length), sigma, 200_000), 16, max_len)
    pool = np.round(pool).astype(np.int64)
    edges = np.quantile(pool, np.linspace(0, 1, num_buckets + 1)[1:-1])
    bucket_of = np.searchsorted(edges, pool, side="right")
    members = [pool[bucket_of == b] for b in range(num_buckets)]
    return pool, edges, members


def _composition_effect(
    lengths: np.ndarray, length_effect: float, median_length: float
) -> np.ndarray:
    """Each step's loss shift from its lengths: the token-weighted mean of the sample effects."""
    effect = -length_effect * np.log(lengths / median_length)
    return (lengths * effect).sum(axis=1) / lengths.sum(axis=1)


def _noisy_losses(
    base: np.ndarray,
    comp: np.ndarray,
    noise: float,
    sample_std: float | None,
    n: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The logged loss, the composition-free loss and (with ``sample_std``) per-step sample sds."""
    steps = base.size
    loss = base + comp + noise * rng.standard_normal(steps)
    corrected = base + noise * rng.standard_normal(steps) + float(np.mean(comp))
    sample_sd = None
    if sample_std is not None:
        loss = loss + sample_std / math.sqrt(n) * rng.standard_normal(steps)
        sample_sd = sample_std * np.sqrt(rng.chisquare(n - 1, steps) / (n - 1))
    return loss, corrected, sample_sd


def _spike_steps(
    checkpoints: list[int],
    checkpoint_spikes: bool,
    random_spikes: int,
    steps: int,
    rng: np.random.Generator,
) -> list[int]:
    """The steps that spike: right after each save (with ``checkpoint_spikes``) and at random."""
    spikes: list[int] = []
    if checkpoint_spikes:
        spikes += [c + 1 for c in checkpoints if c + 1 <= steps]
    spikes += _random_spike_steps(random_spikes, steps, checkpoints, rng)
    return sorted(set(spikes))


def _spike_bump(
    spikes: list[int], steps: int, height: float, recovery: float, rng: np.random.Generator
) -> np.ndarray:
    """The loss added by the spikes: a jump of about ``height`` decaying over ``recovery``."""
    bump = np.zeros(steps)
    for s0 in spikes:
        k = np.arange(s0, steps + 1)
        h = height * (0.8 + 0.4 * rng.random())
        bump[s0 - 1 :] += h * np.exp(-(k - s0) / recovery)
    return bump


def _learning_rate(t: np.ndarray, steps: int, warmup: int) -> np.ndarray:
    """Linear warmup to 3e-4, then a cosine down to a tenth of it."""
    peak_lr = 3e-4
    decay = 0.5 * (1 + np.cos(np.pi * (t - warmup) / (steps - warmup)))
    return np.where(t <= warmup, peak_lr * t / warmup, peak_lr * (0.1 + 0.9 * decay))


def _step_records(
    lengths: np.ndarray,
    step_buckets: list[Any] | None,
    *,
    loss: np.ndarray,
    lr: np.ndarray,
    bump: np.ndarray,
    corrected: np.ndarray,
    sample_sd: np.ndarray | None,
    checkpoints: set[int],
    stall: set[int],
    rng: np.random.Generator,
) -> list[dict[str, Any]]:
    """The log rows: one per step in the step logger's fields, checkpoint events after saves."""
    steps = lengths.shape[0]
    padded = lengths.shape[1] * (np.ceil(lengths.max(axis=1) / 8) * 8)
    seconds = padded / 60_000.0 + 0.05
    records: list[dict[str, Any]] = []
    for i in range(steps):
        step = i + 1
        sec = seconds[i] + (2.0 if step in stall else 0.0)
        row: dict[str, Any] = {
            "step": step,
            "epoch": round(step / steps * 2, 4),
            "loss": float(loss[i]) if math.isfinite(loss[i]) else math.nan,
            "lr": float(lr[i]),
            "grad_norm": round(float(0.5 + 0.1 * rng.random() + 3 * bump[i]), 5),
            "real_tokens": int(lengths[i].sum()),
            "padded_tokens": int(padded[i]),
            "tokens_per_second": round(float(lengths[i].sum() / sec), 2),
            "samples": int(lengths.shape[1]),
            "corrected_loss": float(corrected[i]),
        }
        if sample_sd is not None:
            row["loss_sample_std"] = float(sample_sd[i])
        if step_buckets is not None and step_buckets[i] is not None:
            key = "buckets" if isinstance(step_buckets[i], list) else "bucket"
            row[key] = step_buckets[i]
        records.append(row)
        if step in checkpoints:
            records.append({"event": "checkpoint_begin", "step": step})
            records.append({"event": "checkpoint_end", "step": step, "seconds": 2.0})
    return records


def noise_shares(
    comp: np.ndarray, buckets: list[Any], noise: float, sampling_var: float
) -> dict[str, float]:
    """True shares of the per-step loss variance: sampling, composition, unexplained.

    Composition is the variance of the steps' composition effect that the
    logged bucket carries (its between-bucket part when every step holds one
    bucket, else all of it); the rest of the composition effect and the extra
    step noise are unexplained. There is no schedule part in the simulation.
    """
    single = all(isinstance(b, int) for b in buckets)
    if single:
        codes = np.asarray(buckets)
        means = np.array([comp[codes == b].mean() for b in range(codes.max() + 1)
                          if (codes == b).any()])
        counts = np.array([(codes == b).sum() for b in range(codes.max() + 1)
                           if (codes == b).any()])
        between = float((counts * (means - comp.mean()) ** 2).sum() / comp.size)
    else:
        between = float(comp.var())
    within = float(comp.var()) - between
    total = sampling_var + float(comp.var()) + noise**2
    return {"sampling": sampling_var / total, "composition": between / total,
            "schedule": 0.0, "unexplained": (within + noise**2) / total}


def _compose(
    order: str,
    steps: int,
    batch_size: int,
    num_buckets: int,
    megabatch: int,
    members: list[np.ndarray],
    pool: np.ndarray,
    edges: np.ndarray,
    rng: np.random.Generator,
) -> tuple[np.ndarray, list[Any]]:
    """Sample lengths (steps x batch_size) and the bucket label of each step."""
    labels: list[Any] = [None] * steps
    if order == "random":
        return rng.choice(pool, (steps, batch_size)), labels
    if order == "bucketed":
        which = rng.integers(0, num_buckets, steps)
        out = np.empty((steps, batch_size), dtype=np.int64)
        for b in range(num_buckets):
            sel = which == b
            out[sel] = rng.choice(members[b], (int(sel.sum()), batch_size))
        return out, [int(b) for b in which]
    if order == "stratified":
        per = max(1, batch_size // num_buckets)
        parts = [rng.choice(members[b], (steps, per)) for b in range(num_buckets)]
        return np.concatenate(parts, axis=1), [list(range(num_buckets))] * steps
    out = np.empty((steps, batch_size), dtype=np.int64)
    for start in range(0, steps, megabatch):
        count = min(megabatch, steps - start)
        mega = np.sort(rng.choice(pool, count * batch_size))[::-1]
        out[start : start + count] = mega.reshape(count, batch_size)
    bucket = np.searchsorted(edges, np.median(out, axis=1), side="right")
    return out, [int(b) for b in bucket]


def _random_spike_steps(
    count: int, steps: int, checkpoints: list[int], rng: np.random.Generator
) -> list[int]:
    """Spike steps in the second half of the run, at least 25 steps from saves and each other."""
    chosen: list[int] = []
    lo, hi = int(steps * 0.4), steps - 60
    tries = 0
    while len(chosen) < count and tries < 10_000:
        tries += 1
        s = int(rng.integers(lo, hi))
        if any(abs(s - c) < 25 for c in checkpoints) or any(abs(s - c) < 25 for c in chosen):
            continue
        chosen.append(s)
    return chosen


def _labels(
    order: str,
    population: np.ndarray,
    noise: float,
    megabatch: int,
    spikes: list[int],
    checkpoints: list[int],
    checkpoint_spikes: bool,
    nan_steps: tuple[int, ...],
    steps: int,
) -> dict[str, Any]:
    """The findings the doctor should report, from the simulation's own quantities."""
    bands = population_bands(population, noise)
    has_ck = bool(checkpoints)
    if not spikes or not has_ck:
        associated = None
    else:
        associated = bool(checkpoint_spikes)
    return {
        "bands": bands,
        "period": megabatch if order == "sorted_megabatch" else None,
        "cliffs": spikes,
        "checkpoint_associated": associated,
        "nonfinite": bool(nan_steps),
        "bucket_logged": order in ("bucketed", "stratified", "sorted_megabatch"),
    }


def labelled_set(seed: int = 0, steps: int = 3000) -> list[tuple[str, SimulatedRun]]:
    """The labelled runs of the accuracy benchmark: every order and disturbance, several seeds.

    Harder cases are included on purpose (weak length effect, short periods,
    low spikes), so precision and recall are not 1 by construction.
    """
    runs: list[tuple[str, SimulatedRun]] = []
    rng = np.random.default_rng(seed)
    for rep in range(3):
        s = int(rng.integers(0, 2**31))
        runs += [
            (f"clean_random_{rep}", simulate_run("random", steps=steps, seed=s,
                                                 length_effect=0.0)),
            (f"clean_stratified_{rep}", simulate_run("stratified", steps=steps, seed=s + 1,
                                                     length_effect=0.0)),
            (f"bands3_{rep}", simulate_run("bucketed", steps=steps, seed=s + 2)),
            (f"bands2_weak_{rep}", simulate_run("bucketed", num_buckets=2, length_effect=0.12,
                                                steps=steps, seed=s + 3)),
            (f"bands4_{rep}", simulate_run("bucketed", num_buckets=4, length_effect=0.45,
                                           steps=steps, seed=s + 4)),
            (f"bands6_{rep}", simulate_run("bucketed", num_buckets=6, steps=steps, seed=s + 5)),
            (f"reference_{rep}", simulate_run("bucketed", checkpoint_every=250, random_spikes=4,
                                              spike_height=1.2, steps=steps, seed=s + 6)),
            (f"bands_unlogged_{rep}", simulate_run("bucketed", log_bucket=False, steps=steps,
                                                   seed=s + 7)),
            (f"sawtooth50_{rep}", simulate_run("sorted_megabatch", megabatch=50, steps=steps,
                                               seed=s + 8)),
            (f"sawtooth12_{rep}", simulate_run("sorted_megabatch", megabatch=12, steps=steps,
                                               seed=s + 9)),
            (f"sawtooth200_weak_{rep}", simulate_run("sorted_megabatch", megabatch=200,
                                                     length_effect=0.05, steps=steps,
                                                     seed=s + 10)),
            (f"ckpt_spikes_{rep}", simulate_run("stratified", checkpoint_every=200,
                                                checkpoint_spikes=True, steps=steps, seed=s + 11)),
            (f"ckpt_spikes_low_{rep}", simulate_run("random", checkpoint_every=300,
                                                    checkpoint_spikes=True, spike_height=0.15,
                                                    steps=steps, seed=s + 12)),
            (f"random_spikes_{rep}", simulate_run("stratified", checkpoint_every=200,
                                                  random_spikes=5, steps=steps, seed=s + 13)),
            (f"spikes_no_ckpt_{rep}", simulate_run("random", random_spikes=3, steps=steps,
                                                   seed=s + 14)),
            (f"nan_{rep}", simulate_run("stratified", nan_steps=(int(steps * 0.6),),
                                        steps=steps, seed=s + 15)),
        ]
    return runs


def ar1_noise(n: int, noise: float, phi: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` points of stationary AR(1) noise of spread ``noise`` and lag-1 correlation ``phi``.

    >>> ar1_noise(3, 0.1, 0.5, np.random.default_rng(0)).shape
    (3,)
    """
    e = rng.standard_normal(n) * noise * math.sqrt(1 - phi * phi)
    ar = np.empty(n)
    ar[0] = rng.standard_normal() * noise
    for i in range(1, n):
        ar[i] = phi * ar[i - 1] + e[i]
    return ar


def simulate_clean(
    points: int,
    *,
    seed: int = 0,
    phi: float = 0.5,
    noise: float = 0.02,
    fall: float = 3.0,
    lr_drop: bool = True,
    epochs: int = 0,
    epoch_drop: float = 0.05,
    interval: int = 1,
) -> list[dict[str, Any]]:
    """A log with nothing wrong, shaped like real runs: for false-positive rates.

    The loss decays by a factor ``fall`` (exponentially, so a fast-decaying run
    has ``fall`` in the hundreds) times ``exp`` of AR(1) noise (lag-1
    autocorrelation ``phi``, standard deviation ``noise``). The learning rate
    warms up over the first 5 % and follows a cosine; with ``lr_drop`` it is
    also cut in half at 60 % of the run, which lowers the loss by 2 % from there
    on (a schedule change, not a cliff). ``epochs`` > 1 splits the run into that
    many epochs, each starting ``epoch_drop`` lower (multi-epoch memorisation;
    the rows carry an ``epoch`` field). Rows are logged every ``interval`` steps.

    >>> rows = simulate_clean(50, seed=1, epochs=2)
    >>> len(rows), sorted(rows[0])
    (50, ['epoch', 'loss', 'lr', 'step'])
    """
    rng = np.random.default_rng(seed)
    n = points
    t = np.arange(n, dtype=np.float64)
    ar = ar1_noise(n, noise, phi, rng)
    level = 1.0 + (fall - 1.0) * np.exp(-5.0 * t / max(n, 1))
    warm = max(1, n // 20)
    lr = 3e-4 * np.minimum(1.0, (t + 1) / warm) * (0.55 + 0.45 * np.cos(np.pi * t / n))
    if lr_drop:
        cut = t >= 0.6 * n
        lr = np.where(cut, 0.5 * lr, lr)
        level = level * np.where(cut, 0.98, 1.0)
    epoch = t / n * max(epochs, 1)
    if epochs > 1:
        level = level * (1.0 - epoch_drop) ** np.floor(epoch)
    loss = level * np.exp(ar)
    done = (t + 1) / n * max(epochs, 1)  # progress after each step, as trainers log it
    return [{"step": int((i + 1) * interval), "loss": float(loss[i]), "lr": float(lr[i]),
             "epoch": round(float(done[i]), 4)} for i in range(n)]
