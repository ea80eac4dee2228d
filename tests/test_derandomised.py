"""CI's property tests draw the same examples every run, whatever order tests run in.

The ``ci`` Hypothesis profile is derandomised (tests/conftest.py), but Hypothesis also
draws constants from every local module loaded at the time a test draws.  tests/run.sh
runs the suite in two pytest-xdist workers, and which tests a worker ran before a given
one is decided by timing, so a module imported lazily by some test would make the
examples of later tests in that worker differ from run to run.  conftest's
``_every_local_module_loaded`` imports every module of memtier and bench first.
"""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import settings
from localmodules import local_module_names


def test_every_local_module_is_loaded_before_any_test_draws() -> None:
    names = local_module_names()
    assert len(names) > 100  # memtier's and bench's modules, found by the walk
    missing = [name for name in names if name not in sys.modules]
    assert missing == [], f"loaded only when a test imports them: {missing}"


def test_the_ci_profile_is_derandomised_and_loaded() -> None:
    if os.environ.get("MEMTIER_HYPOTHESIS_PROFILE", "ci") != "ci":  # never with CI set
        pytest.skip("another Hypothesis profile was asked for")
    assert settings().derandomize is True
    assert settings().database is None
