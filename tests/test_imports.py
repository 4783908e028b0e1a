"""The package's modules import each other without a circle: every import counts, function-level ones too."""

from __future__ import annotations

import ast
from pathlib import Path

import specscope

ROOT = Path(specscope.__file__).parent


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each specscope module's specscope imports, by module name (``from pkg import mod`` names ``pkg.mod``)."""
    paths = {_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in paths.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: package.count(".") + 2 - node.level]
                    base = ".".join([*anchor, base] if base else anchor)
                deps |= {f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names}
        graph[mod] = {d for d in deps if d in paths and d != mod}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports in ``graph`` (its modules, the first repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []

    def walk(mod: str) -> list[str] | None:
        if mod in path:
            return [*path[path.index(mod):], mod]
        if mod in done:
            return None
        path.append(mod)
        found = next((c for dep in sorted(graph[mod]) if (c := walk(dep))), None)
        path.pop()
        done.add(mod)
        return found

    return next((c for mod in sorted(graph) if (c := walk(mod))), None)


def test_no_import_circle_among_specscope_modules() -> None:
    graph = import_graph()
    assert {"specscope.model", "specscope.codec"} <= graph.keys() and "specscope.model" in graph["specscope.codec"]
    assert cycle(graph) is None


def test_the_check_sees_a_circle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
