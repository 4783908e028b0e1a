"""Shared fixtures: the tiny model family and real vLLM engines, one alive at a time; ``--quick`` leaves out every
test marked ``engine`` (all of tests/e2e/) or ``server``."""

from __future__ import annotations

import gc
import os
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
#: vLLM's choice of process layout; a process without it gets vLLM's default (see :func:`pytest_configure`).
LAYOUT_VAR = "VLLM_ENABLE_V1_MULTIPROCESSING"

#: Engine settings that work on a 2-core CPU machine (see ../shared/notes/vllm.md).
ENGINE_KW: dict[str, Any] = {"enforce_eager": True, "dtype": "float32", "max_model_len": 512, "seed": 0}
K = 4
#: The repository's root, and the files tests read.
REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
#: Every test under here drives a real vLLM engine or server end to end: marked ``engine`` (the package's
#: ``engine`` layer is tested, engine-free, in tests/engine/).
ENGINE_TESTS = REPO / "tests" / "e2e"
#: The markers ``--quick`` leaves out.
SLOW_MARKERS = ("engine", "server")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--quick", action="store_true",
                     help="the inner loop: leave out the tests that start a vLLM engine or a server process")
    parser.addoption("--slow", action="store_true",
                     help="only the tests --quick leaves out (./dev test runs the --quick ones beside them)")


def pytest_configure(config: pytest.Config) -> None:
    """The suite's offline engines run their engine core in the test process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
    4 s to start where the default layout's two spawned processes take 14 s (measured here); specscope's code runs
    in the front-end process either way. vLLM's default layout is what users run: every server
    (:func:`tests.e2e.test_server.start_server`), the demo, `specscope evaluate` and the modules that take
    :func:`user_layout` (those that time engines) run it.
    Set here, not on import, so that the benchmarks that borrow the suite's helpers keep the default."""
    config.addinivalue_line("markers", "server: starts Debian's prometheus, alertmanager or victoria-metrics")
    os.environ.setdefault(LAYOUT_VAR, "0")


def pytest_itemcollected(item: pytest.Item) -> None:
    if ENGINE_TESTS in item.path.parents:
        item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def tiny() -> dict[str, Path]:
    from specscope import tiny_models

    return tiny_models.build()


def spec_config(tiny: dict[str, Path], draft: str, k: int = K) -> dict[str, Any]:
    """A speculative_config for one of the tiny drafts, or n-gram lookup."""
    if draft == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    return {"method": "draft_model", "model": str(tiny[draft]), "num_speculative_tokens": k}


def shutdown(llm: Any) -> None:
    """Stop an engine's worker processes now rather than at garbage collection; their exit goes on while the next
    test starts (:func:`specscope.engine.measure.stop_engine`)."""
    from specscope import uninstrument
    from specscope.engine.measure import stop_engine

    uninstrument(llm)
    stop_engine(llm)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Every engine stopped before pytest exits."""
    if "specscope.engine.measure" in sys.modules:
        sys.modules["specscope.engine.measure"].wait_stopped()


class EnginePool:
    """Keeps at most one engine alive; asking for another configuration shuts the current one down."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.value: Any = None

    def get(self, key: str, make: Callable[[], Any]) -> Any:
        if self.key != key:
            self.close()
            self.value = make()
            self.key = key
        return self.value

    def close(self) -> None:
        if self.value is not None:
            value, self.value, self.key = self.value, None, None
            shutdown(value[0] if isinstance(value, tuple) else value)
            del value
            gc.collect()


def user_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with vLLM's default process layout, as users run it."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k != LAYOUT_VAR}


@pytest.fixture(scope="module")
def user_layout() -> Iterator[None]:
    """The engines this module starts in vLLM's default layout: the engine core and its worker in processes of their
    own, as users run them. The modules that time engines (the verdict's truth, calibration, heads) take it: a
    speedup claimed for users is measured where users run."""
    import vllm.envs

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(LAYOUT_VAR, "1")
        vllm.envs.disable_envs_cache()  # an in-process engine core cached the environment as it started
        yield
    vllm.envs.disable_envs_cache()


@pytest.fixture(scope="session")
def engines() -> Iterator[EnginePool]:
    pool = EnginePool()
    yield pool
    pool.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def greedy(max_tokens: int = 48) -> Any:
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def vllm_counters(llm: Any) -> dict[str, Any]:
    """vLLM's own counters and gauges of ``llm``'s engine (names without ``vllm:``; accepted tokens per position a
    list), read from its Prometheus stat logger's metrics: the process's registry, which ``llm.get_metrics()``
    reads, holds only the last-started engine's (each new logger unregisters the others'), so with two engines
    started together it may hold the other one's."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    def samples(v: Any) -> list[tuple[str, float]]:
        if hasattr(v, "_name") and hasattr(v, "_value"):  # a labelled child: one engine's counter or gauge
            return [(v._name.removeprefix("vllm:"), v._value.get())]
        return [x for w in v.values() for x in samples(w)] if isinstance(v, dict) else []

    prom = next(s for s in llm.llm_engine.logger_manager.stat_loggers if isinstance(s, PrometheusStatLogger))
    out: dict[str, Any] = {}
    for holder in (prom, prom.spec_decoding_prom):
        for v in vars(holder).values():
            rows = list(v.values()) if isinstance(v, dict) else []
            if rows and all(isinstance(w, list) and w and hasattr(w[0], "_value") for w in rows):  # by position
                out[rows[0][0]._name.removeprefix("vllm:")] = [
                    int(sum(c._value.get() for c in cs)) for cs in zip(*rows, strict=True)]
                continue
            for name, x in samples(v):
                out[name] = out.get(name, 0) + x
    return out


def hf_cache(home: Path, models: dict[str, Path]) -> dict[str, str]:
    """A local Hugging Face cache under ``home`` holding ``{hub id: model directory}``, laid out as the hub client
    writes it (``hub/models--ORG--NAME/snapshots/<revision>/`` and ``refs/main``), with files linked, not copied.
    Returns the environment that makes vLLM and transformers load those ids offline."""
    import hashlib

    for hub_id, src in models.items():
        repo = home / "hub" / f"models--{hub_id.replace('/', '--')}"
        rev = hashlib.sha1(hub_id.encode()).hexdigest()
        snap = repo / "snapshots" / rev
        snap.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.is_file() and not (snap / f.name).exists():
                (snap / f.name).symlink_to(f.resolve())
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(rev)
    return {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def start_prometheus(jobs: dict[str, str], tmp: Path, up_within_s: float = 90,
                     kind: str = "prometheus") -> tuple[str, Any]:
    """Debian's Prometheus (or, ``kind="victoriametrics"``, VictoriaMetrics) on 127.0.0.1 scraping ``jobs`` (name →
    host:port) every second; returns (URL, process) once every job has been scraped (it stops by itself after 10
    minutes)."""
    import subprocess
    import time

    import httpx

    scrape = "".join(f"  - job_name: {name}\n    static_configs: [{{targets: ['{target}']}}]\n"
                     for name, target in jobs.items())
    (tmp / "prometheus.yml").write_text(f"global: {{scrape_interval: 1s}}\nscrape_configs:\n{scrape}")
    port = free_port()
    if kind == "prometheus":
        cmd = ["prometheus", f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
               f"--web.listen-address=127.0.0.1:{port}"]
    else:  # answers instant queries with the newest samples (by default it holds back the last 30 s)
        cmd = ["victoria-metrics", f"-promscrape.config={tmp / 'prometheus.yml'}", f"-storageDataPath={tmp / 'vm'}",
               f"-httpListenAddr=127.0.0.1:{port}", "-search.latencyOffset=0s", "-search.disableCache"]
    proc = subprocess.Popen(["timeout", "600", *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + up_within_s
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{url}/api/v1/query", params={"query": "up == 1"}, timeout=5).json()
            if len(r["data"]["result"]) == len(jobs):
                return url, proc
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    proc.terminate()
    raise RuntimeError(f"{kind} did not scrape {sorted(jobs)} within {up_within_s:.0f} s")


#: module -> the module it runs right after: the heads' last plain engine (deep01's, in vLLM's default layout) is
#: the verdict's, kept in :class:`EnginePool` between them (an engine start is 14 s in that layout).
FOLLOWS = {"test_verdict.py": "test_heads.py"}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``--quick``, leave out the tests marked :data:`SLOW_MARKERS`; with ``--slow``, keep only them. Then run
    each engine configuration's tests together: pytest groups a module-scoped parametrized fixture by the *index*
    of its parameter, and an indirect parametrization (``["copy"]``) numbers from 0 again, so each such test would
    restart an engine (~35 s). Within a module the tests are stably sorted by their ``run`` value. Last, the modules
    in :data:`FOLLOWS` move to just after the module they share an engine with."""
    if config.getoption("quick") or config.getoption("slow"):
        quick: list[pytest.Item] = []
        slow: list[pytest.Item] = []
        for item in items:
            (slow if any(item.get_closest_marker(m) for m in SLOW_MARKERS) else quick).append(item)
        kept, left = (quick, slow) if config.getoption("quick") else (slow, quick)
        config.hook.pytest_deselected(items=left)
        items[:] = kept
    start = 0
    while start < len(items):
        end = start
        while end < len(items) and items[end].module is items[start].module:  # type: ignore[attr-defined]
            end += 1
        block = items[start:end]
        order: dict[Any, int] = {}
        for item in block:
            order.setdefault(_engine_param(item), len(order))
        if len(order) > 1:
            items[start:end] = sorted(block, key=lambda item: order[_engine_param(item)])
        start = end
    for module, after in FOLLOWS.items():
        moved = [item for item in items if item.path.name == module]
        rest = [item for item in items if item.path.name != module]
        at = max((i + 1 for i, item in enumerate(rest) if item.path.name == after), default=len(rest))
        items[:] = rest[:at] + moved + rest[at:]


def _engine_param(item: pytest.Item) -> Any:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("run") if callspec is not None else None
