"""One ledger writer process (started by :func:`ledger.start_writers`).

Appends ``--turns`` turns round-robin over ``--keys`` shared keys, with turn ids
``w<writer>-<n>``, and writes one JSON line before each attempt and one after
it (outcome, code, receipt).  memtier's own retry layer runs with its real
waits: this is the production call path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ledger import classify, ledger_key, turn_text

from memtier import AvatarMessage, ConversationStore, MemtierConfig

GO_TIMEOUT_S = 60.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--writer", type=int, required=True)
    parser.add_argument("--keys", type=int, default=12)
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--pause-ms", type=int, default=0)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--durability", default="")
    # A start barrier: the writer connects, creates <go>.ready-<writer>, and appends only
    # once <go> exists (bounded wait), so every writer starts together.
    parser.add_argument("--go", default="")
    args = parser.parse_args()

    settings: dict[str, object] = {"redis_url": args.url, "namespace": args.namespace}
    if args.durability:
        settings["durability"] = args.durability
    config = MemtierConfig.load(**settings)
    store = ConversationStore.from_config(config, recover=False)
    deadline = time.monotonic() + args.seconds
    fd = os.open(args.ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def record(row: dict[str, object]) -> None:
        os.write(fd, (json.dumps(row, separators=(",", ":")) + "\n").encode())

    if args.go:
        store.client.ping()  # connected before the others are told to go
        Path(f"{args.go}.ready-{args.writer}").touch()
        waited = time.monotonic() + GO_TIMEOUT_S
        while not Path(args.go).exists() and time.monotonic() < waited:
            time.sleep(0.01)
        deadline = time.monotonic() + args.seconds

    try:
        for n in range(args.turns):
            if time.monotonic() >= deadline:
                break
            key = ledger_key(n % args.keys)
            member = f"{key.avatar}:{key.channel}"
            turn_id = f"w{args.writer}-{n}"
            record({"t": turn_id, "s": "attempt", "m": member})
            try:
                receipt = store.append(key, AvatarMessage(text=turn_text(turn_id), turn_id=turn_id))
            except Exception as exc:  # every outcome is recorded, the judge decides
                outcome, code = classify(exc)
                record({"t": turn_id, "s": outcome, "code": code})
            else:
                record({"t": turn_id, "s": "ack", "sid": receipt.session_id, "seq": receipt.seq})
            if args.pause_ms:
                time.sleep(args.pause_ms / 1000)
    finally:
        os.close(fd)
        store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
