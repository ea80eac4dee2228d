"""The sync and asyncio thread services are shells: every method only drives a plan.

All logic lives in the I/O-free core (memtier.threads.core and its modules) and the
shared run-turn protocol (memtier.threads.runturn); a method that grows beyond a few
statements is logic creeping back into one shell, where the other can drift from it.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from memtier.threads import aio, service

MAX_STATEMENTS = 5  # the constructor only wires its parts; it is left out


def _methods(cls: type) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0]
    assert isinstance(body, ast.ClassDef)
    return [
        (node.name, node)
        for node in body.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name != "__init__"
    ]


def _statements(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return sum(1 for top in body for _ in ast.walk(top) if isinstance(_, ast.stmt))


@pytest.mark.parametrize(
    "cls", [service.ConversationService, aio.AsyncConversationService], ids=lambda c: c.__name__
)
def test_every_shell_method_is_a_few_statements(cls: type) -> None:
    methods = _methods(cls)
    assert len(methods) > 15  # the parse found the API
    too_long = {name: n for name, node in methods if (n := _statements(node)) > MAX_STATEMENTS}
    assert too_long == {}


def test_the_statement_count_sees_logic() -> None:
    """The negative case: a method with a branch and a loop counts every nested statement."""
    source = (
        "def f(x):\n"
        "    '''doc'''\n"
        "    for i in x:\n"
        "        if i:\n"
        "            return i\n"
        "    return 0\n"
    )
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef)
    assert _statements(node) == 4
