"""ASGI middleware for ``vllm serve --middleware specscope.collectors.middleware.SpecscopeMiddleware``.

It reads each completion's ``usage`` and ``metrics.speculative_decoding`` (when streaming: the final usage
chunk, sent when the client asks for ``stream_options.include_usage``) and records them in the process-wide hub,
joined with what the stat-logger plugin recorded for the same request. Every message is passed on before it is
looked at, so the response is never delayed; text is never kept. ``GET /specscope/snapshot`` returns the hub's
snapshot as JSON on the server's own port.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from specscope.collectors import vllm_reader
from specscope.hub import Hub, default_hub

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

COMPLETION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
SNAPSHOT_PATH = "/specscope/snapshot"
#: Non-streaming bodies larger than this are not parsed (their metrics are lost, the response is not).
MAX_BODY = 4 << 20


class _Reader:
    """Collects what is needed from one response: the JSON body, or the SSE line carrying ``usage``."""

    __slots__ = ("buf", "final", "size", "status", "stream")

    def __init__(self) -> None:
        self.status = 0
        self.stream = False
        self.buf = bytearray()
        self.final: dict[str, Any] | None = None
        self.size = 0

    def feed(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            headers = dict(message.get("headers") or [])
            self.stream = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            return
        if message["type"] != "http.response.body" or self.status != 200:
            return
        body = message.get("body", b"")
        self.size += len(body)
        if not self.stream:
            if self.size <= MAX_BODY:
                self.buf += body
            return
        self.buf += body
        *lines, rest = bytes(self.buf).split(b"\n")
        self.buf = bytearray(rest)
        for line in lines:
            if line.startswith(b"data: {") and b'"usage"' in line:
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    self.final = chunk

    def result(self) -> dict[str, Any] | None:
        if self.status != 200:
            return None
        if self.stream:
            return self.final
        if not self.buf or self.size > MAX_BODY:
            return None
        body = json.loads(bytes(self.buf))
        return body if isinstance(body, dict) else None


class SpecscopeMiddleware:
    """Records per-request speculative metrics from vLLM's OpenAI-compatible responses."""

    def __init__(self, app: ASGIApp, hub: Hub | None = None) -> None:
        self.app = app
        self.hub = hub or default_hub()
        self.hub.expect_request_parts(2)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path == SNAPSHOT_PATH and scope.get("method") == "GET":
            await self._snapshot(send)
            return
        if path not in COMPLETION_PATHS:
            await self.app(scope, receive, send)
            return
        reader = _Reader()
        failed = False

        async def watch(message: Message) -> None:
            nonlocal failed
            await send(message)
            if not failed:
                try:
                    reader.feed(message)
                except Exception as exc:
                    failed = True
                    self.hub.count_error("middleware", exc)

        await self.app(scope, receive, watch)
        if failed:
            return
        try:
            body = reader.result()
            if body and body.get("id"):
                self._record(str(body["id"]), body)
        except Exception as exc:
            self.hub.count_error("middleware", exc)

    def _record(self, response_id: str, body: dict[str, Any]) -> None:
        # vLLM's engine sees "<id>-0" for the first prompt of a completion, "<id>" for a chat completion.
        rid = next((c for c in (response_id, f"{response_id}-0") if self.hub.has_request(c)), response_id)
        self.hub.record_request(rid, **vllm_reader.response_fields(body))
        steps = vllm_reader.per_step_counts((body.get("metrics") or {}).get("speculative_decoding"))
        if steps is not None:
            self.hub.record_draft_positions(*steps)

    async def _snapshot(self, send: Send) -> None:
        payload = json.dumps(self.hub.snapshot().to_dict()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": payload})
