"""specscope.AsyncLLM on a real engine, and bad input reaching the user as vLLM's own error."""

from __future__ import annotations

import asyncio
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from specscope import Hub, tiny_models
from tests.conftest import ENGINE_KW, greedy, spec_config

pytestmark = pytest.mark.engine

PROMPTS = tiny_models.prompts(6, seed=11)


@pytest.fixture(scope="module")
def async_engine(tiny: Any, engines: Any) -> tuple[Any, Hub]:
    from vllm.engine.arg_utils import AsyncEngineArgs

    import specscope

    def make() -> tuple[Any, Hub]:
        hub = Hub()
        args = AsyncEngineArgs(model=str(tiny["target"]), speculative_config=spec_config(tiny, "noise10"),
                               **ENGINE_KW)
        return specscope.AsyncLLM.from_engine_args(args, specscope_hub=hub), hub

    return engines.get("async-noise10", make)


def test_async_engine_records_every_request(async_engine: tuple[Any, Hub]) -> None:
    engine, hub = async_engine

    async def one(i: int, prompt: str) -> Any:
        final = None
        async for out in engine.generate(prompt, greedy(32), request_id=f"async-{i}"):
            final = out
        return final

    async def run_all() -> list[Any]:
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(PROMPTS)))

    outs = asyncio.run(run_all())
    snap = hub.snapshot()
    recs = {r.request_id: r for r in snap.requests}
    assert set(recs) == {f"async-{i}" for i in range(len(PROMPTS))}
    for out in outs:
        rec = recs[out.request_id]
        m = out.outputs[0].spec_decode_metrics.to_dict()
        assert (rec.draft_tokens, rec.accepted_tokens, rec.spec_steps) == (
            m["num_draft_tokens"], m["num_accepted_draft_tokens"], m["num_spec_steps"])
        assert rec.generation_tokens == 32 and rec.e2e_s > 0
    life = snap.lifetime.spec
    assert life is not None and life.draft_tokens == sum(r.draft_tokens for r in recs.values())
    assert life.accepted == sum(r.accepted_tokens for r in recs.values())
    assert 0.1 <= life.acceptance_rate <= 0.4
    # One specscope logger on the engine, even though the entry-point plugin is installed too.
    from specscope.engine.vllm_logger import SpecscopeStatLogger

    assert sum(isinstance(lg, SpecscopeStatLogger) for lg in engine.logger_manager.stat_loggers) == 1


def error_of(factory: Any, model: str, **kw: Any) -> BaseException:
    with pytest.raises(Exception) as info:
        factory(model, **kw, **ENGINE_KW)
    return info.value


def raised_in_specscope(exc: BaseException) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    return "specscope" in Path(frames[-1].filename).parts


@pytest.mark.parametrize(
    ("case", "kwargs"),
    [
        ("missing model", {}),
        ("unknown method", {"speculative_config": {"method": "no-such-method", "num_speculative_tokens": 4}}),
        ("missing draft", {"speculative_config": {"method": "draft_model", "model": "/no/such/draft",
                                                  "num_speculative_tokens": 4}}),
        ("bad K", {"speculative_config": {"method": "ngram", "num_speculative_tokens": -3}}),
    ],
)
def test_bad_input_gives_vllms_error_unchanged(tiny: Any, engines: Any, case: str, kwargs: dict[str, Any],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm
    from vllm.transformers_utils import repo_utils

    import specscope

    engines.close()
    # vLLM looks a missing draft up again after 2 s (with_retry), for both constructors alike: the same error, sooner
    monkeypatch.setattr(repo_utils, "time", SimpleNamespace(sleep=lambda seconds: None))
    model = "/no/such/model" if case == "missing model" else str(tiny["target"])
    theirs = error_of(vllm.LLM, model, **kwargs)
    ours = error_of(specscope.LLM, model, **kwargs)
    assert type(ours) is type(theirs)
    assert str(ours) == str(theirs)
    assert not raised_in_specscope(ours)
