"""The adapters are optional: importing memtier never imports a framework."""

from __future__ import annotations

import subprocess
import sys


def test_import_memtier_imports_no_framework() -> None:
    code = (
        "import sys, memtier, memtier.integrations\n"
        "loaded = [m for m in ('agents', 'langchain_core', 'langgraph') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_each_adapter_imports_on_its_own() -> None:
    for module in ("openai_agents", "langchain", "langgraph"):
        subprocess.run(
            [sys.executable, "-c", f"import memtier.integrations.{module}"],
            check=True,
            timeout=120,
        )
