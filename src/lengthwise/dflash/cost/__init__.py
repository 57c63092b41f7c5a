"""The cost of a DFlash stage before it runs: its peak memory and its time.

One model of a step, traced through the stages' own modules (:mod:`.trace`: the target and
draft under fake tensors, their weights and activations as the code allocates them):

- :mod:`.step_memory`, :mod:`.stage_memory`: the peak of a training step, and of each
  stage's whole process (train, regenerate, eval, features);
- :mod:`.flops`: a step's FLOPs per micro-batch (NumPy), its units read from the modules;
- :mod:`.train_time`, :mod:`.regenerate_time`: a run's and a regeneration's seconds, their
  plan priced by a :mod:`.profile` timed on a few of their own steps or batches;
- :mod:`.target_config`, :mod:`.device_memory`, :mod:`.resident`: the target's
  ``config.json``, a device's memory, a process's resident memory.

``lengthwise dflash estimate`` prints them. Importing this package loads nothing heavy.

Example::

    >>> from lengthwise.dflash.cost.device_memory import memory_size
    >>> memory_size("80GiB") // 2**30
    80
"""
