"""The CLI's shape, its errors and the configuration precedence.

* Precedence (a model, generated): for each field, every source either sets it or
  not; the value seen is the highest source's: arguments > ``MEMTIER_*`` > TOML file
  > default.  Both through :meth:`MemtierConfig.from_toml` and through the CLI.
* One CLI shape: every subcommand takes ``--config``, ``--redis-url``, ``--namespace``,
  ``-v``/``-q`` and ``--log-format``.
* Errors are one line naming what to fix, exit 2, no traceback -- in a real process.
* ``memtier demo`` on a real Redis: its own namespace, only its own events.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from servers import RedisServer

from memtier.cli import COMMANDS, main
from memtier.config import MemtierConfig

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("toml", "env", "arg")
# field -> (env variable, TOML line template, the value each source would give)
FIELDS: dict[str, dict[str, str]] = {
    "namespace": {"toml": "nsfile", "env": "nsenv", "arg": "nsarg"},
    "redis_url": {
        "toml": "redis://file.example:1/0",
        "env": "redis://env.example:2/0",
        "arg": "redis://arg.example:3/0",
    },
    "max_events": {"toml": "500", "env": "600", "arg": "700"},
    "max_turns_per_session": {"toml": "50", "env": "60", "arg": "70"},
}
ENV = {
    "namespace": "MEMTIER_NAMESPACE",
    "redis_url": "MEMTIER_REDIS_URL",
    "max_events": "MEMTIER_CONVERSATION__MAX_EVENTS",
    "max_turns_per_session": "MEMTIER_CONVERSATION__MAX_TURNS_PER_SESSION",
}
NESTED = {"max_events", "max_turns_per_session"}
DEFAULTS = {
    "namespace": "memtier",
    "redis_url": None,
    "max_events": MemtierConfig.model_fields["conversation"].default.max_events,
    "max_turns_per_session": (
        MemtierConfig.model_fields["conversation"].default.max_turns_per_session
    ),
}

# For each field, the set of sources that set it.
layouts = st.fixed_dictionaries({name: st.sets(st.sampled_from(SOURCES)) for name in FIELDS})


def _value(field: str, raw: str) -> Any:
    return int(raw) if field in NESTED else raw


def _expected(layout: dict[str, set[str]]) -> dict[str, Any]:
    out = {}
    for field, sources in layout.items():
        best = max(sources, key=SOURCES.index) if sources else None
        out[field] = _value(field, FIELDS[field][best]) if best else DEFAULTS[field]
    return out


def _seen(config: MemtierConfig) -> dict[str, Any]:
    return {
        "namespace": config.namespace,
        "redis_url": config.redis_url,
        "max_events": config.conversation.max_events,
        "max_turns_per_session": config.conversation.max_turns_per_session,
    }


def _toml(layout: dict[str, set[str]]) -> str:
    top, nested = [], []
    for field, sources in layout.items():
        if "toml" in sources:
            raw = FIELDS[field]["toml"]
            (nested if field in NESTED else top).append(
                f"{field} = {raw}" if field in NESTED else f'{field} = "{raw}"'
            )
    return "\n".join([*top, "[conversation]", *nested]) + "\n"


def _apply_env(monkeypatch: pytest.MonkeyPatch, layout: dict[str, set[str]]) -> None:
    for field, variable in ENV.items():
        if "env" in layout[field]:
            monkeypatch.setenv(variable, FIELDS[field]["env"])
        else:
            monkeypatch.delenv(variable, raising=False)


def _args(layout: dict[str, set[str]]) -> dict[str, Any]:
    top = {f: FIELDS[f]["arg"] for f in ("namespace", "redis_url") if "arg" in layout[f]}
    nested = {f: int(FIELDS[f]["arg"]) for f in NESTED if "arg" in layout[f]}
    return {**top, **({"conversation": nested} if nested else {})}


ALL = {name: set(SOURCES) for name in FIELDS}
NONE: dict[str, set[str]] = {name: set() for name in FIELDS}


@given(layout=layouts)
@example(layout=ALL)
@example(layout=NONE)
@example(layout={**NONE, "max_events": {"toml", "env"}, "namespace": {"toml"}})
def test_arguments_beat_environment_beat_the_file(
    layout: dict[str, set[str]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("cfg") / "memtier.toml"
    path.write_text(_toml(layout), encoding="utf-8")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _apply_env(monkeypatch, layout)
        config = MemtierConfig.from_toml(path, **_args(layout))
    assert _seen(config) == _expected(layout)


@given(layout=layouts)
@example(layout=ALL)
def test_cli_flags_beat_environment_beat_the_file(
    layout: dict[str, set[str]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The CLI's --namespace/--redis-url over MEMTIER_* over --config (memtier.clicommon)."""
    from memtier.clicommon import CliParser, add_common_arguments, load_config

    layout = {**layout, **{f: layout[f] - {"arg"} for f in NESTED}}  # no CLI flag for those
    path = tmp_path_factory.mktemp("cfg") / "memtier.toml"
    path.write_text(_toml(layout), encoding="utf-8")
    parser = CliParser(prog="memtier test")
    add_common_arguments(parser)
    argv = ["--config", str(path)]
    for field in ("namespace", "redis_url"):
        if "arg" in layout[field]:
            argv += [f"--{field.replace('_', '-')}", FIELDS[field]["arg"]]
    with pytest.MonkeyPatch.context() as monkeypatch:
        _apply_env(monkeypatch, layout)
        config = load_config(parser.parse_args(argv))
    assert _seen(config) == _expected(layout)


# ----------------------------------------------------------------------------- shape


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_takes_the_common_flags(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--config", "--redis-url", "--namespace", "-v", "-q", "--log-format"):
        assert f" {flag}" in text, f"memtier {command} --help lacks {flag}"


ERROR_CASES = [
    (command, case)
    for command in sorted(COMMANDS)
    for case in ("bad-url", "unknown-flag", "missing-config")
]


def _error_argv(command: str, case: str, tmp_path: Path) -> list[str]:
    extra = ["--insecure-dev-auth"] if command == "serve" else []
    if case == "bad-url":
        return [command, *extra, "--redis-url", "ftp://nowhere"]
    if case == "unknown-flag":
        return [command, *extra, "--no-such-flag"]
    return [command, *extra, "--config", str(tmp_path / "absent.toml")]


@pytest.mark.parametrize(("command", "case"), ERROR_CASES)
def test_errors_are_one_line_exit_2_without_traceback(
    command: str, case: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMTIER_")}
    done = subprocess.run(
        [sys.executable, "-m", "memtier", *_error_argv(command, case, tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"memtier {command}"), lines
    wanted = {"bad-url": "ftp", "unknown-flag": "--no-such-flag", "missing-config": "absent.toml"}
    assert wanted[case] in lines[0], lines


def test_unknown_command_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "frobnicate" in err[0] and "demo" in err[0]


# ----------------------------------------------------------------------------- demo


def _demo_events(out: str) -> list[str]:
    lines = out.splitlines()
    start = lines.index("events (reason codes, never content):") + 1
    return [line.split()[1] for line in lines[start:] if line.startswith("  ") and line.strip()]


@pytest.mark.parametrize("explicit", [True, False])
def test_demo_on_real_redis_shows_only_its_own_events(
    explicit: bool,
    redis_server: RedisServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without --namespace the demo uses ``memtier-demo``, not the app's default."""
    from memtier.demo import DEMO_NAMESPACE

    monkeypatch.delenv("MEMTIER_NAMESPACE", raising=False)
    namespace = "demo" + os.urandom(4).hex() if explicit else DEMO_NAMESPACE
    flags = ["--namespace", namespace] if explicit else []
    try:
        for _ in range(2):  # the second run's clean slate deletes the first run's sessions
            assert main(["demo", "--redis-url", redis_server.url, *flags]) == 0
            out = capsys.readouterr().out
            assert f"namespace {namespace!r}" in out
            assert sorted(_demo_events(out)) == ["operator_deleted", "operator_expired"], out
            assert "live sessions: 6" in out
        with redis_server.client() as raw:  # nothing outside its namespace
            assert all(namespace in k.decode() for k in raw.scan_iter(match=f"*{namespace}*"))
    finally:
        with redis_server.client() as raw:
            keys = list(raw.scan_iter(match=f"*{namespace}*", count=1000))
            if keys:
                raw.delete(*keys)
