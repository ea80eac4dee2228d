"""Every result file the performance docs cite is in the repository (issue 12).

docs/performance.md backs its figures with the probes' JSON under ``bench/results/``.
That directory ignores everything it does not admit by name (its ``.gitignore``), so a
probe's output can be cited, stay on the machine that wrote it, and never be committed:
the figure then has nothing behind it.  This reads every ``bench/results/...`` path the
docs and the README name -- brace alternatives (``{before,after}``, ``{1,2,3}``) and
``<placeholders>`` / ``*`` globs expanded -- and checks that each names a file git tracks.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
CITING = ("docs/performance.md", "README.md")
_CITATION = re.compile(r"bench/results/[A-Za-z0-9_.{}<>*,\-]+")


def expand(pattern: str) -> list[str]:
    """``pattern`` with its first ``{a,b,...}`` expanded, recursively (bounded by its
    length: each step removes one pair of braces)."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [re.sub(r"<[^<>]*>", "*", pattern)]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [p for alt in match.group(1).split(",") for p in expand(head + alt + tail)]


def citations(text: str) -> list[str]:
    """The ``bench/results/`` paths ``text`` names, trailing punctuation dropped; a bare
    directory mention (``bench/results/``) is not a citation."""
    found = (m.group(0).rstrip(".,-") for m in _CITATION.finditer(text))
    return [c for c in found if c != "bench/results/" and not c.endswith("/")]


@given(st.lists(st.sampled_from(["a", "b", "1", "22"]), min_size=1, max_size=3), st.integers(0, 2))
@example(["before", "after"], 1)
def test_expand_gives_every_alternative(alts: list[str], n_groups: int) -> None:
    group = "{" + ",".join(alts) + "}"
    pattern = "x" + "-".join([group] * n_groups) + ".json"
    got = expand(pattern)
    assert len(got) == len(alts) ** n_groups
    for path in got:
        assert "{" not in path and "}" not in path and path.startswith("x")


def test_citations_are_read_from_text() -> None:
    text = (
        "(`bench/results/a-{x,y}.json`; see bench/results/, and "
        "`bench/results/latest-<size>.json`, bench/results/b.json.)"
    )
    assert citations(text) == [
        "bench/results/a-{x,y}.json",
        "bench/results/latest-<size>.json",
        "bench/results/b.json",
    ]
    assert expand("bench/results/latest-<size>.json") == ["bench/results/latest-*.json"]


def test_every_cited_result_file_is_tracked() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.fail("needs the git checkout: the check is against what git tracks")
    tracked = subprocess.run(
        ["git", "ls-files", "--", "bench/results"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert tracked, "git tracks no bench/results files: wrong checkout?"
    cited = {c for name in CITING for c in citations((ROOT / name).read_text(encoding="utf-8"))}
    assert len(cited) > 20  # the docs cite dozens: fewer means the pattern broke
    missing = sorted(
        (citation, path)
        for citation in cited
        for path in expand(citation)
        if not fnmatch.filter(tracked, path)
    )
    assert not missing, f"cited but not in the repository: {missing}"
