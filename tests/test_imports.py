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
    assert {"specscope.core.model", "specscope.core.codec"} <= graph.keys()
    assert "specscope.core.model" in graph["specscope.core.codec"]
    assert cycle(graph) is None


def test_the_check_sees_a_circle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


#: specscope's layers, bottom first: a module imports only from its own layer or those below it. ``specscope``
#: itself and its modules outside a layer folder (``cli``, ``demo``: the commands) are the top, ``_version`` a leaf
#: any layer may read.
LAYERS = ("core", "verdict", "state", "export", "engine", "tiny_models", "read")


def layer(mod: str) -> int:
    """``mod``'s place in :data:`LAYERS` (the top, past the last, outside them; -1 for ``specscope._version``)."""
    parts = mod.split(".")
    if mod == "specscope._version":
        return -1
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else len(LAYERS)


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every import in ``graph`` from a module to one in a layer above its own."""
    return sorted((mod, dep) for mod, deps in graph.items() for dep in deps if layer(dep) > layer(mod))


def test_every_import_runs_down_the_layers() -> None:
    graph = import_graph()
    assert {layer(m) for m in graph} == {-1, *range(len(LAYERS) + 1)}  # every layer has modules: names kept true
    assert upward(graph) == []


def test_the_layer_check_sees_an_upward_import() -> None:
    graph = {"specscope.core.model": {"specscope.state.hub"}, "specscope.state.hub": {"specscope.core.model"},
             "specscope.cli": {"specscope.read.tui"}}
    assert upward(graph) == [("specscope.core.model", "specscope.state.hub")]
