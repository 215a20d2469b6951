"""The package's import graph has no cycles: every `rlspeed` import, at module level or inside a function, counts
(an import moved into a function to dodge a cycle still ties the two modules together); imports under
`if TYPE_CHECKING:` do not, since they never run."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rlspeed

ROOT = Path(rlspeed.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the rlspeed modules it imports (a package's `__init__` is the package's name)."""
    modules = {_module_name(path): path for path in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        # imports under `if TYPE_CHECKING:` are for annotations only and never run
        typing_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test) for inner in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                # `from pkg import module` ties the importer to that module; `from pkg import name`, to pkg
                for alias in node.names:
                    targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycles():
    graph = import_graph()
    # (the graph holds the package's imports: a graph whose module names missed them would have no cycle either)
    assert "rlspeed.algos.on_policy" in graph["rlspeed.algos.ppo"] and sum(map(len, graph.values())) > len(graph)
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_a_public_name_whose_module_fails_to_import_says_why(tmp_path, monkeypatch):
    """`from rlspeed import PPO` where importing rlspeed.algos raised an AttributeError (a torch attribute missing in
    an older torch) reported only "cannot import name 'PPO'": the error names the module and the cause."""
    (tmp_path / "rlspeed_broken_module.py").write_text("import torch\ntorch.backends.no_such_backend.setting\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(rlspeed._SOURCES, "BrokenName", "rlspeed_broken_module")
    with pytest.raises(ImportError, match="importing rlspeed_broken_module .*no_such_backend"):
        from rlspeed import BrokenName  # noqa: F401


def test_the_suites_subprocesses_find_the_rlspeed_the_suite_imported(tmp_path):
    """The CLI and fresh-interpreter tests run rlspeed in subprocesses: with a relative PYTHONPATH (or an editable
    install of another checkout) they imported other code than the suite's, and a test of a change passed without it."""
    import importlib.util
    import subprocess
    import sys

    code = "import importlib.util; print(importlib.util.find_spec('rlspeed').origin)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=tmp_path).stdout
    assert found.strip() == importlib.util.find_spec("rlspeed").origin
