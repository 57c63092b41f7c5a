"""Test settings shared by every test folder."""

import os

from hypothesis import settings

# CI runs each property test on the same examples every time (a failure there is reproducible
# from its log); a local run explores fresh examples on each run.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
