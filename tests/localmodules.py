"""The modules of this repository that Hypothesis counts as local code.

Hypothesis draws constants from every local module loaded when a test draws
(hypothesis.internal.conjecture.providers; it leaves out test files itself).
conftest's ``_every_local_module_loaded`` imports all of them before the first test, and
tests/test_derandomised.py checks that none is loaded later.
"""

from __future__ import annotations

import importlib
import pkgutil

__all__ = ["LOCAL_PACKAGES", "local_module_names"]

LOCAL_PACKAGES = ("memtier", "bench")


def local_module_names() -> list[str]:
    """Every module of :data:`LOCAL_PACKAGES` but ``__main__`` (it runs a command line
    when imported).  Walking imports the packages themselves."""
    names: list[str] = []
    for name in LOCAL_PACKAGES:
        package = importlib.import_module(name)
        names.extend(
            info.name
            for info in pkgutil.walk_packages(package.__path__, name + ".")
            if not info.name.endswith(".__main__")
        )
    return names
