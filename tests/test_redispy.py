"""The ``redis_py`` marker and the run on the oldest supported redis-py (tests/redispy.py).

An inner pytest (a copy of tests/redispy.py and a conftest that calls it) shows that a
test marked for a newer redis-py than installed is deselected only in the floor run,
runs everywhere else, that the floor run stops if another redis-py was imported, and
that a malformed marker is refused.  And the floor ``tests/run.sh`` installs is the one
``pyproject.toml`` declares, the oldest release the suite was made to pass on.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import redispy
from redispy import FLOOR_RUN_VARIABLE, INSTALLED, at_least, version_tuple

ROOT = Path(__file__).resolve().parent.parent

INNER_CONFTEST = """
import pytest
from redispy import deselect_newer


def pytest_configure(config):
    config.addinivalue_line("markers", "redis_py(version): needs a newer redis-py")


def pytest_collection_modifyitems(config, items):
    deselect_newer(config, items)
"""

INNER_TESTS = """
import pytest


def test_unmarked():
    pass


@pytest.mark.redis_py("1.0")
def test_needs_an_old_release():
    pass


@pytest.mark.redis_py("999.0")
def test_needs_a_release_not_yet_made():
    pass
"""


def _inner(tmp_path: Path, tests: str, floor: str | None) -> tuple[int, str]:
    inner = tmp_path / "inner"
    inner.mkdir(exist_ok=True)
    source = Path(__file__).resolve().parent / "redispy.py"
    (inner / "redispy.py").write_text(source.read_text(), encoding="utf-8")
    (inner / "conftest.py").write_text(INNER_CONFTEST, encoding="utf-8")
    (inner / "test_inner.py").write_text(tests, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != FLOOR_RUN_VARIABLE}
    if floor is not None:
        env[FLOOR_RUN_VARIABLE] = floor
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(inner)],
        capture_output=True,
        timeout=120,
        env=env,
        cwd=inner,
        check=False,
    )
    return done.returncode, (done.stdout + done.stderr).decode("utf-8", "replace")


def _installed() -> str:
    return ".".join(str(part) for part in INSTALLED)


def test_the_floor_run_deselects_only_tests_for_a_newer_redis_py(tmp_path: Path) -> None:
    code, out = _inner(tmp_path, INNER_TESTS, floor=_installed())
    assert code == 0, out
    assert "2 passed, 1 deselected" in out, out


def test_outside_the_floor_run_every_marked_test_runs(tmp_path: Path) -> None:
    code, out = _inner(tmp_path, INNER_TESTS, floor=None)
    assert code == 0, out
    assert "3 passed" in out and "deselected" not in out, out


def test_the_floor_run_stops_if_another_redis_py_was_imported(tmp_path: Path) -> None:
    code, out = _inner(tmp_path, INNER_TESTS, floor="1.0.0")
    assert code == pytest.ExitCode.USAGE_ERROR, out
    assert f"redis-py {redis.__version__} was imported" in out, out


@pytest.mark.parametrize("args", ["", "8.0, 8.1", "8"])
def test_a_malformed_marker_is_refused(tmp_path: Path, args: str) -> None:
    tests = f"import pytest\n\n@pytest.mark.redis_py({args})\ndef test_x():\n    pass\n"
    code, out = _inner(tmp_path, tests, floor=_installed())
    assert code == pytest.ExitCode.USAGE_ERROR, out
    assert "use @pytest.mark.redis_py('8.0')" in out, out


@pytest.mark.parametrize("text", ["", "8.x", "8..0", "1.2.3.4", "v8", "8.0rc1"])
def test_version_tuple_refuses_what_is_not_a_release_number(text: str) -> None:
    with pytest.raises(ValueError, match="not a redis-py release number"):
        version_tuple(text)


def test_at_least_compares_release_numbers_not_text(monkeypatch: pytest.MonkeyPatch) -> None:
    major, minor = INSTALLED[0], INSTALLED[1]
    assert at_least(f"{major}.{minor}") and at_least(f"{major}") and at_least("1.0")
    assert not at_least(f"{major}.{minor + 1}") and not at_least(f"{major + 1}.0")
    monkeypatch.setattr(redispy, "INSTALLED", (6, 10, 0))
    assert at_least("6.3") and at_least("6.9.9") and at_least("6.10")  # not text order
    assert not at_least("6.11") and not at_least("6.10.1") and not at_least("7")


def test_run_sh_installs_the_floor_pyproject_declares() -> None:
    """The floor run reads the floor from pyproject.toml (one source), and the newest
    redis-py the main run installs is at or above it."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    declared = re.findall(r'^\s*"redis\[hiredis\]>=([0-9][0-9.]*)",', pyproject, re.M)
    assert declared == ["6.3"]  # README's "Supported redis-py" names it too
    run_sh = (ROOT / "tests" / "run.sh").read_text(encoding="utf-8")
    assert 's/^ *"redis\\[hiredis\\]>=\\([0-9][0-9.]*\\)",.*/\\1/p' in run_sh
    assert at_least(declared[0])
