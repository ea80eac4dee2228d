"""The wheel ships every Lua script (under ``memtier/_lua``) and ``py.typed``.

The wheel is built once per session (``pip wheel --no-build-isolation``: the
test extra installs hatchling, so nothing is fetched), then inspected as a zip
and imported from an unpacked copy to prove :func:`memtier.scripts.lua_root`
finds the packaged scripts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LUA = REPO / "lua"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [
            sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
            "--no-cache-dir", "-q", "-w", str(out), str(REPO),
        ],
        capture_output=True,
        timeout=600,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr).decode("utf-8", "replace")
    wheels = list(out.glob("memtier-*.whl"))
    assert len(wheels) == 1, wheels
    yield wheels[0]


def _lua_sources() -> list[str]:
    return sorted(p.relative_to(LUA).as_posix() for p in LUA.rglob("*.lua"))


def test_wheel_contains_every_lua_file(wheel: Path) -> None:
    sources = _lua_sources()
    assert sources, "lua/ has no scripts at all"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        missing = [s for s in sources if f"memtier/_lua/{s}" not in names]
        assert missing == []
        # byte for byte the checkout's files
        for source in sources:
            assert zf.read(f"memtier/_lua/{source}") == (LUA / source).read_bytes(), source


def test_wheel_contains_py_typed(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        assert "memtier/py.typed" in zf.namelist()


def _module_sources() -> list[str]:
    package = REPO / "memtier"
    return sorted(
        p.relative_to(REPO).as_posix()
        for p in package.rglob("*.py")
        if "__pycache__" not in p.parts and "_lua" not in p.relative_to(package).parts
    )


def test_wheel_contains_every_python_module(wheel: Path) -> None:
    """Subpackages (memtier/redaction/, memtier/threads/...) ship whole, byte for byte."""
    sources = _module_sources()
    assert "memtier/redaction/__init__.py" in sources and "memtier/redaction/patterns.py" in sources
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert [s for s in sources if s not in names] == []
        for source in sources:
            assert zf.read(source) == (REPO / source).read_bytes(), source


def test_installed_wheel_imports_the_redaction_package(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    probe = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(site)!r})
        import memtier.redaction as r
        print(json.dumps({{
            "module": r.__file__,
            "all": sorted(r.__all__),
            "redacted": r.redact("token ghp_" + "Z9" * 18).text,
            "scrubbed": r.scrub_paths("see /home/alice/x"),
        }}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, cwd=tmp_path, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr.decode("utf-8", "replace")
    report = json.loads(done.stdout)
    assert report["module"] == str(site / "memtier" / "redaction" / "__init__.py")
    import memtier.redaction

    assert report["all"] == sorted(memtier.redaction.__all__)
    assert report["redacted"] == "token [REDACTED:github_token]"
    assert report["scrubbed"] == "see [PATH]"


def test_wheel_declares_the_console_script(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        entry_points = next(n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt"))
        assert "memtier = memtier.cli:main" in zf.read(entry_points).decode()


def test_installed_wheel_loads_its_packaged_scripts(wheel: Path, tmp_path: Path) -> None:
    """Imported from the unpacked wheel, memtier reads ``memtier/_lua``, not the checkout."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    probe = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(site)!r})
        import memtier.scripts as s
        root = s.lua_root()
        folders = sorted(
            p.name for p in root.iterdir()
            if p.is_dir() and p.name != "includes" and any(p.glob("*.lua"))
        )
        loaded = {{f: s.load_registry(f).names() for f in folders}}
        print(json.dumps({{"module": s.__file__, "root": str(root), "loaded": loaded}}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, cwd=tmp_path, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr.decode("utf-8", "replace")
    report = json.loads(done.stdout)
    assert report["module"] == str(site / "memtier" / "scripts.py")
    assert report["root"] == str(site / "memtier" / "_lua")
    expected = {}
    for folder in sorted(p for p in LUA.iterdir() if p.is_dir() and p.name != "includes"):
        names = sorted(p.name.rsplit("-", 1)[0] for p in folder.glob("*.lua"))
        if names:
            expected[folder.name] = names
    assert report["loaded"] == expected


def _metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return zf.read(name).decode("utf-8")


def test_wheel_ships_the_apache_license_pyproject_declares(wheel: Path) -> None:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    license_text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    with zipfile.ZipFile(wheel) as zf:
        shipped = [n for n in zf.namelist() if n.endswith("LICENSE") and ".dist-info/" in n]
        assert shipped, zf.namelist()
        assert zf.read(shipped[0]).decode("utf-8") == license_text
    metadata = _metadata(wheel)
    assert "License: Apache-2.0" in metadata or "License-Expression: Apache-2.0" in metadata
    assert "Classifier: License :: OSI Approved :: Apache Software License" in metadata
    assert "Classifier: Typing :: Typed" in metadata


def test_httpx_is_a_test_dependency_only(wheel: Path) -> None:
    requires = [
        line.removeprefix("Requires-Dist: ")
        for line in _metadata(wheel).splitlines()
        if line.startswith("Requires-Dist: ")
    ]
    httpx = [r for r in requires if r.startswith("httpx")]
    assert httpx and all("extra == 'test'" in r or 'extra == "test"' in r for r in httpx), httpx


def test_changelog_has_an_unreleased_section() -> None:
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog") and "## [Unreleased]" in text
