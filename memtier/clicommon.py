"""What every ``memtier`` subcommand shares: flags, configuration, logging, errors.

One CLI shape: ``--config FILE.toml``, ``--redis-url``, ``--namespace``, ``-v``/``-q``
(repeatable) and ``--log-format text|json`` on every subcommand.  Configuration
precedence (see :mod:`memtier.config`): these flags > ``MEMTIER_*`` environment
variables > the TOML file > defaults.

Errors are one line on stderr naming what to fix, never a traceback: usage and
configuration errors exit 2, a failed operation exits 1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from memtier.config import MemtierConfig
from memtier.errors import ConfigurationError, MemtierError

__all__ = [
    "EXIT_FAILED",
    "EXIT_USAGE",
    "CliParser",
    "JsonFormatter",
    "add_common_arguments",
    "fail",
    "guarded",
    "load_config",
    "log_level",
    "setup_logging",
]

EXIT_FAILED = 1
EXIT_USAGE = 2
LEVELS = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
# LogRecord attributes that are not "extra" fields of a JSON line.
_STANDARD_RECORD_KEYS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class CliParser(argparse.ArgumentParser):
    """argparse, with usage errors as one line (no usage dump) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def add_common_arguments(parser: argparse.ArgumentParser, *, namespace: bool = True) -> None:
    parser.add_argument("--config", type=Path, help="TOML configuration file (lowest precedence)")
    parser.add_argument(
        "--redis-url",
        help="redis://, rediss://, unix:// or redis+cluster:// (overrides MEMTIER_REDIS_URL"
        " and the file)",
    )
    if namespace:
        parser.add_argument(
            "--namespace", help="key namespace (overrides MEMTIER_NAMESPACE and the file)"
        )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)"
    )
    parser.add_argument("-q", "--quiet", action="count", default=0, help="less log output")
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="log lines as text or as one JSON object per line (for log shippers)",
    )
    parser.add_argument("--log-level", help=argparse.SUPPRESS)  # older spelling; -v/-q win


def log_level(args: argparse.Namespace, default: int) -> int:
    """``default`` moved one step per ``-v`` (down) or ``-q`` (up); ``--log-level`` if given."""
    if getattr(args, "log_level", None) and not (args.verbose or args.quiet):
        named = logging.getLevelName(str(args.log_level).upper())
        if isinstance(named, int):
            return named
        raise ConfigurationError(f"--log-level {args.log_level!r}: use DEBUG, INFO, WARNING, ERROR")
    index = LEVELS.index(default) - int(args.verbose) + int(args.quiet)
    return LEVELS[max(0, min(index, len(LEVELS) - 1))]


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, message, plus the record's extras."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_RECORD_KEYS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc_type"] = record.exc_info[0].__name__ if record.exc_info[0] else None
        return json.dumps(out, default=str, sort_keys=False)


def setup_logging(
    args: argparse.Namespace, default: int = logging.WARNING, *, plain: bool = False
) -> None:
    """Configure the root logger for a CLI process (stderr); ``plain``: messages only."""
    handler = logging.StreamHandler(sys.stderr)
    if getattr(args, "log_format", "text") == "json":
        handler.setFormatter(JsonFormatter())
    elif plain:
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_memtier_cli", False):
            root.removeHandler(old)
    handler._memtier_cli = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(log_level(args, default))


def load_config(args: argparse.Namespace) -> MemtierConfig:
    """Flags > environment > ``--config`` file > defaults."""
    overrides: dict[str, Any] = {}
    if getattr(args, "redis_url", None):
        overrides["redis_url"] = args.redis_url
    if getattr(args, "namespace", None):
        overrides["namespace"] = args.namespace
    if getattr(args, "config", None) is not None:
        return MemtierConfig.from_toml(args.config, **overrides)
    return MemtierConfig.load(**overrides)


def fail(command: str, exc: BaseException | str, code: int = EXIT_FAILED) -> int:
    """Print one line ``memtier <command>: <what to fix>`` on stderr; return ``code``."""
    text = exc.message if isinstance(exc, MemtierError) else str(exc)
    print(f"memtier {command}: {' '.join(str(text).split())}", file=sys.stderr)
    return code


def guarded(command: str, body: Callable[[], int]) -> int:
    """Run a subcommand: configuration errors exit 2, memtier errors 1, one line each."""
    try:
        return body()
    except ConfigurationError as exc:
        return fail(command, exc, EXIT_USAGE)
    except MemtierError as exc:
        return fail(command, exc, EXIT_FAILED)
    except OSError as exc:  # a file or socket the operator named: say which
        return fail(command, exc, EXIT_FAILED)
