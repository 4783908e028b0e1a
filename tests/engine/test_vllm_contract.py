"""What specscope reads of vLLM, against each supported release's contract.

The contracts (``tests/fixtures/vllm_contract_<version>.json``) are made by ``scripts/vllm_contract.py`` from
vLLM's sources; what specscope needs is taken from its own code: the stats reader's ``NEEDED_FIELDS``, the hook's
wrappers and the attributes they read, the stat logger's methods. The installed vLLM is checked against its
release's contract, so a stale fixture fails too.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from specscope.engine import vllm_config, vllm_hook, vllm_stats
from tests.conftest import FIXTURES

FIXTURES = FIXTURES
VERSIONS = ("0.32", "0.33")
#: The classes of the hook's variables whose attributes it reads (the hook names them after vLLM's parameters).
HOOK_VARIABLES = {"req_state": "RequestState", "iteration_stats": "IterationStats", "stats": "RequestStateStats"}
LOGGER_SOURCE = Path(vllm_hook.__file__).with_name("vllm_logger.py")


def load(version: str) -> dict[str, Any]:
    contract: dict[str, Any] = json.loads((FIXTURES / f"vllm_contract_{version}.json").read_text(encoding="utf-8"))
    return contract


@pytest.fixture(params=VERSIONS)
def contract(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load(request.param)


def names(items: list[dict[str, Any]]) -> list[str]:
    return [item["name"] for item in items]


def readable(entry: dict[str, Any]) -> set[str]:
    """What can be read off an instance of a contract's class: fields, ``__init__`` attributes, properties."""
    return {*names(entry["fields"]), *names(entry["attributes"]), *names(entry["properties"])}


def positional(params: list[dict[str, Any]]) -> list[str]:
    return [p["name"] for p in params if p["kind"] in ("positional_only", "positional_or_keyword")]


def hook_tree() -> ast.Module:
    return ast.parse(Path(vllm_hook.__file__).read_text(encoding="utf-8"))


def hook_wrappers() -> dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]:
    """The hook's wrapper functions, by the name of the vLLM method each replaces (``_replace(owner, name, fn)``)."""
    tree = hook_tree()
    replaced = {
        str(call.args[1].value)
        for call in ast.walk(tree)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "_replace"
        and isinstance(call.args[1], ast.Constant)
    }
    wrappers: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and fn.name in replaced:
            wrappers.setdefault(fn.name, []).append(fn)
    return wrappers


def hook_reads() -> dict[str, set[str]]:
    """The attributes the hook reads of vLLM's objects (``var.name`` and ``getattr(var, "name", ...)``), by class."""
    reads: dict[str, set[str]] = {}
    for node in ast.walk(hook_tree()):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            var, attr = node.value.id, node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and isinstance(node.args[0], ast.Name) and isinstance(node.args[1], ast.Constant)):
            var, attr = node.args[0].id, str(node.args[1].value)
        else:
            continue
        if var in HOOK_VARIABLES:
            reads.setdefault(HOOK_VARIABLES[var], set()).add(attr)
    return reads


def kwargs_read() -> set[str]:
    """The keyword arguments of ``add_request`` the hook takes (``kwargs.get("name")``)."""
    return {
        str(node.args[0].value)
        for node in ast.walk(hook_tree())
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
        and isinstance(node.func.value, ast.Name) and node.func.value.id == "kwargs"
        and isinstance(node.args[0], ast.Constant)
    }


def test_fixtures_are_the_releases_they_are_named_after() -> None:
    for version in VERSIONS:
        assert load(version)["vllm_version"].startswith(f"{version}."), version


def test_reader_fields_are_in_the_release(contract: dict[str, Any]) -> None:
    classes = contract["classes"]
    assert vllm_stats.NEEDED_FIELDS, "the reader names no fields"
    missing = [f"{cls}.{name}" for cls, needed in vllm_stats.NEEDED_FIELDS.items()
               for name in needed if cls not in classes or name not in readable(classes[cls])]
    assert missing == [], f"vLLM {contract['vllm_version']} lacks what the reader reads"


def test_hook_reads_are_in_the_release(contract: dict[str, Any]) -> None:
    reads = hook_reads()
    assert reads.get("RequestState"), "the hook reads nothing of the request state: HOOK_VARIABLES is stale"
    classes = contract["classes"]
    missing = [f"{cls}.{name}" for cls, needed in sorted(reads.items()) for name in sorted(needed)
               if cls not in classes or name not in readable(classes[cls])]
    assert missing == [], f"vLLM {contract['vllm_version']} lacks what the hook reads"


def test_hooked_methods_take_what_the_hook_passes(contract: dict[str, Any]) -> None:
    wrappers = hook_wrappers()
    assert {"_update_stats_from_finished", "do_tracing", "add_request"} <= set(wrappers)
    hooked = contract["hooked_methods"]
    by_method = {key.split(".", 1)[1] for key in hooked}
    assert set(wrappers) <= by_method, f"vLLM {contract['vllm_version']} lacks a method the hook wraps"
    kwargs_taken = kwargs_read()
    assert kwargs_taken, "the hook takes no keyword arguments of add_request: kwargs_read is stale"
    for key, entry in hooked.items():
        method = key.split(".", 1)[1]
        vllm_params = entry["parameters"]
        for wrapper in wrappers[method]:
            ours = [a.arg for a in (*wrapper.args.posonlyargs, *wrapper.args.args)]
            theirs = positional(vllm_params)
            if wrapper.args.vararg is None:
                # Called with vLLM's own arguments, by position or name: the same names in the same order.
                assert theirs == ours, key
            else:
                assert theirs[:len(ours)] == ours, key
            if wrapper.args.kwarg is not None:
                assert kwargs_taken <= set(names(vllm_params)), key


def logger_methods() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(LOGGER_SOURCE.read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpecscopeStatLogger")
    assert [ast.unparse(b) for b in cls.bases] == ["AggregateStatLoggerBase"]
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def test_stat_logger_implements_the_release_interface(contract: dict[str, Any]) -> None:
    loggers = contract["stat_logger"]
    # The chain from specscope's base up, most derived first.
    chain = ["AggregateStatLoggerBase"]
    while loggers[chain[-1]]["bases"][0] in loggers:
        chain.append(loggers[chain[-1]]["bases"][0])
    assert chain == ["AggregateStatLoggerBase", "StatLoggerBase"]
    interface: dict[str, dict[str, Any]] = {}
    for cls in reversed(chain):
        interface.update(loggers[cls]["methods"])
    ours = logger_methods()
    abstract = {name for name, m in interface.items() if m["abstract"]}
    assert abstract >= {"__init__", "record", "log_engine_initialized"}
    assert abstract <= set(ours), f"an abstract method of vLLM {contract['vllm_version']}'s stat logger is missing"
    for name, fn in ours.items():
        if name in interface:
            assert [a.arg for a in fn.args.args] == positional(interface[name]["parameters"]), name


def test_installed_vllm_matches_its_contract() -> None:
    """The installed vLLM, imported, has what its release's fixture says (a stale fixture fails here)."""
    pytest.importorskip("vllm.v1.metrics.stats")
    version = vllm_config.engine_version() or ""
    release = ".".join(version.split(".")[:2])
    if release not in VERSIONS:
        pytest.skip(f"no contract fixture for the installed vLLM {version}")
    contract = load(release)

    def imported(entry: dict[str, Any], name: str) -> Any:
        return getattr(importlib.import_module(entry["file"].removesuffix(".py").replace("/", ".")), name)

    checked = 0
    for name, entry in contract["classes"].items():
        cls = imported(entry, name)
        if entry["dataclass"]:
            assert [f.name for f in dataclasses.fields(cls)] == names(entry["fields"]), name
            checked += 1
        elif not list(inspect.signature(cls).parameters):
            assert list(vars(cls())) == names(entry["attributes"]), name
            checked += 1
        for prop in names(entry["properties"]):
            assert isinstance(inspect.getattr_static(cls, prop), property), f"{name}.{prop}"
    assert checked >= len(vllm_stats.NEEDED_FIELDS)
    for key, entry in contract["hooked_methods"].items():
        cls_name, method = key.split(".", 1)
        fn = getattr(imported(entry, cls_name), method)
        assert list(inspect.signature(fn).parameters) == names(entry["parameters"]), key
    for cls_name, entry in contract["stat_logger"].items():
        cls = imported(entry, cls_name)
        for method, sig in entry["methods"].items():
            assert list(inspect.signature(vars(cls)[method]).parameters) == names(sig["parameters"]), method
