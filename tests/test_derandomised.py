"""CI's property tests draw the same examples every run, whatever order tests run in.

The ``ci`` Hypothesis profile is derandomised (tests/conftest.py), but Hypothesis also
draws constants from every local module loaded at the time a test draws.  tests/run.sh
runs the suite in two pytest-xdist workers, and which tests a worker ran before a given
one is decided by timing, so a module imported lazily by some test would make the
examples of later tests in that worker differ from run to run.  conftest's
``_every_local_module_loaded`` imports every module of memtier and bench first.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

import pytest
from hypothesis import settings

# As conftest's _LOCAL_PACKAGES, written out again: the packages of this repository whose
# modules Hypothesis counts as local (tests/ it leaves out itself).
_LOCAL_PACKAGES = ("memtier", "bench")


def _local_modules() -> list[str]:
    names: list[str] = []
    for name in _LOCAL_PACKAGES:
        package = importlib.import_module(name)
        names.extend(
            info.name
            for info in pkgutil.walk_packages(package.__path__, name + ".")
            if not info.name.endswith(".__main__")
        )
    return names


def test_every_local_module_is_loaded_before_any_test_draws() -> None:
    names = _local_modules()
    assert len(names) > 100  # memtier's and bench's modules, found by the walk
    missing = [name for name in names if name not in sys.modules]
    assert missing == [], f"loaded only when a test imports them: {missing}"


def test_the_ci_profile_is_derandomised_and_loaded() -> None:
    if os.environ.get("MEMTIER_HYPOTHESIS_PROFILE", "ci") != "ci":  # never with CI set
        pytest.skip("another Hypothesis profile was asked for")
    assert settings().derandomize is True
    assert settings().database is None
