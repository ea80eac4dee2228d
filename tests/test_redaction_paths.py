"""Local-path scrubbing (memtier.redaction.paths): pure unit tests, no Redis.

The promise: after :func:`scrub_paths`, no absolute local path under one of the listed roots
is left where a path can start (the start of the text, or after a character that cannot be
part of a word, a relative path or a URL host, i.e. not one of ``[\\w./~-]``), and no ``~/``
path, drive path or ``file://`` URL either.  An adversary plants such paths among arbitrary
text and checks the result with an oracle written as plain code, not with the scrubber's
regex.  The examples are the scrubbing cases of the threads service tests (tests/threads),
run on the helpers directly.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from memtier.errors import ErrorCode, ValidationError
from memtier.redaction import (
    PATH_PLACEHOLDER,
    SecretKind,
    placeholder,
    scrub_json_paths,
    scrub_paths,
    served_json,
    served_text,
)

# The roots the scrubber documents (memtier/redaction/paths.py): where users' files live.
ROOTS = (
    "home", "Users", "root", "tmp", "var", "etc", "opt", "srv", "mnt", "media", "private",
    "usr", "Library", "Volumes", "proc", "run", "workspace", "work", "data", "app",
)  # fmt: skip
# A path may start only after a character that is not one of these (nor a word character):
# they continue a word, a relative path (a/home, ./tmp) or a URL host (http://app/x).
CONTINUES_A_WORD = "./~-"
URL_ENDS = tuple(" \t\n\r\x0b\x0c\"'<>")  # what ends a file:// URL
TOKEN = "ghp_" + "Z9" * 18  # a fake GitHub token (assembled, never a real credential)


def _may_start_path(text: str, at: int) -> bool:
    if at == 0:
        return True
    before = text[at - 1]
    return not (before.isalnum() or before == "_" or before in CONTINUES_A_WORD)


def local_paths_left(text: str) -> list[str]:
    """Every place in ``text`` where an absolute local path still starts (the oracle)."""
    found: list[str] = []
    for at in range(len(text)):
        if text.startswith("file://", at) and text[at + 7 : at + 8] not in ("", *URL_ENDS):
            found.append(text[at : at + 40])
        if not _may_start_path(text, at):
            continue
        rest = text[at:]
        drive = len(rest) >= 3 and rest[0].isascii() and rest[0].isalpha() and rest[1:3] == ":\\"
        if drive or rest.startswith("~/") or any(rest.startswith(f"/{r}") for r in ROOTS):
            found.append(rest[:40])
    return found


# --- examples from the threads service tests --------------------------------------------------


THREADS_EXAMPLES = [
    # test_ledger_messages_carry_no_local_paths
    (
        "please read /home/alice/notes.txt and C:\\Users\\alice\\plan.docx",
        f"please read {PATH_PLACEHOLDER} and {PATH_PLACEHOLDER}",
    ),
    # test_runner_failure_records_error_and_allows_retry
    ("boom /home/alice/secret.txt", f"boom {PATH_PLACEHOLDER}"),
    # test_runner_events_with_paths_stay_scrubbed / test_continue_redacts_... (the cwd)
    ("/home/alice/a.txt", PATH_PLACEHOLDER),
    ("/home/alice/project", PATH_PLACEHOLDER),
    # the other forms the scrubber documents
    ("open ~/notes/today.md now", f"open {PATH_PLACEHOLDER} now"),
    ("see file:///etc/passwd.", f"see {PATH_PLACEHOLDER}"),
    ('{"cwd": "/Users/bob/src"}', f'{{"cwd": "{PATH_PLACEHOLDER}"}}'),
    ("logs in /var/log/app.log|tail", f"logs in {PATH_PLACEHOLDER}|tail"),
    ("just /tmp", f"just {PATH_PLACEHOLDER}"),
]


@pytest.mark.parametrize(("text", "scrubbed"), THREADS_EXAMPLES)
def test_scrub_paths_examples(text: str, scrubbed: str) -> None:
    out = scrub_paths(text)
    assert out == scrubbed
    assert "/home/alice" not in out and "Users" not in out
    assert local_paths_left(out) == []


FIXED_LEAKS = [
    ("/workspaces/alice/project/.env", PATH_PLACEHOLDER),
    ("/datasets/alice/x.csv", PATH_PLACEHOLDER),
    ("cat /etcd/conf", f"cat {PATH_PLACEHOLDER}"),
    ("PATH=/usr/bin:/home/alice/bin", f"PATH={PATH_PLACEHOLDER}:{PATH_PLACEHOLDER}"),
    ("scp a host:/home/alice/x", f"scp a host:{PATH_PLACEHOLDER}"),
    ("C:/Users/alice/x", f"C:{PATH_PLACEHOLDER}"),
    ("cwd:/home/alice", f"cwd:{PATH_PLACEHOLDER}"),
]


@pytest.mark.parametrize(("text", "scrubbed"), FIXED_LEAKS)
def test_paths_the_threads_copy_leaked_are_scrubbed_whole(text: str, scrubbed: str) -> None:
    assert scrub_paths(text) == scrubbed
    assert "alice" not in scrub_paths(text)


NOT_LOCAL_PATHS = [
    "src/memtier/redaction/paths.py",  # relative
    "./home/x and ../tmp/y",  # relative
    "https://example.com/home/alice",  # a URL's path
    "and/or 1/2 a/b",
    "user~/x",
    "http://app/x and https://data:8080/home",  # URL hosts named like a root
    "",
]


@pytest.mark.parametrize("text", NOT_LOCAL_PATHS)
def test_text_without_local_paths_is_unchanged(text: str) -> None:
    assert scrub_paths(text) == text


def test_served_json_scrubs_paths_and_redacts_secrets() -> None:
    """test_continue_redacts_messages_events_and_replies, on the helper: the runner event."""
    event = {
        "tool": "shell",
        "cwd": "/home/alice/project",
        "arguments": {"cmd": f"cat /home/alice/.env # {TOKEN}"},
        "apiKey": "hunter2hunter2",
        "/home/alice/key": ["~/x", 3, None, True],
    }
    served = served_json(event, scrub=True)
    assert served == {
        "tool": "shell",
        "cwd": PATH_PLACEHOLDER,
        "arguments": {"cmd": f"cat {PATH_PLACEHOLDER} # {placeholder(SecretKind.GITHUB_TOKEN)}"},
        "apiKey": placeholder(SecretKind.SECRET_ASSIGNMENT),
        PATH_PLACEHOLDER: [PATH_PLACEHOLDER, 3, None, True],
    }
    # without scrub: secrets still go, paths stay (stored metadata served as it is)
    kept = served_json(event, scrub=False)
    assert kept["cwd"] == "/home/alice/project"
    assert kept["apiKey"] == placeholder(SecretKind.SECRET_ASSIGNMENT)
    assert TOKEN not in repr(kept)


def test_served_text() -> None:
    text = f"token {TOKEN} in /home/alice/x"
    assert served_text(text, scrub=True) == (
        f"token {placeholder(SecretKind.GITHUB_TOKEN)} in {PATH_PLACEHOLDER}"
    )
    assert served_text(text, scrub=False) == (
        f"token {placeholder(SecretKind.GITHUB_TOKEN)} in /home/alice/x"
    )


def test_scrub_json_paths_bounds_nesting() -> None:
    node: object = "/home/alice"
    for _ in range(33):
        node = [node]
    assert scrub_json_paths([[["/tmp/a"]]]) == [[[PATH_PLACEHOLDER]]]
    with pytest.raises(ValidationError) as raised:
        scrub_json_paths(node)
    assert raised.value.code == ErrorCode.INVALID_INPUT
    with pytest.raises(ValidationError):
        served_json(node, scrub=True)


# --- the adversary: planted paths among arbitrary text ----------------------------------------

PATH_CHARS = st.text(
    st.sampled_from(list("abcXYZ019_-.é日+=,;()[]{}@#$%&!")) | st.just("/"), max_size=30
)
# A root, maybe continued by more letters (/workspaces, /datasets: still a local path).
POSIX_PATHS = st.builds(
    lambda root, more, tail: f"/{root}{more}" + (f"/{tail}" if tail is not None else ""),
    st.sampled_from(ROOTS),
    st.sampled_from(["", "", "s", "sets", "d", "work"]),
    st.none() | PATH_CHARS,
)
OTHER_PATHS = st.builds(lambda tail: f"~/{tail}", PATH_CHARS) | st.builds(
    lambda drive, tail: f"{drive}:\\{tail}",
    st.sampled_from(list("CDcz")),
    st.text(st.sampled_from(list("abc\\019 ._-")), max_size=20).map(lambda t: t.strip()),
)
FILE_URLS = st.builds(lambda path: f"file://{path}", POSIX_PATHS | st.just("host/share/x"))
PLANTED = POSIX_PATHS | OTHER_PATHS | FILE_URLS
# What may stand before a planted path: a character after which a path can start.
OPENERS = st.sampled_from(
    ["", " ", "\n", "\t", "(", '"', "'", "=", ",", "[", "|", "<", ">", "`", ":"]
)
# Arbitrary text around the paths, with the characters that make paths and near-misses.
NOISE = st.text(st.sampled_from(list("ab Z9_/.:~\\-\"'|<>\n[]é")), max_size=30)
SEGMENTS = st.lists(
    st.tuples(NOISE, OPENERS, PLANTED).map(lambda t: (t[0] + t[1], t[2])), min_size=1, max_size=5
)


@settings(max_examples=400, deadline=None)
@given(SEGMENTS, NOISE)
@example([("", "/home")], "")
@example([("x ", "~/a")], ":b")
@example([("", "C:\\Users\\alice")], "")
@example([("", "file:///home/a")], "")
# Leaks of the copy in memtier/threads/core.py, found by this test: the root matched without
# the rest of its name ("[PATH]a:\\" then held a drive path; "/workspaces/alice" became
# "[PATH]s/alice"), and no path was scrubbed after ":" (PATH=/usr/bin:/home/alice/bin).
@example([("", "/home")], "a:\\")
@example([("", "/workspaces/alice/.env")], "")
@example([("PATH=", "/usr/bin"), (":", "/home/alice/bin")], "")
def test_no_local_path_survives_scrubbing(segments: list[tuple[str, str]], tail: str) -> None:
    text = ""
    planted_at_a_start: list[str] = []
    for noise, path in segments:
        text += noise
        if _may_start_path(text, len(text)):
            planted_at_a_start.append(path)
        text += path
    text += tail
    out = scrub_paths(text)
    assert local_paths_left(out) == []
    assert scrub_paths(out) == out  # idempotent: the placeholder is no path
    if planted_at_a_start:  # the oracle is not vacuous: it sees what was planted
        assert local_paths_left(text) != []
        assert PATH_PLACEHOLDER in out


@settings(max_examples=300, deadline=None)
@given(NOISE)
def test_arbitrary_text_keeps_no_local_path(text: str) -> None:
    out = scrub_paths(text)
    assert local_paths_left(out) == []
    assert scrub_paths(out) == out


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(exclude_characters="/~\\:"), max_size=60))
def test_text_that_cannot_hold_a_path_is_unchanged(text: str) -> None:
    assert scrub_paths(text) == text
