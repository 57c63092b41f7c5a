"""The cost of a DFlash stage before it runs: its peak memory and its time.

- :mod:`.memory`: the peak of a training step and of each stage's whole process, the
  stages' own modules traced under fake tensors from the target's ``config.json``;
- :mod:`.flops`: a step's FLOPs per micro-batch, its units read from the same modules;
- :mod:`.timing`: a run's and a regeneration's seconds, their plan priced by a profile
  timed on a few of their own steps or conversations;
- :mod:`.resident`: a process's resident memory.

``lengthwise dflash estimate`` prints them. Importing this package loads nothing heavy.

Example::

    >>> from lengthwise.dflash.cost.timing import duration
    >>> duration(725)
    '12 min'
"""
