"""Every at-scale target in one run: distributions, windows and memory, tokenizing.

Usage::

    python benchmarks/at_scale.py            # about 20 minutes on 2 cores
    python benchmarks/at_scale.py --quick

Runs, one after the other, ``shape_targets.py`` (efficiency, composition and
64-rank balance over generated and bundled distributions ->
``SHAPE_RESULTS.md``), ``scale_targets.py`` (windowed plans over memory-mapped
lengths up to 1,000,000,000 samples beside whole-epoch planning and Hugging
Face's ``LengthGroupedSampler`` -> ``SCALE_RESULTS.md``) and
``tokenize_throughput.py`` (tokens per second per core, ``datasets.map`` against
Ray Data -> ``TOKENIZE_RESULTS.md``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    runs = [["shape_targets.py"], ["scale_targets.py"], ["tokenize_throughput.py"]]
    if args.quick:
        runs = [[*r, "--quick"] if r[0] != "tokenize_throughput.py" else
                [*r, "--rows", "5000", "--out", str(HERE / "TOKENIZE_RESULTS.quick.md")]
                for r in runs]
        runs[0] += ["--out", str(HERE / "SHAPE_RESULTS.quick.md")]
        runs[1] += ["--out", str(HERE / "SCALE_RESULTS.quick.md")]
    worst = 0
    for run in runs:
        started = time.perf_counter()
        code = subprocess.call([sys.executable, str(HERE / run[0]), *run[1:]])
        print(f"{run[0]}: exit {code} after {time.perf_counter() - started:.0f} s", flush=True)
        worst = max(worst, code)
    return worst


if __name__ == "__main__":
    sys.exit(main())
