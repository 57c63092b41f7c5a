"""Simulated training logs whose diagnosis is known by construction, for the doctor's tests and
benchmarks (not installed: the benchmark scripts import it from beside them, the tests through
``tests/conftest.py``).

* :mod:`simulated_logs.runs`: a run under each batching order, clean logs, the labelled set;
* :mod:`simulated_logs.events`: resumes, a second writer, evaluations, the DFlash recipe's log;
* :mod:`simulated_logs.hf`: Hugging Face Trainer logs of a length-grouped sampler;
* :mod:`simulated_logs.micro`: per-micro-batch logs.
"""
