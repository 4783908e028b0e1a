"""vLLM's configuration as specscope reads it: the readings the stat logger takes, an API-server process's rank,
and ``vllm serve`` loading the plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from specscope.engine import door, share, vllm_config
from specscope.export import exports
from specscope.state.hub import Hub
from tests.engine.test_share import declared_entry_points


def test_the_stat_loggers_readings_of_the_config_default_where_vllm_says_nothing() -> None:
    """What the stat logger reads of a ``VllmConfig`` (:mod:`specscope.engine.vllm_config`), set and unset."""
    spec = SimpleNamespace(method="draft_model", num_speculative_tokens=4,
                           draft_model_config=SimpleNamespace(tokenizer="/m/draft"))
    config = SimpleNamespace(
        speculative_config=spec, model_config=SimpleNamespace(model="/m/target", tokenizer="/m/target"),
        observability_config=SimpleNamespace(per_request_spec_decode_metrics="summary"),
        parallel_config=SimpleNamespace(_api_process_rank=1, _api_process_count=2),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=2048, long_prefill_token_threshold=512))
    assert vllm_config.speculative_config(config) is spec
    assert vllm_config.model_name(config, "this engine") == "/m/target"
    assert vllm_config.decode_tokens(config) == 5
    assert not vllm_config.per_request_metrics_off(config)
    assert vllm_config.draft_tokenizers(config) == ("/m/target", "/m/draft")
    assert vllm_config.api_server(config) == (1, 2)
    assert vllm_config.token_budget(config) == (2048, 512)
    config.observability_config.per_request_spec_decode_metrics = "none"
    assert vllm_config.per_request_metrics_off(config)
    spec.method = "eagle"
    assert vllm_config.draft_tokenizers(config) is None
    bare = SimpleNamespace()
    assert vllm_config.speculative_config(bare) is None and vllm_config.model_name(bare, "this engine") == "this engine"
    assert vllm_config.decode_tokens(bare) == 1 and not vllm_config.per_request_metrics_off(bare)
    assert vllm_config.draft_tokenizers(bare) is None
    assert vllm_config.api_server(bare) == (0, 1) and vllm_config.token_budget(bare) == (0, 0)


def test_the_plugin_of_an_api_server_that_cannot_share_leaves_exports_to_index_0(monkeypatch: Any) -> None:
    """The plugin's path: vLLM's ``_api_process_rank`` of ``_api_process_count``, no share directory named."""
    for name in ("SPECSCOPE_SHARE_DIR", share.SERVER_ENV):
        monkeypatch.delenv(name, raising=False)
    leads: list[Any] = []
    monkeypatch.setattr(exports, "from_env", lambda hub, lead=None: leads.append(lead))
    for rank in (0, 1):
        for name, value in (("_shared", False), ("_lead", None), ("_exports_started", False)):
            monkeypatch.setattr(door, name, value)  # a fresh API-server process
        hub = Hub()
        config = SimpleNamespace(parallel_config=SimpleNamespace(_api_process_count=2, _api_process_rank=rank))
        door._share_once(hub, config)
        door._start_exports_once(hub)
        snap = hub.snapshot()
        assert (snap.processes, snap.server_processes) == (1, 2)
    assert [lead("prometheus") for lead in leads] == [True, False]


def test_vllm_serve_runs_the_namer_before_it_starts_its_api_servers(tmp_path: Path) -> None:
    """vLLM builds ``vllm serve``'s argument parser in the ``vllm serve`` process, before anything else starts, and
    that runs the ``vllm.general_plugins`` entry points ``VLLM_PLUGINS`` allows: specscope's names the share there
    (declared as in pyproject.toml, so that the test does not depend on how the package was installed)."""
    points = declared_entry_points("vllm.general_plugins")
    dist = tmp_path / "specscope_plugins-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: specscope-plugins\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[vllm.general_plugins]\n" + "".join(f"{k} = {v}\n"
                                                                               for k, v in points.items()))
    script = ("import os\n"
              "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
              "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
              "make_arg_parser(FlexibleArgumentParser(prog='vllm serve'))\n"
              f"print(os.environ[{share.SERVER_ENV!r}])\n")
    env = {k: v for k, v in os.environ.items() if k not in (share.SERVER_ENV, "SPECSCOPE_SHARE_DIR",
                                                            "XDG_RUNTIME_DIR")}
    env.update(PYTHONPATH=str(tmp_path), VLLM_PLUGINS="specscope", TMPDIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    named = Path(out.stdout.strip().splitlines()[-1])
    assert named.parent == tmp_path and named.name.startswith(f"specscope-{os.geteuid()}-")
