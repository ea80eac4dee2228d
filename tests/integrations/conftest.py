"""The adapter tests reuse the conversation-memory helpers (tests/memory/memhelpers.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

_MEMORY_TESTS = str(Path(__file__).resolve().parent.parent / "memory")
if _MEMORY_TESTS not in sys.path:
    sys.path.insert(0, _MEMORY_TESTS)

# The Agents SDK would try to export traces to OpenAI: the tests never touch the network.
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
