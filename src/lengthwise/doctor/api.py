"""``diagnose``: read a log, run the registry of analyses, rank their findings.

The :class:`~lengthwise.doctor.diagnosis.Diagnosis` of the log computes each
shared result once; every analysis of :data:`~lengthwise.doctor.analyses.ANALYSES`
returns its findings; :func:`~lengthwise.doctor.render.rank` turns them into the
verdict of the :class:`Report`.

Example::

    >>> from lengthwise.doctor import diagnose
    >>> import numpy as np
    >>> noise = np.random.default_rng(0).standard_normal(1500)
    >>> diagnose([{"step": s, "loss": 2.0 + 0.05 * e} for s, e in enumerate(noise, 1)]
    ...          ).verdict.clean
    True
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from lengthwise.doctor.analyses import run_analyses
from lengthwise.doctor.diagnosis import DiagnoseOptions, Diagnosis, Source, load
from lengthwise.doctor.render import rank
from lengthwise.doctor.report import Report, Verdict


def diagnose(source: Source, **options: Any) -> Report:
    """Diagnose one training log.

    ``source`` is a log path (JSONL, ``.gz``, CSV, TensorBoard file or directory),
    an in-memory list of row dicts, or a :class:`RunLog`. The options are those of
    :class:`~lengthwise.doctor.diagnosis.DiagnoseOptions`: ``start``/``end`` fix
    the stable region (steps, inclusive); ``checkpoint_every`` or ``checkpoints``
    give checkpoint steps when the log has no checkpoint events;
    ``steps_per_epoch``, ``batch_size`` (samples per optimizer step) and
    ``eval_every`` are the lengths a period is matched against; ``world_size``
    (data-parallel processes; default: a ``training_args.json`` or config file
    beside the log, see :mod:`lengthwise.doctor.run_config`) enters the
    mega-batch arithmetic. ``seed`` makes the bootstrap and permutation tests
    reproducible. ``order`` is the batch order the run used (default: the log's
    ``plan`` event, see :func:`~lengthwise.doctor.run_config.logged_order`); the
    doctor does not prescribe it. ``clip`` is the gradient-clipping norm
    (default: a config file beside the log, see
    :func:`~lengthwise.doctor.run_config.clip_beside`), for the clip rate.
    ``timing=False`` leaves the logged step times out (no slow-step, straggler or
    throughput finding): they measure the machine and its load, not the run, so a
    verdict that must read the same on every machine (the demo's, the order
    experiments') is made without them.
    """
    opts = DiagnoseOptions(**options)
    d = Diagnosis(load(source, step_key=opts.step_key, loss_key=opts.loss_key), opts, source)
    findings = run_analyses(d)
    shown = {f.name for f in fields(Report)} - {"verdict"}
    return Report(**{name: getattr(d, name) for name in shown},
                  verdict=rank(findings, d.stats.loss_roughness))


def verdict_for(source: Source, **options: Any) -> Verdict:
    """The verdict of one log: ``diagnose(source, **options).verdict``.

    The one verdict the command line, the demo and the API show.

    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> verdict_for([{"step": s, "loss": 2.0 + 0.5 * (s % 2) + 0.05 * rng.standard_normal()}
    ...              for s in range(1, 1501)]).clean
    False
    """
    return diagnose(source, **options).verdict
