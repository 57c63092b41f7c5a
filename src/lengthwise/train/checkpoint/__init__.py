"""Atomic, asynchronous training checkpoints that resume a run exactly.

A checkpoint holds the model, the optimizer, the learning-rate scheduler, the
sampler's position (anything with ``state_dict``/``load_state_dict``), the RNG
states of Python, NumPy, torch and CUDA, the step and free-form ``extra`` data.

How it is written:

- **Under torch.distributed** (a process group is initialised) it uses PyTorch's
  distributed checkpointing, ``torch.distributed.checkpoint.async_save``: every
  rank stages its shard into CPU memory (the only part that blocks the loop) and a
  background thread writes it. Sharded models (FSDP, DTensor) save and load
  through ``get_model_state_dict``/``get_optimizer_state_dict``. The save's own
  collectives run on a separate gloo group (created once, on the first save), so
  they neither interleave with the loop's collectives nor need a CPU backend in
  the training group. Every rank's RNG and sampler states are kept, per rank.
- **In a single process** (no process group) it copies the state to CPU memory and
  a background thread writes it with ``torch.save`` to ``state.pt``.

Either way the files go to ``step_N.tmp/`` first; once all are written the writer
thread hashes them and a ``COMPLETE`` manifest listing every file's size and SHA-256
is added, then the folder is renamed to ``step_N/``, so a crash in the middle of a
save leaves the previous checkpoint as the latest complete one. Loading checks the
files against the manifest (:class:`CorruptCheckpointError` names the bad file and
the previous good checkpoint); :func:`latest_checkpoint` skips corrupt ones with a
warning. Only the newest ``keep`` complete checkpoints are kept.

A folder has one writer at a time: a checkpointer takes the advisory lock
``writer.lock`` on its first save and gives it up on ``close()`` (the operating system
drops it when the process dies); a second writer meets :class:`CheckpointLockedError`
naming the folder and the holder, so two runs never overwrite or prune each other's
steps.

Nothing in a checkpoint folder runs when it is loaded: the tensors are read with
``torch.load(weights_only=True)`` (the index of a distributed checkpoint by an
unpickler that builds only its own classes), the rest of the training state is JSON
(:mod:`~lengthwise.train.checkpoint.state`), and every file must be listed in
the manifest with its checksum. A checkpoint of an older format (versions 1 and 2,
whose state was a pickle) is refused with :class:`LegacyCheckpointError` naming it;
nothing in it is read.

Modules: :mod:`~lengthwise.train.checkpoint.checkpointer` (:class:`Checkpointer`,
:func:`save_checkpoint`, :class:`PendingSave`, :func:`load_checkpoint`),
:mod:`~lengthwise.train.checkpoint.folder` (folders, manifest, checksums, publishing and
pruning, :func:`list_checkpoints`, :func:`latest_checkpoint`, the errors),
:mod:`~lengthwise.train.checkpoint.lock` (one writer per folder),
:mod:`~lengthwise.train.checkpoint.state` (RNG, scheduler and sampler states, as JSON)
and the backends :mod:`~lengthwise.train.checkpoint.torch_backend` and
:mod:`~lengthwise.train.checkpoint.dcp_backend`.

Example::

    >>> import tempfile, torch
    >>> from lengthwise.train import Checkpointer, load_checkpoint
    >>> model = torch.nn.Linear(2, 2)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> root = tempfile.mkdtemp()
    >>> with Checkpointer(root, keep=2) as ckpt:
    ...     pending = ckpt.save(10, model=model, optimizer=opt, extra={"note": "hi"})
    ...     path = pending.wait()
    >>> path.name
    'step_10'
    >>> load_checkpoint(root, model=model, optimizer=opt)["extra"]
    {'note': 'hi'}
"""

from __future__ import annotations

from lengthwise.train.checkpoint.checkpointer import (
    Checkpointer,
    PendingSave,
    load_checkpoint,
    save_checkpoint,
)
from lengthwise.train.checkpoint.folder import (
    CheckpointError,
    CheckpointLockedError,
    CorruptCheckpointError,
    LegacyCheckpointError,
    latest_checkpoint,
    list_checkpoints,
)

__all__ = [
    "Checkpointer",
    "CheckpointError",
    "CheckpointLockedError",
    "CorruptCheckpointError",
    "LegacyCheckpointError",
    "PendingSave",
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
]
