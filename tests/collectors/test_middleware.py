"""The ASGI middleware against apps that answer like vLLM's server (the real server: tests/engine)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from specscope.collectors.middleware import SpecscopeMiddleware
from specscope.hub import Hub

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


def call(mw: SpecscopeMiddleware, path: str, method: str = "POST") -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(m: Any) -> None:
        sent.append(m)

    asyncio.run(mw({"type": "http", "path": path, "method": method, "headers": []}, receive, send))
    return sent


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
    hub.record_request("cmpl-1-0", e2e_s=0.5, generation_tokens=9)  # what the stat logger saw
    body = completion("cmpl-1")
    mw = SpecscopeMiddleware(app_sending([body[:20], body[20:]], b"application/json"), hub=hub)
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
    mw = SpecscopeMiddleware(app_sending(chunks, b"text/event-stream; charset=utf-8"), hub=hub)
    call(mw, "/v1/chat/completions")
    (rec,) = hub.snapshot().requests
    assert rec.request_id == "chatcmpl-9"
    assert (rec.prompt_tokens, rec.generation_tokens, rec.accepted_tokens) == (3, 5, 6)


def test_errors_other_paths_and_garbage_are_passed_through_unrecorded() -> None:
    hub = Hub()
    call(SpecscopeMiddleware(app_sending([completion("x")], b"application/json", 400), hub=hub), "/v1/completions")
    call(SpecscopeMiddleware(app_sending([completion("y")], b"application/json"), hub=hub), "/v1/embeddings")
    sent = call(SpecscopeMiddleware(app_sending([b"{not json"], b"application/json"), hub=hub), "/v1/completions")
    assert sent[-1]["body"] == b"{not json"
    snap = hub.snapshot()
    assert snap.requests == ()
    assert dict(snap.health.errors) == {"middleware": 1}


def test_snapshot_route_serves_json_without_calling_the_app() -> None:
    hub = Hub()
    hub.record_request("r", e2e_s=1.0)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the app must not see /specscope/snapshot")

    sent = call(SpecscopeMiddleware(app, hub=hub), "/specscope/snapshot", method="GET")
    assert sent[0]["status"] == 200
    data = json.loads(sent[1]["body"])
    assert data["requests"][0]["request_id"] == "r"
