"""What the output-processor hook holds of requests in flight, against vLLM's own OutputProcessor (no engine): it is
let go however a request ends (finished, aborted, the last of its n samples, refused as it was added) and bounded
in count and bytes, and a class the client claimed reaches a capture as the client's."""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Iterator
from copy import copy
from pathlib import Path
from typing import Any

import pytest

from specscope.engine import capture, vllm_hook, vllm_stats
from specscope.engine.capture import LOST, Capture, CaptureConfig
from specscope.engine.middleware import SpecscopeMiddleware
from specscope.state.hub import Hub

output_processor = pytest.importorskip("vllm.v1.engine.output_processor")
from vllm import SamplingParams  # noqa: E402
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason  # noqa: E402
from vllm.v1.engine.async_llm import AsyncLLM  # noqa: E402
from vllm.v1.engine.llm_engine import LLMEngine  # noqa: E402
from vllm.v1.engine.parallel_sampling import ParentRequest  # noqa: E402
from vllm.v1.metrics.stats import IterationStats  # noqa: E402

OutputProcessor = output_processor.OutputProcessor
BODY = b'{"messages": [{"role": "user", "content": "' + b"x" * (64 << 10) + b'"}]}'


@pytest.fixture
def hooked(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The hook installed on vLLM's classes (put back afterwards), empty, with a capture running; vLLM's output
    processor of a front end, without an engine. vLLM's own methods first: an engine still alive from an earlier
    test (the e2e tier's, kept for the session) may hold the hook in place, which must not be wrapped twice."""
    for owner, name, original in reversed(vllm_hook._replaced):
        monkeypatch.setattr(owner, name, original)
    for name, fresh in (("_installed", None), ("_holders", 0), ("_replaced", []), ("_ADDED", OrderedDict()),
                        ("_BODIES", OrderedDict()), ("_body_bytes", 0)):
        monkeypatch.setattr(vllm_hook, name, fresh)
    for owner, name in ((OutputProcessor, "_update_stats_from_finished"), (OutputProcessor, "do_tracing"),
                        (OutputProcessor, "abort_requests"), (AsyncLLM, "add_request"),
                        (LLMEngine, "add_request")):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    monkeypatch.setattr(capture, "active", 1)
    assert vllm_hook.install()
    yield OutputProcessor(None, log_stats=True)
    vllm_hook.uninstall()


def add(op: Any, ext: str, body: bytes | None = BODY, n: int = 1) -> list[str]:
    """A request added as vLLM's AsyncLLM adds it (the hook notes it first); its internal ids (one per sample)."""
    token = vllm_hook.MESSAGES.set(iter([body]))
    try:
        vllm_hook._remember(ext, {})
    finally:
        vllm_hook.MESSAGES.reset(token)
    request = EngineCoreRequest(request_id=f"in-{ext}", prompt_token_ids=[1, 2, 3], mm_features=None,
                                sampling_params=SamplingParams(n=n, max_tokens=4, detokenize=False),
                                pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None,
                                data_parallel_rank=None, external_req_id=ext)
    if n == 1:
        op.add_request(request, None)
        return [request.request_id]
    parent, ids = ParentRequest(request), []
    for index in range(n):
        child_id, params = parent.get_child_info(index)
        child = copy(request)
        child.request_id, child.sampling_params = child_id, params
        op.add_request(child, None, parent, index)
        ids.append(child_id)
    return ids


def finish(op: Any, internal_id: str) -> Any:
    """The engine's last output for a request: what the hook attached to its finished stats."""
    it = IterationStats()
    op.process_outputs([EngineCoreOutput(request_id=internal_id, new_token_ids=[7, 8],
                                         finish_reason=FinishReason.LENGTH)], 0.0, it)
    return it


def held() -> tuple[int, int]:
    """Requests noted, and the bytes of the chat bodies held."""
    return len(vllm_hook._ADDED), sum(size for _, size in vllm_hook._BODIES.values())


def test_aborted_requests_let_go_of_what_was_noted(hooked: Any) -> None:
    op = hooked
    for i in range(200):  # 12.8 MB of bodies offered, each aborted as vLLM aborts: by id, internally, or n > 1
        ids = add(op, f"r{i}", n=2 if i % 3 == 2 else 1)
        if i % 3 == 1:
            op.abort_requests(ids, internal=True)
        else:
            op.abort_requests([f"r{i}"], internal=False)
    assert not op.request_states and held() == (0, 0) and vllm_hook._body_bytes == 0


def test_n_samples_share_what_was_noted_until_the_last_one_finishes(hooked: Any) -> None:
    op = hooked
    first, second = add(op, "chat-1", n=2)
    early = getattr(finish(op, first).finished_requests[-1], vllm_hook.ATTRIBUTE)
    assert early.child == 0 and early.payload.messages is BODY and held() == (1, len(BODY))
    late = getattr(finish(op, second).finished_requests[-1], vllm_hook.ATTRIBUTE)
    assert late.child == 1 and late.payload.messages is BODY and held() == (0, 0)
    (only,) = add(op, "quiet")
    op.process_outputs([EngineCoreOutput(request_id=only, new_token_ids=[7], finish_reason=FinishReason.STOP)])
    assert held() == (0, 0)  # finished without stats (vLLM's log_stats off): let go all the same


def test_a_request_vllm_refuses_as_it_is_added_is_let_go(hooked: Any) -> None:
    class Engine:
        output_processor = hooked

        def add_request(self, request_id: str, prompt: Any, params: Any, **kwargs: Any) -> None:
            raise ValueError("the prompt is longer than the model takes")

    vllm_hook._wrap_add_request(Engine)
    token = vllm_hook.MESSAGES.set(iter([BODY]))
    try:
        with pytest.raises(ValueError):
            Engine().add_request("too-long", "prompt", None)
    finally:
        vllm_hook.MESSAGES.reset(token)
    assert held() == (0, 0)


def test_what_is_held_of_requests_in_flight_is_bounded_in_count_and_bytes(hooked: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    op = hooked
    monkeypatch.setattr(capture, "MAX_HELD_BYTES", 1 << 20)
    monkeypatch.setattr(vllm_hook, "_MAX_ADDED", 50)
    ids = [add(op, f"live-{i}")[0] for i in range(100)]  # in flight: 6.4 MB of bodies offered against 1 MiB
    count, size = held()
    assert count == 50 and size == vllm_hook._body_bytes <= 1 << 20 and size >= (1 << 20) - len(BODY)
    lost = getattr(finish(op, ids[50]).finished_requests[-1], vllm_hook.ATTRIBUTE)
    assert lost.payload.messages is LOST  # noted, but its body was let go: its row is dropped and counted
    before, bodies = capture.pushed_out, len(vllm_hook._BODIES)
    for i in range(60):  # the 49 left in flight and 10 of these pushed out at the count
        add(op, f"small-{i}", body=b"{}")
    assert held()[0] == 50 and capture.pushed_out - before == bodies + 10  # bodies pushed out with them: counted


@pytest.mark.parametrize(("selectors", "captured"), [(("code",), 1), (("code", "baggage:code"), 2)],
                         ids=["named", "named and its claims allowed"])
def test_a_class_the_client_claims_in_baggage_is_captured_only_where_the_operator_says_so(
        hooked: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, selectors: tuple[str, ...],
        captured: int) -> None:
    """The whole path: the middleware reads the class, the hook notes it as vLLM adds the request and attaches it
    when the request finishes, the stat logger hands the payload and the record to the capture. Of two requests of
    class "code", the client claimed it for one (baggage), the operator's header gave it to the other."""
    op = hooked
    monkeypatch.setenv("SPECSCOPE_CLASS_HEADER", "x-tenant")
    hub = Hub()
    cap = Capture(CaptureConfig(tmp_path, selectors), hub)
    finished: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        rid = dict(scope["headers"])[b"x-request-id"].decode()
        vllm_hook._remember(rid, {})  # vLLM's add_request, in the request's context
        (internal,) = add_noted(op, rid)
        finished.append(finish(op, internal))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    mw = SpecscopeMiddleware(app, hub=hub, argv=[], join=False)
    for rid, claim in (("client", [(b"baggage", b"traffic_class=code")]),
                       ("operator", [(b"x-tenant", b"code"), (b"baggage", b"traffic_class=other")])):
        asyncio.run(mw({"type": "http", "path": "/v1/chat/completions", "method": "POST", "query_string": b"",
                        "headers": [(b"x-request-id", rid.encode()), *claim], "root_path": ""}, _receive, _ignore))
    for it in finished:  # the stat logger's part
        for fin in vllm_stats.finished_requests(it):
            cap.hold(fin.request_id, fin.payload)
            hub.requests.record(fin.request_id, **fin.fields)
    assert hub.requests.wait_idle(5)
    cap.close()
    rows = [json.loads(line) for f in tmp_path.glob("capture-*.jsonl") for line in f.read_text().splitlines()]
    assert cap.status().rows == len(rows) == captured and {r["class"] for r in rows} == {"code"}
    assert held() == (0, 0)


def add_noted(op: Any, ext: str) -> list[str]:
    """A request the hook noted already (as ``add_request`` did), added to vLLM's output processor."""
    request = EngineCoreRequest(request_id=f"in-{ext}", prompt_token_ids=[1, 2, 3], mm_features=None,
                                sampling_params=SamplingParams(max_tokens=4, detokenize=False), pooling_params=None,
                                arrival_time=0.0, lora_request=None, cache_salt=None, data_parallel_rank=None,
                                external_req_id=ext)
    op.add_request(request, None)
    return [request.request_id]


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b'{"messages": [{"role": "user", "content": "hi"}]}',
            "more_body": False}


async def _ignore(message: Any) -> None:
    pass
