"""The README's framework-adapter examples run as written (a scripted model, a real server)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def python_block_after(heading: str) -> str:
    start = README.index(heading)
    match = re.search(r"```python\n(.*?)```", README[start:], flags=re.DOTALL)
    assert match is not None, heading
    return match.group(1)


def on_server(code: str, url: str, namespace: str) -> str:
    assert "redis://127.0.0.1:6379/0" in code
    code = code.replace("redis://127.0.0.1:6379/0", url)
    return code.replace(
        "MemtierConfig.load(redis_url=", f'MemtierConfig.load(namespace="{namespace}", redis_url='
    )


def test_openai_agents_example_runs(redis_server: Any, capsys: Any) -> None:
    from agentshelpers import ScriptedModel, say

    code = on_server(python_block_after("### OpenAI Agents SDK"), redis_server.url, "readme-oa")
    agent_line = 'Agent(name="assistant", instructions="Be brief.")'
    assert agent_line in code
    code = code.replace(agent_line, agent_line[:-1] + ", model=MODEL)")
    model = ScriptedModel([[say("North-east of the grid.")], [say("Teleport there.")]])
    scope: dict[str, Any] = {"MODEL": model}
    exec(compile(code, "README.md", "exec"), scope)
    out = capsys.readouterr().out
    assert "Teleport there." in out
    assert [i["content"] for i in model.inputs[-1]] == [
        "Where is the sandbox?",
        "North-east of the grid.",
        "How do I get there?",
    ]


def test_langgraph_example_runs(redis_server: Any, capsys: Any) -> None:
    code = on_server(
        python_block_after("### LangGraph checkpointer"), redis_server.url, "readme-lg"
    )
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "['hi', 'You said: hi', 'again', 'You said: again']" in out


def test_langgraph_example_runs_on_the_cluster(redis_cluster: Any, capsys: Any) -> None:
    code = python_block_after("### LangGraph checkpointer")
    code = on_server(code, redis_cluster.url, "readme-lg-cluster")
    exec(compile(code, "README.md", "exec"), {})
    assert "'You said: again'" in capsys.readouterr().out


def test_langchain_example_runs(redis_server: Any, capsys: Any) -> None:
    code = on_server(python_block_after("### LangChain"), redis_server.url, "readme-lc")
    exec(compile(code, "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "['human', 'ai', 'tool', 'ai']",
        "North-east of the grid.",
        "{'system_message': 1}",
    ]
