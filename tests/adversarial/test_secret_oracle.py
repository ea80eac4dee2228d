"""Secret corpus oracle: no planted secret survives anywhere memtier stores data.

Realistic fake secrets for every detector (``secretgen.py``), inside prose, code, JSON, URLs and
Markdown, before and after each other (truncated keys included), go through the real store API
as avatar, agent, tool and action turns.  Then, after append, after compaction, after flush and
after a restore into an emptied Redis, the oracle reads EVERY value under the namespace (SCAN,
then a read by type: strings, hashes, lists, sets, sorted sets, streams) and every byte of every
file under the snapshot directory, and looks for every secret's cores, unescaped as often as
needed (JSON inside JSON).  It never asks memtier's own ``contains_secret``.

The harmless look-alikes planted next to them (``${VAR}`` placeholders, git SHAs and digests,
UUIDs, ordinary words) must be stored verbatim, which also proves the scan sees the content.

``detect-secrets`` (test-only dependency) cross-checks what memtier stored: its scanner must
report nothing.  Its two entropy plugins are off: they flag random identifiers (turn ids,
session ids, the SHAs and UUIDs the README promises to keep), not secrets.
"""

from __future__ import annotations

import itertools
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import secretgen
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from secretgen import MAKERS, LookAlike, Planted, TurnText, pinned, turn_texts, windows

from memtier import (
    ActionResult,
    AgentResponse,
    AvatarMessage,
    ConversationKey,
    ConversationStore,
    ToolSummary,
)
from memtier.config import MemtierConfig
from memtier.memory.compaction import CompactionStatus
from memtier.memory.persistence import snapshot_dir_for
from memtier.redaction import SecretKind, redact, sanitize

K = SecretKind
REPO = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000_000
MAX_KEYS = 10_000  # bound of one namespace scan (a few dozen keys are expected)
MAX_STREAM_ENTRIES = 10_000
_namespaces = itertools.count()


# --- the oracle --------------------------------------------------------------------------------

_ESCAPE_RE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.DOTALL)
_SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f"}


def _unescape_once(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        esc = m.group(1)
        if len(esc) == 5:
            return chr(int(esc[1:], 16))
        return _SIMPLE_ESCAPES.get(esc, esc)

    return _ESCAPE_RE.sub(one, text)


def views(raw: bytes | str) -> list[str]:
    """A stored value as text, and unescaped again and again (JSON in JSON in a record)."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    out = [text]
    for _ in range(4):
        again = _unescape_once(out[-1])
        if again == out[-1]:
            break
        out.append(again)
    return out


class Stored:
    """Everything memtier stored at one point: Redis values and snapshot file bytes."""

    def __init__(self, where: str, values: dict[str, list[bytes]]) -> None:
        self.where = where
        self.values = values
        self.haystack = "\x00".join(v for raws in values.values() for r in raws for v in views(r))

    def leaks(self, planted: Iterable[Planted]) -> list[str]:
        found = []
        for secret in planted:
            for core in secret.cores:
                for piece in windows(core):
                    if piece in self.haystack:
                        found.append(f"{secret.kind.value}: {piece!r} of {core!r}")
                        break
        return found

    def missing(self, lookalikes: Iterable[LookAlike]) -> list[str]:
        return [f"{x.name}: {x.text!r}" for x in lookalikes if x.text not in self.haystack]

    def lines(self) -> list[str]:
        out: list[str] = []
        for raws in self.values.values():
            for raw in raws:
                for view in views(raw):
                    out.extend(view.splitlines())
        return out


def _b(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def redis_values(client: Any, namespace: str) -> dict[str, list[bytes]]:
    """Every key containing the namespace, read by its type (key names included)."""
    out: dict[str, list[bytes]] = {}
    for n, name in enumerate(client.scan_iter(match=f"*{namespace}*", count=500)):
        assert n < MAX_KEYS, f"more than {MAX_KEYS} keys under {namespace}"
        kind = _b(client.type(name)).decode()
        items: list[bytes] = [_b(name)]
        if kind == "string":
            items.append(_b(client.get(name) or b""))
        elif kind == "hash":
            for field, value in client.hgetall(name).items():
                items += [_b(field), _b(value)]
        elif kind == "list":
            items += [_b(x) for x in client.lrange(name, 0, -1)]
        elif kind == "set":
            items += [_b(x) for x in client.smembers(name)]
        elif kind == "zset":
            items += [_b(m) for m, _ in client.zrange(name, 0, -1, withscores=True)]
        elif kind == "stream":
            for entry_id, fields in client.xrange(name, count=MAX_STREAM_ENTRIES):
                items.append(_b(entry_id))
                for field, value in fields.items():
                    items += [_b(field), _b(value)]
        elif kind != "none":  # vanished between SCAN and TYPE
            raise AssertionError(f"unexpected Redis type {kind} for {name!r}")
        out[_b(name).decode()] = items
    return out


def file_values(root: Path) -> dict[str, list[bytes]]:
    """Every byte of every file under ``root`` (generations, temporaries, quarantine)."""
    out: dict[str, list[bytes]] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            out[str(path)] = [path.name.encode(), path.read_bytes()]
    return out


def detect_secrets_findings(
    stored: Iterable[Stored], tmp: Path, lookalikes: Iterable[LookAlike] = ()
) -> list[str]:
    """Run detect-secrets' file scanner over what was stored; its findings, if any.

    A finding whose value is part of a planted look-alike is detect-secrets flagging a
    documented non-secret that memtier must keep (``client_secret: null`` read as YAML): it
    is not a finding about memtier.  Its keyword value runs to the end of the line, so a
    look-alike followed by more text on its line (``client_secret: null with region: ...``)
    is excused when the value's first word is the look-alike's and the look-alike itself
    is on that line; the rest of the line is the planted text around it, which the
    oracle's own scan covers.
    """
    kept = [x.text for x in lookalikes]
    from detect_secrets.core.scan import scan_file
    from detect_secrets.settings import default_settings

    lines = sorted({line for one in stored for line in one.lines()})
    found: list[str] = []
    with default_settings() as config:
        config.disable_plugins("Base64HighEntropyString", "HexHighEntropyString")
        for ext in ("txt", "yaml"):  # the keyword plugin reads YAML's "name: value" too
            path = tmp / f"memtier-stored.{ext}"
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            for secret in scan_file(str(path)):
                # its value as the look-alike reads in the text (a keyword value runs to the
                # end of the line, and an escaped line break is no line break to it)
                lines_of_value = views(secret.secret_value or "")[-1].splitlines() or [""]
                value = lines_of_value[0].strip("\\\"' ")
                line = lines[secret.line_number - 1]
                first_word = value.split(maxsplit=1)[0] if value else ""
                if value and any(
                    value in text or (first_word in text and text in line) for text in kept
                ):
                    continue
                found.append(f"{secret.type} {value!r}: {line[:160]!r}")
            path.unlink()
    return found


# --- planting through the store API ------------------------------------------------------------

TOOLS = ("web_search", "deploy", "read_file")
ACTIONS = ("teleport", "give_item")


def turn_of(kind: int, text: str, n: int) -> Any:
    if kind == 0:
        return AvatarMessage(text=text, turn_id=f"t{n}")
    if kind == 1:
        return AgentResponse(text=text, turn_id=f"t{n}")
    if kind == 2:
        return ToolSummary(tool=TOOLS[n % len(TOOLS)], summary=text, turn_id=f"t{n}")
    return ActionResult(action=ACTIONS[n % len(ACTIONS)], outcome=text, turn_id=f"t{n}")


class Oracle:
    """One store on one backend with its own namespace and snapshot directory."""

    def __init__(self, backend: Any, client: Any, root: Path) -> None:
        self.backend = backend
        self.client = client
        self.root = root
        self.namespace = f"{backend.namespace}o{next(_namespaces):06d}"
        conversation = {
            "persistence_enabled": True,
            "storage_path": str(root),
            # the smallest bound: a forced compaction keeps 2 turns and folds the rest
            "max_turns_per_session": 4,
        }
        self.config = MemtierConfig.load(
            redis_url=backend.url, namespace=self.namespace, conversation=conversation
        )
        self.store = self._store()
        self.planted: list[Planted] = []
        self.lookalikes: list[LookAlike] = []
        self.stages: list[Stored] = []

    def _store(self) -> ConversationStore:
        return ConversationStore(
            self.client,
            self.config,
            clock=lambda: T0,
            snapshots=snapshot_dir_for(self.config),
            inline_compaction=False,
        )

    def plant(self, sessions: list[list[tuple[int, TurnText]]]) -> dict[ConversationKey, int]:
        keys: dict[ConversationKey, int] = {}
        n = 0
        for member, turns in enumerate(sessions):
            channel = "im" if member % 2 else "public"
            key = ConversationKey(f"00000000-0000-4000-8000-{member:012d}", channel)
            made = [turn_of(kind, turn.text, n + i) for i, (kind, turn) in enumerate(turns)]
            # every other session in one append_many: its redaction is append's
            if member % 2:
                receipts = self.store.append_many(key, made)
            else:
                receipts = [self.store.append(key, one) for one in made]
            assert len(receipts) == len(turns)
            for receipt, (_, turn) in zip(receipts, turns, strict=True):
                assert not receipt.truncated, "the generator must stay inside the turn bounds"
                self.planted += turn.planted
                self.lookalikes += turn.lookalikes
            n += len(turns)
            keys[key] = len(turns)
        return keys

    def wipe(self) -> None:
        names = list(self.client.scan_iter(match=f"*{self.namespace}*", count=500))
        assert len(names) < MAX_KEYS
        for name in names:
            self.client.delete(name)

    def check(self, where: str, values: dict[str, list[bytes]], *, survive: bool) -> None:
        stored = Stored(where, values)
        assert values, f"{where}: nothing stored at all"
        leaks = stored.leaks(self.planted)
        assert not leaks, f"{where}: secrets stored in clear: {leaks}"
        if survive:
            missing = stored.missing(self.lookalikes)
            assert not missing, f"{where}: look-alikes were changed or lost: {missing}"
        self.stages.append(stored)

    def check_redis(self, where: str, *, survive: bool) -> None:
        self.check(where, redis_values(self.client, self.namespace), survive=survive)

    def check_files(self, where: str, *, survive: bool) -> None:
        self.check(where, file_values(self.root), survive=survive)

    def run(self, sessions: list[list[tuple[int, TurnText]]]) -> None:
        keys = self.plant(sessions)
        self.check_redis("after-append", survive=True)
        first = self.store.flush()
        assert first.sessions == len(keys) and not first.skipped, first
        self.check_files("after-flush", survive=True)
        self.wipe()
        report = self._store().recover()
        assert report.outcome == "restored" and report.restored == len(keys), report
        self.check_redis("after-restore", survive=True)
        for key, count in keys.items():
            outcome = self.store.compact(key, force=True)
            if count > 2:  # the oldest turns went into a summary
                assert outcome.status is CompactionStatus.APPLIED and outcome.folded, outcome
                # a summary is stored; its text may be empty: its budget is at most the
                # bytes it replaces, and the counts of a few short turns can take it all
                # (docs/workers.md, "What is folded")
                assert self.store.context(key).summary is not None
        self.check_redis("after-compaction", survive=False)
        self.store.flush()
        self.check_files("after-second-flush", survive=False)
        self.wipe()
        report = self._store().recover()
        assert report.outcome == "restored", report
        self.check_redis("after-second-restore", survive=False)
        self.wipe()

    def cross_check(self, scratch: Path) -> None:
        found = detect_secrets_findings(self.stages, scratch, self.lookalikes)
        assert not found, f"detect-secrets found {found}"


# --- tests -------------------------------------------------------------------------------------

# Leaks the oracle found, pinned (each is also a unit test in tests/test_redaction_findings.py).
UUID_LOOKALIKE = LookAlike("uuid", "request id 1d2c3b4a-5e6f-4a0b-9c8d-7e6f5a4b3c2d")
PLACEHOLDER_NULL = LookAlike("placeholder", "client_secret: null")
PINNED = {
    # "password": "..." inside a Python string: escaped quotes around name and value
    "escaped_json_assignment": pinned((K.SECRET_ASSIGNMENT, 1, 46, "python")),
    # export password="a b" inside a string: an escaped quoted value with a space
    "escaped_quoted_value": pinned((K.SECRET_ASSIGNMENT, 1, 115, "json")),
    # a whole key quoted in Markdown ("> " on every line)
    "quoted_key": pinned((K.PRIVATE_KEY, 3, 0, "md_quote")),
    # a truncated PGP key quoted, with its armor header and the "> " blank line
    "quoted_truncated_pgp_key": pinned((K.PRIVATE_KEY, 1, 55, "md_quote"), "\n\nbye"),
    # a Digest header in a JSON string swallowed the rest of the line
    "digest_in_json_then_more": pinned(
        (K.AUTHORIZATION_HEADER, 2, 1, "json"),
        (K.AUTHORIZATION_HEADER, 4, 4, "json"),
        UUID_LOOKALIKE,
    ),
    # "Authorization": "ApiKey ..." JSON-escaped inside a JSON string
    "escaped_json_header": pinned((K.AUTHORIZATION_HEADER, 5, 5, "python")),
    # a Discord bot token of a 17-digit user id (23 base64 characters)
    "discord_17_digits": pinned((K.DISCORD_BOT_TOKEN, 1, 0, "md_quote"), UUID_LOOKALIKE),
}


# Sessions (at most 4 turns each: the turn bound), each turn of one of the four kinds.
session_plans = st.lists(
    st.lists(st.tuples(st.integers(0, 3), turn_texts()), min_size=1, max_size=4),
    min_size=1,
    max_size=2,
)


def _oracle_backends() -> list[Any]:
    return [
        pytest.param("fake", marks=pytest.mark.fake),
        pytest.param("real", marks=pytest.mark.real),
    ]


# The `backend` fixture's fake and real standalone halves (the cluster adds nothing here:
# redaction runs in the client, before any key is chosen).
@pytest.mark.parametrize("backend", _oracle_backends(), indirect=True)
@settings(
    max_examples=25,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sessions=session_plans)
@example(
    sessions=[
        [
            (0, PINNED["escaped_json_assignment"]),
            (2, PINNED["quoted_truncated_pgp_key"]),
            (3, PINNED["digest_in_json_then_more"]),
        ],
        [(1, PINNED["discord_17_digits"]), (2, PINNED["escaped_json_header"])],
    ]
)
# Found when a new module changed the derandomised examples (Hypothesis draws constants
# from the loaded code): four short turns whose summary's counts take its whole budget
# (the summary text is empty by design), and a look-alike with more text after it on its
# line (detect-secrets reads the keyword's value to the end of the line).
@example(
    sessions=[
        [
            (0, pinned("with region")),
            (0, pinned("here ünïcode is")),
            (2, pinned("日本語 asked ünïcode meeting what")),
            (0, pinned("teleport 日本語 what")),
        ]
    ]
)
@example(
    sessions=[
        [
            (0, pinned("with region")),
            (2, pinned("here ünïcode is")),
            (0, pinned(PLACEHOLDER_NULL, "with region:", (K.PRIVATE_KEY, 1, 0, "prose"))),
        ]
    ]
)
def test_no_planted_secret_is_stored_anywhere(backend: Any, sessions: Any) -> None:
    oracle_backend = backend
    client = oracle_backend.sync_client()
    with tempfile.TemporaryDirectory(prefix="memtier-oracle-") as tmp:
        oracle = Oracle(oracle_backend, client, Path(tmp) / "data")
        try:
            oracle.run(sessions)
            oracle.cross_check(Path(tmp))
        finally:
            oracle.wipe()


@settings(max_examples=400)
@given(turn=turn_texts(max_segments=5))
@example(turn=PINNED["escaped_json_assignment"])
@example(turn=PINNED["escaped_quoted_value"])
@example(turn=PINNED["quoted_key"])
@example(turn=PINNED["quoted_truncated_pgp_key"])
@example(turn=PINNED["digest_in_json_then_more"])
@example(turn=PINNED["escaped_json_header"])
@example(turn=PINNED["discord_17_digits"])
def test_sanitized_text_holds_no_planted_secret(turn: TurnText) -> None:
    """The same oracle on the sanitizer alone: many more examples, no Redis."""
    stored = Stored("sanitize", {"text": [sanitize(turn.text, 64 * 1024).text.encode()]})
    assert not stored.leaks(turn.planted), turn.text
    assert not stored.missing(turn.lookalikes), turn.text


@pytest.mark.parametrize("kind", list(SecretKind), ids=[k.value for k in SecretKind])
@settings(max_examples=25)
@given(data=st.data())
def test_each_kind_in_every_context_is_sanitized_away(kind: SecretKind, data: Any) -> None:
    """Per kind, so that every spelling of every detector meets every context."""
    turn = data.draw(turn_texts(max_segments=3, kinds=(kind,)))
    clean = sanitize(turn.text, 64 * 1024).text
    stored = Stored("sanitize", {"text": [clean.encode()]})
    assert not stored.leaks(turn.planted), turn.text
    assert not stored.missing(turn.lookalikes), turn.text
    assert redact(clean).text == clean  # and a second pass changes nothing (idempotent)


def test_every_detector_and_readme_kind_has_a_maker() -> None:
    assert set(MAKERS) == set(SecretKind)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Redaction and text bounding", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", section, re.MULTILINE))
    assert documented == {kind.value for kind in SecretKind}
    assert documented <= {kind.value for kind in MAKERS}


@pytest.mark.parametrize("kind", list(SecretKind), ids=[k.value for k in SecretKind])
def test_every_maker_plants_its_cores_and_each_is_found_in_clear(kind: SecretKind) -> None:
    """The oracle is not vacuous: each maker's cores are in its text, and the scan finds them."""

    for variant in range(40):
        planted = MAKERS[kind](secretgen.secret_random(kind.value, variant), variant)
        assert planted.kind is kind and planted.cores
        raw = Stored("raw", {"raw": [planted.text.encode()]})
        assert raw.leaks([planted]), planted
        assert sanitize(planted.text, 64 * 1024).kinds, planted.text  # memtier sees it too


def test_detect_secrets_sees_raw_secrets(tmp_path: Path) -> None:
    """The cross-check is not vacuous: detect-secrets reports the secrets it knows, in clear."""
    import random

    rng = random.Random(7)
    known = [
        secretgen.private_key(rng, 0),
        secretgen.github_token(rng, 0),
        secretgen.aws_access_key(rng, 0),
        secretgen.slack_webhook(rng, 0),
        secretgen.stripe_key(rng, 0),
        secretgen.jwt(rng, 0),
        secretgen.secret_assignment(rng, 1),
    ]
    for planted in known:
        stored = Stored("raw", {"raw": [planted.text.encode()]})
        assert detect_secrets_findings([stored], tmp_path), planted.text


def test_the_store_oracle_reports_a_store_that_does_not_redact(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The store oracle is not vacuous: with redaction switched off, it reports the leak."""
    import fakeredis

    from memtier.memory import core
    from memtier.redaction import SanitizedText, bound_utf8

    def bound_only(text: str, max_bytes: int) -> SanitizedText:
        out, cut = bound_utf8(text, max_bytes)
        return SanitizedText(out, len(out.encode()), (), cut)

    monkeypatch.setattr(core, "sanitize", bound_only)

    class FakeBackend:
        namespace = "vacuity"
        url = None

    oracle = Oracle(FakeBackend(), fakeredis.FakeRedis(), tmp_path / "data")
    turn = pinned((K.GITHUB_TOKEN, 1, 0, "prose"), UUID_LOOKALIKE)
    leak = r"after-append: secrets stored in clear: \[.github_token"
    with pytest.raises(AssertionError, match=leak):
        oracle.run([[(0, turn)]])
