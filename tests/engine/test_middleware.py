"""The ASGI middleware against apps that answer like vLLM's server (the real server: tests/e2e)."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import json
from pathlib import Path
from typing import Any

import pytest

from specscope.engine.middleware import SpecscopeMiddleware
from specscope.state.hub import Hub, StepStats

SPEC = {
    "mean_acceptance_length": 2.5,
    "draft_acceptance_rate": 0.375,
    "acceptance_histogram": [2, 1, 0, 1, 0],
    "num_spec_steps": 4,
    "num_accepted_draft_tokens": 6,
    "num_draft_tokens": 16,
    "num_spec_tokens": 4,
}


def app_sending(chunks: list[bytes], content_type: bytes, status: int = 200) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type)]})
        for i, c in enumerate(chunks):
            await send({"type": "http.response.body", "body": c, "more_body": i < len(chunks) - 1})

    return app


def call(mw: SpecscopeMiddleware, path: str, method: str = "POST", query: bytes = b"",
         headers: list[tuple[bytes, bytes]] | None = None) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(m: Any) -> None:
        sent.append(m)

    scope = {"type": "http", "path": path, "method": method, "headers": headers or [], "query_string": query,
             "root_path": ""}
    asyncio.run(mw(scope, receive, send))
    return sent


def body(sent: list[dict[str, Any]]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def joining(app: Any, hub: Hub) -> SpecscopeMiddleware:
    """The middleware as it runs where vLLM's output processor could not be hooked: it joins responses."""
    return SpecscopeMiddleware(app, hub=hub, argv=[], join=True)


def completion(rid: str, text: str = "hello") -> bytes:
    return json.dumps(
        {
            "id": rid,
            "object": "text_completion",
            "choices": [{"index": 0, "text": text}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16},
            "metrics": {"time_to_first_token_ms": 12.5, "speculative_decoding": SPEC},
        }
    ).encode()


def test_json_completion_is_recorded_and_joined_with_the_engine_record() -> None:
    hub = Hub()
    hub.requests.record("cmpl-1-0", e2e_s=0.5, generation_tokens=9)  # what the stat logger saw
    body = completion("cmpl-1")
    mw = joining(app_sending([body[:20], body[20:]], b"application/json"), hub)
    sent = call(mw, "/v1/completions")
    assert b"".join(m.get("body", b"") for m in sent) == body  # passed through untouched
    (rec,) = hub.snapshot().requests
    assert rec.request_id == "cmpl-1-0" and rec.e2e_s == 0.5
    assert (rec.prompt_tokens, rec.generation_tokens, rec.ttft_s) == (7, 9, 0.0125)
    assert (rec.spec_steps, rec.draft_tokens, rec.accepted_tokens) == (4, 16, 6)
    assert rec.acceptance_histogram == (2, 1, 0, 1, 0)
    assert rec.acceptance_rate == SPEC["draft_acceptance_rate"]
    assert rec.mean_acceptance_length == SPEC["mean_acceptance_length"]


def test_streaming_final_usage_chunk_split_across_messages() -> None:
    hub = Hub()
    events = [
        b'data: {"id":"chatcmpl-9","choices":[{"delta":{"content":"hi"}}]}\n\n',
        b'data: {"id":"chatcmpl-9","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5},'
        + b'"metrics":{"speculative_decoding":' + json.dumps(SPEC).encode() + b"}}\n\n",
        b"data: [DONE]\n\n",
    ]
    stream = b"".join(events)
    chunks = [stream[i : i + 37] for i in range(0, len(stream), 37)]
    mw = joining(app_sending(chunks, b"text/event-stream; charset=utf-8"), hub)
    call(mw, "/v1/chat/completions")
    (rec,) = hub.snapshot().requests
    assert rec.request_id == "chatcmpl-9"
    assert (rec.prompt_tokens, rec.generation_tokens, rec.accepted_tokens) == (3, 5, 6)


def test_errors_other_paths_and_garbage_are_passed_through_unrecorded() -> None:
    hub = Hub()
    call(joining(app_sending([completion("x")], b"application/json", 400), hub), "/v1/completions")
    call(joining(app_sending([completion("y")], b"application/json"), hub), "/v1/embeddings")
    sent = call(joining(app_sending([b"{not json"], b"application/json"), hub), "/v1/completions")
    assert sent[-1]["body"] == b"{not json"
    snap = hub.snapshot()
    assert snap.requests == ()
    assert dict(snap.health.errors) == {"middleware": 1}


def test_snapshot_route_serves_json_without_calling_the_app() -> None:
    hub = Hub()
    hub.requests.record("r", e2e_s=1.0)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the app must not see /specscope/snapshot")

    sent = call(SpecscopeMiddleware(app, hub=hub, argv=[]), "/specscope/snapshot", method="GET")
    assert sent[0]["status"] == 200
    data = json.loads(body(sent))
    assert data["requests"][0]["request_id"] == "r"


def test_with_the_hook_in_place_completions_pass_untouched_and_unrecorded() -> None:
    hub = Hub()
    sent = call(SpecscopeMiddleware(app_sending([completion("z")], b"application/json"), hub=hub, argv=[],
                                    join=False), "/v1/completions")
    assert body(sent) == completion("z") and hub.snapshot().requests == ()


def test_a_request_s_class_comes_from_the_named_header_else_baggage(monkeypatch: Any) -> None:
    from specscope.engine import vllm_hook

    monkeypatch.setenv("SPECSCOPE_CLASS_HEADER", "X-Tenant")
    seen: list[str | None] = []
    answer = app_sending([completion("c")], b"application/json")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(vllm_hook.TRAFFIC_CLASS.get())  # where vLLM's add_request (and the hook) run
        await answer(scope, receive, send)

    hub = Hub()
    hooked = SpecscopeMiddleware(app, hub=hub, argv=[], join=False)
    call(hooked, "/v1/completions", headers=[(b"baggage", b"user=7,traffic_class=code%2Fpython;ttl=1"),
                                             (b"x-tenant", b"acme")])
    call(hooked, "/v1/completions", headers=[(b"baggage", b"user=7,traffic_class=code%2Fpython;ttl=1")])
    call(hooked, "/v1/chat/completions", headers=[(b"x-tenant", b"acme"), (b"baggage", b"traffic_class=other")])
    call(hooked, "/v1/completions", headers=[(b"x-tenant", b"no spaces allowed")])
    call(hooked, "/v1/completions")
    assert seen == ["acme", "code/python", "acme", None, None] and vllm_hook.TRAFFIC_CLASS.get() is None
    joined = SpecscopeMiddleware(app, hub=hub, argv=[], join=True)  # no hook: the response's part carries it
    call(joined, "/v1/completions", headers=[(b"x-tenant", b"acme")])
    (rec,) = hub.snapshot().requests
    assert rec.traffic_class == "acme" and rec.class_name == "acme"


def guarded_app() -> Any:
    from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"not here"})

    # vLLM's own check, as `vllm serve --api-key secret` puts it below the --middleware classes.
    return AuthenticationMiddleware(app, tokens=["secret"])


def test_the_snapshot_honours_the_servers_api_key() -> None:
    hub = Hub()
    hub.requests.record("r", e2e_s=1.0)
    mw = SpecscopeMiddleware(guarded_app(), hub=hub, argv=[])  # found in the app chain
    assert call(mw, "/specscope/snapshot", "GET")[0]["status"] == 401
    assert call(mw, "/specscope/snapshot", "GET", headers=[(b"authorization", b"Bearer nope")])[0]["status"] == 401
    ok = call(mw, "/specscope/snapshot", "GET", headers=[(b"authorization", b"Bearer secret")])
    assert ok[0]["status"] == 200 and json.loads(body(ok))["requests"][0]["request_id"] == "r"
    assert b"request_id" not in body(call(mw, "/specscope/snapshot", "GET"))  # nothing leaks with the 401


def test_keys_from_the_command_line_or_environment_when_the_chain_has_no_check(monkeypatch: Any) -> None:
    hub = Hub()
    app = app_sending([b"{}"], b"application/json")
    for argv, env in ((["serve", "--api-key", "k1"], None), (["serve", "--api-key=k1"], None), ([], "k1")):
        if env:
            monkeypatch.setenv("VLLM_API_KEY", env)
        mw = SpecscopeMiddleware(app, hub=hub, argv=argv)
        assert call(mw, "/specscope/snapshot", "GET")[0]["status"] == 401, argv
        assert call(mw, "/specscope/snapshot", "GET", headers=[(b"authorization", b"Bearer k1")])[0]["status"] == 200
    monkeypatch.delenv("VLLM_API_KEY")
    assert call(SpecscopeMiddleware(app, hub=hub, argv=[]), "/specscope/snapshot", "GET")[0]["status"] == 200


def test_the_snapshot_can_be_turned_off(monkeypatch: Any) -> None:
    monkeypatch.setenv("SPECSCOPE_SNAPSHOT", "off")
    sent = call(SpecscopeMiddleware(guarded_app().app, hub=Hub(), argv=[]), "/specscope/snapshot", "GET")
    assert sent[0]["status"] == 404  # the server's own answer: specscope serves nothing


def test_since_returns_only_records_final_after_the_cursor() -> None:
    hub = Hub()
    for i in range(30):
        hub.requests.record(f"r{i}", e2e_s=1.0)
    mw = SpecscopeMiddleware(app_sending([], b""), hub=hub, argv=[])
    everything = json.loads(body(call(mw, "/specscope/snapshot", "GET")))
    assert len(everything["requests"]) == 30 and "requests_since" not in everything
    newer = json.loads(body(call(mw, "/specscope/snapshot", "GET", query=b"since=25")))
    assert [r["request_id"] for r in newer["requests"]] == ["r25", "r26", "r27", "r28", "r29"]
    assert newer["requests_since"] == 25 and newer["lifetime"]["requests"] == everything["lifetime"]["requests"]
    assert call(mw, "/specscope/snapshot", "GET", query=b"since=x")[0]["status"] == 400


def test_the_event_loop_runs_between_pieces_of_a_large_snapshot() -> None:
    """1,000 records go out in pieces; a task on the same loop gets to run between them."""
    hub = Hub()
    for i in range(1000):
        hub.requests.record(f"r{i}", prompt_tokens=10, generation_tokens=20, e2e_s=1.0, spec_steps=5,
                           draft_tokens=20, accepted_tokens=10, acceptance_histogram=(1, 1, 1, 1, 1))
    mw = SpecscopeMiddleware(app_sending([], b""), hub=hub, argv=[])
    ticks: list[int] = []
    pieces: list[int] = []

    async def main() -> None:
        done = asyncio.Event()

        async def ticker() -> None:
            while not done.is_set():
                ticks.append(len(pieces))
                await asyncio.sleep(0)

        async def send(m: Any) -> None:
            if m["type"] == "http.response.body":
                pieces.append(len(m.get("body", b"")))

        async def receive() -> dict[str, Any]:
            return {"type": "http.request"}

        task = asyncio.create_task(ticker())
        await mw({"type": "http", "path": "/specscope/snapshot", "method": "GET", "headers": [],
                  "query_string": b""}, receive, send)
        done.set()
        await task

    asyncio.run(main())
    assert len(pieces) > 50  # 16 records a piece
    # The ticker saw the response half-sent: the loop was free between pieces, not held for the whole encode.
    assert len({t for t in ticks if 0 < t < len(pieces)}) > 40


def test_the_event_loop_runs_between_the_assembly_and_the_encoding() -> None:
    """The snapshot's assembly and its head's encoding are separate turns of the loop: a task on the same loop runs
    between the snapshot being assembled and the answer beginning."""
    ticks: list[int] = []
    marks: dict[str, int] = {}

    class Marking(Hub):
        def snapshot(self, window_s: float | None = None) -> Any:
            snap = super().snapshot(window_s)
            marks["assembled"] = len(ticks)
            return snap

    mw = SpecscopeMiddleware(app_sending([], b""), hub=Marking(), argv=[])

    async def main() -> None:
        done = asyncio.Event()

        async def ticker() -> None:
            while not done.is_set():
                ticks.append(1)
                await asyncio.sleep(0)

        async def send(m: Any) -> None:
            marks.setdefault("answered", len(ticks))

        async def receive() -> dict[str, Any]:
            return {"type": "http.request"}

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        await mw({"type": "http", "path": "/specscope/snapshot", "method": "GET", "headers": [],
                  "query_string": b""}, receive, send)
        done.set()
        await task

    asyncio.run(main())
    assert marks["answered"] > marks["assembled"]


def test_the_snapshot_adds_the_steps_kept_by_the_stat_logger() -> None:
    """A snapshot flushes the steps a writer kept: nothing recorded before the poll is missing from it."""
    hub = Hub()

    class Kept:
        def __init__(self) -> None:
            self.steps = [StepStats(running=1, generation_tokens=3, batch=1, decode_s=0.01) for _ in range(3)]

        def flush(self) -> None:
            while self.steps:
                hub.record_step(self.steps.pop())

    kept = Kept()
    hub.add_pending_source(kept.flush)
    data = json.loads(body(call(SpecscopeMiddleware(app_sending([], b""), hub=hub, argv=[]), "/specscope/snapshot",
                                "GET")))
    assert data["lifetime"]["steps"] == 3 and data["lifetime"]["generation_tokens"] == 9


def test_baggage_is_the_client_s_claim_and_the_named_header_the_operator_s(monkeypatch: Any) -> None:
    from specscope.engine import vllm_hook

    monkeypatch.setenv("SPECSCOPE_CLASS_HEADER", "X-Tenant")
    seen: list[tuple[str | None, bool]] = []
    answer = app_sending([completion("c")], b"application/json")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((vllm_hook.TRAFFIC_CLASS.get(), vllm_hook.CLIENT_CLASS.get()))
        await answer(scope, receive, send)

    mw = SpecscopeMiddleware(app, hub=Hub(), argv=[], join=False)
    call(mw, "/v1/completions", headers=[(b"baggage", b"traffic_class=code")])
    call(mw, "/v1/completions", headers=[(b"x-tenant", b"code"), (b"baggage", b"traffic_class=other")])
    call(mw, "/v1/completions", headers=[(b"x-tenant", b"not a class"), (b"baggage", b"traffic_class=other")])
    call(mw, "/v1/completions")
    assert seen == [("code", True), ("code", False), (None, False), (None, False)]
    assert not vllm_hook.CLIENT_CLASS.get()


@pytest.mark.parametrize("added", [True, False], ids=["added", "refused before vLLM added it"])
def test_a_chat_body_is_let_go_once_taken_and_when_its_request_ends(tmp_path: Path, added: bool) -> None:
    """vLLM starts tasks (its output handler) in the context of the request it is adding: that context must not
    keep the request's body alive."""
    from specscope.engine import vllm_hook
    from specscope.engine.capture import Capture, CaptureConfig

    hub = Hub()
    cap = Capture(CaptureConfig(tmp_path, ("code",)), hub)
    big = b'{"messages": [{"role": "user", "content": "' + b"z" * (1 << 20) + b'"}]}'
    chunks = [big[i:i + 65536] for i in range(0, len(big), 65536)]
    kept: list[contextvars.Context] = []
    taken: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        kept.append(contextvars.copy_context())  # what asyncio.create_task keeps
        if added:  # the hook, as vLLM adds the request
            messages = vllm_hook.MESSAGES.get()
            assert messages is not None
            taken.extend((next(messages, None), next(messages, None)))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive() -> dict[str, Any]:
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message: Any) -> None:
        pass

    scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST", "headers": [], "query_string": b"",
             "root_path": ""}
    asyncio.run(SpecscopeMiddleware(app, hub=hub, argv=[], join=False)(scope, receive, send))
    cap.close()
    assert taken == ([big, None] if added else [])  # the body once
    held = kept[0][vllm_hook.MESSAGES]
    assert sum(len(r) for r in gc.get_referents(held) if isinstance(r, (bytes, bytearray))) == 0


def test_the_middleware_path_deployments_named_before_the_layers_still_resolves() -> None:
    """``--middleware`` as vLLM 0.32 resolves it (``vllm/entrypoints/serve/middleware/register.py``: the module
    imported, the name read from it): the README's path before the package was laid out in layers names the same
    class as the one it names now."""
    import importlib

    for path in ("specscope.collectors.middleware.SpecscopeMiddleware",
                 "specscope.engine.middleware.SpecscopeMiddleware"):
        module, name = path.rsplit(".", 1)
        assert getattr(importlib.import_module(module), name) is SpecscopeMiddleware
