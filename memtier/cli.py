"""The ``memtier`` command: demo, serve, worker, flush, restore, inspect.

Each subcommand lives in the module that owns it; this file only dispatches,
so ``memtier --help`` stays fast (imports are lazy).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# subcommand -> (module, function, one-line help).  The function takes argv (list[str])
# and returns an exit code.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": ("memtier.demo", "main", "drive the conversation-memory store end to end"),
    "serve": ("memtier.threads.serve", "main", "run the threads HTTP API and /metrics"),
    "worker": ("memtier.workers.cli", "worker_main", "run compaction, expiry sweeps, flushes"),
    "flush": ("memtier.workers.cli", "flush_main", "write a snapshot generation now"),
    "restore": ("memtier.workers.cli", "restore_main", "recover from the newest valid snapshot"),
    "inspect": ("memtier.workers.cli", "inspect_main", "list session metadata (never content)"),
}


def _usage() -> str:
    lines = ["usage: memtier <command> [options]", "", "commands:"]
    lines += [f"  {name:<9} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] == "--version":
        from memtier._version import __version__

        print(__version__)
        return 0
    entry = COMMANDS.get(args[0])
    if entry is None:
        names = ", ".join(COMMANDS)
        print(f"memtier: unknown command {args[0]!r} (one of: {names})", file=sys.stderr)
        return 2
    module, func, _ = entry
    try:
        target = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        print(f"memtier {args[0]}: not available in this installation ({exc})", file=sys.stderr)
        return 2
    from memtier.clicommon import guarded

    try:
        return guarded(args[0], lambda: int(target(args[1:])))
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2, one line printed)
        return exc.code if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:
        print(f"memtier {args[0]}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
