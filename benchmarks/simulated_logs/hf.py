"""Simulated Hugging Face Trainer logs: length-grouped cycles over processes, epochs as progress.

The Trainer's length-grouped sampler sorts each mega-batch of
``m = min(N // (4 * batch), 50)`` per-process batches by length (longest
first) and restarts at each epoch; with ``world_size`` processes an optimizer
step takes ``world_size`` of those batches, so the loss repeats every
``m / world_size`` steps (:func:`lengthwise.doctor.context.megabatch_steps`).
Each logged row is the mean of the ``interval`` steps it covers (``logging_steps``)
and carries ``epoch`` as the Trainer writes it: ``step / steps_per_epoch``
rounded to 2 decimals, so the last row of an epoch reads exactly ``k.0`` when
the epoch ends on a logged step.

Example::

    >>> rows = simulate_hf_log(steps=400, steps_per_epoch=100, world_size=4, interval=10)
    >>> len(rows), rows[9]["step"], rows[9]["epoch"]
    (40, 100, 1.0)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lengthwise.doctor.context import megabatch_steps

from simulated_logs.runs import ar1_noise


def simulate_hf_log(
    *,
    steps: int = 2000,
    steps_per_epoch: int = 210,
    world_size: int = 1,
    interval: int = 1,
    amplitude: float = 0.15,
    noise: float = 0.05,
    phi: float = 0.3,
    epoch_drop: float = 0.0,
    grouped: bool = True,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Rows ``{step, loss, lr, epoch}`` of a simulated run, one every ``interval`` steps.

    ``grouped`` adds the length-grouped saw-tooth (``amplitude`` in log-loss,
    longest batches first, its phase reset at each epoch start); ``epoch_drop``
    lowers the loss by that fraction at each epoch start; ``noise`` is per-step
    AR(1) noise of lag-1 autocorrelation ``phi``.
    """
    rng = np.random.default_rng(seed)
    t = np.arange(1, steps + 1, dtype=np.float64)
    ar = ar1_noise(steps, noise, phi, rng)
    epoch_index = np.floor((t - 1) / steps_per_epoch)
    log_loss = np.log(0.8 + 1.5 * np.exp(-3.0 * t / steps)) + ar
    log_loss += np.log1p(-epoch_drop) * epoch_index
    if grouped:
        cycle = megabatch_steps(steps_per_epoch, world_size)
        into = (t - 1) - epoch_index * steps_per_epoch
        log_loss += amplitude * (0.5 - np.mod(into, cycle) / cycle)
    loss = np.exp(log_loss)
    rows = []
    for end in range(interval, steps + 1, interval):
        rows.append({"step": end, "loss": float(loss[end - interval : end].mean()),
                     "lr": 2e-4, "epoch": round(end / steps_per_epoch, 2)})
    return rows
