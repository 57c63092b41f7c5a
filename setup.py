"""Build of the one compiled part: the bucket-edge DP's layers (everything else is in
pyproject.toml). It is optional: without a C compiler the package installs and runs the
NumPy version of the same DP (``lengthwise.planning.edges``), with the same results."""

import sys

from setuptools import Extension, setup

# contraction of a*b+c into one rounding would change the DP's costs in the last bit
FLAGS = [] if sys.platform == "win32" else ["-O2", "-ffp-contract=off"]

setup(ext_modules=[Extension("lengthwise.planning._layers", ["src/lengthwise/planning/_layers.c"],
                             extra_compile_args=FLAGS, optional=True)])
