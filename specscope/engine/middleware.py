"""ASGI middleware for ``vllm serve --middleware specscope.engine.middleware.SpecscopeMiddleware``.

It serves the process's hub as JSON at ``GET /specscope/snapshot`` on the server's own port, behind the server's
``--api-key`` (vLLM's own check guards only ``/v1/...``, and a ``--middleware`` runs before it), and holds vLLM's
event loop only in short turns: the snapshot's assembly (the steps the stat logger kept are added, other
API-server processes' snapshots merged) is one, the head's encoding another, and ``?since=N`` returns only the
request records that became final after ``N`` (the ``final_seq`` a poller has seen; ``specscope top --url`` asks
for it), encoded a few at a time with the loop running between pieces. The assembly stays on the loop: a thread
would still hold the GIL, which Python hands back to a waiting loop only when the thread is done or after its
switch interval (5 ms), and there it held the loop longer (``benchmarks/bench_middleware.py``).
``SPECSCOPE_SNAPSHOT=off`` turns the endpoint off.

Where the stat-logger plugin could hook vLLM's output processor (:mod:`specscope.engine.vllm_hook`), the
plugin's records are complete and the middleware records nothing. Otherwise it reads each completion's
``usage`` and ``metrics.speculative_decoding`` (when streaming: the final usage chunk, sent when the client asks
for ``stream_options.include_usage``) and joins them to the plugin's records. Every message is passed on before
it is looked at, so a response is never delayed; text is never kept.

Each completion request's traffic class is read from its headers (the header named by ``SPECSCOPE_CLASS_HEADER``
where it has it, else the W3C ``baggage`` member ``traffic_class``: the client's own claim, which a capture writes
only where the operator says so) and set for vLLM's ``add_request``, where the hook notes it. While a capture runs,
a chat request's body (up to :data:`MAX_BODY`) is kept as vLLM reads it and handed to the hook as vLLM adds the
request; the middleware lets go of it then, or when the request ends without being added.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from specscope.core import auth, classes
from specscope.core.codec import encode
from specscope.engine import vllm_hook, vllm_stats
from specscope.engine.capture import attached
from specscope.state.hub import Hub, default_hub

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

COMPLETION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
SNAPSHOT_PATH = "/specscope/snapshot"
_CLASS_HEADERS = frozenset({b"baggage"})
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


def _configured_keys(argv: list[str]) -> list[str]:
    """The server's API keys as vLLM reads them: ``--api-key`` (repeatable), else ``VLLM_API_KEY``."""
    keys = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--api-key"]
    keys += [a.split("=", 1)[1] for a in argv if a.startswith("--api-key=")]
    return [k for k in keys or [os.environ.get("VLLM_API_KEY", "")] if k]


class _Guard:
    """The server's own API-key check, found in the app chain below this middleware; else the configured keys."""

    def __init__(self, app: Any, argv: list[str]) -> None:
        self.verify: Callable[[Any], bool] | None = None
        node, seen = app, 0
        while node is not None and seen < 32:  # vLLM's AuthenticationMiddleware, where the server added one
            check = getattr(node, "verify_token", None)
            if callable(check) and hasattr(node, "api_tokens"):
                self.verify = check
                break
            node, seen = getattr(node, "app", None), seen + 1
        self.hashes = auth.digests(_configured_keys(argv))

    @property
    def open(self) -> bool:
        """True when the server has no API key: the endpoint is as open as the server."""
        return self.verify is None and not self.hashes

    def allows(self, scope: Scope) -> bool:
        if self.open:
            return True
        if self.verify is not None:
            from starlette.datastructures import Headers

            return bool(self.verify(Headers(scope=scope)))
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        return auth.allows(header, self.hashes)


class SpecscopeMiddleware:
    """Serves the hub's snapshot behind the server's API key; joins responses where vLLM could not be hooked."""

    def __init__(self, app: ASGIApp, hub: Hub | None = None, argv: list[str] | None = None,
                 join: bool | None = None) -> None:
        """``argv``: the server's command line (its ``--api-key``); ``join``: record responses (default: when
        the plugin could not hook vLLM's output processor)."""
        self.app = app
        self.hub = hub or default_hub()
        self.guard = _Guard(app, sys.argv if argv is None else argv)
        self.serve = os.environ.get("SPECSCOPE_SNAPSHOT", "on").lower() not in ("off", "0", "false", "no")
        self.join = not vllm_hook.installed() if join is None else join
        named = os.environ.get("SPECSCOPE_CLASS_HEADER", "").strip().lower()
        #: The header the operator names for a request's class (e.g. ``x-tenant``), before ``baggage``.
        self.class_header = named.encode("latin-1") if named else None
        if self.join:
            self.hub.requests.expect_parts(2)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path == SNAPSHOT_PATH and self.serve and scope.get("method") == "GET":
            await self._snapshot(scope, send)
            return
        if path not in COMPLETION_PATHS:
            await self.app(scope, receive, send)
            return
        cls, client = self._traffic_class(scope)
        token = vllm_hook.TRAFFIC_CLASS.set(cls)  # the hook notes it as vLLM adds the request, in this context
        claimed = vllm_hook.CLIENT_CLASS.set(client)
        capturing = path == "/v1/chat/completions" and (cap := attached(self.hub)) is not None and cap.running
        body = _Body(receive) if capturing else None  # the messages, for the capture: read on its thread, not here
        noted = vllm_hook.MESSAGES.set(body) if body is not None else None
        if body is not None:
            receive = body.receive
        try:
            if self.join:
                await self._joined(scope, receive, send, cls)
            else:
                await self.app(scope, receive, send)
        finally:
            if body is not None:
                body.release()  # a task vLLM started in this context keeps the context, not the body
            if noted is not None:
                vllm_hook.MESSAGES.reset(noted)
            vllm_hook.CLIENT_CLASS.reset(claimed)
            vllm_hook.TRAFFIC_CLASS.reset(token)

    def _traffic_class(self, scope: Scope) -> tuple[str | None, bool]:
        """The request's class from its headers: the operator's named header, else the ``baggage`` member; and
        whether it is the client's own claim (from baggage)."""
        try:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or ()
                       if k in _CLASS_HEADERS or k == self.class_header}
            named = self.class_header.decode("latin-1") if self.class_header else None
            cls = classes.from_headers(headers, named)
            return cls, cls is not None and (named is None or named not in headers)
        except Exception as exc:
            self.hub.health.count_error("middleware", exc)
            return None, False

    async def _joined(self, scope: Scope, receive: Receive, send: Send, cls: str | None) -> None:
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
                    self.hub.health.count_error("middleware", exc)

        await self.app(scope, receive, watch)
        if failed:
            return
        try:
            body = reader.result()
            if body and body.get("id"):
                self._record(str(body["id"]), body, cls)
        except Exception as exc:
            self.hub.health.count_error("middleware", exc)

    def _record(self, response_id: str, body: dict[str, Any], cls: str | None) -> None:
        # vLLM's engine sees "<id>-0" for the first prompt of a completion, "<id>" for a chat completion.
        rid = next((c for c in (response_id, f"{response_id}-0") if self.hub.requests.has(c)), response_id)
        self.hub.requests.record(rid, **vllm_stats.response_fields(body), traffic_class=cls)
        steps = vllm_stats.per_step_counts((body.get("metrics") or {}).get("speculative_decoding"))
        if steps is not None:
            self.hub.requests.record_positions(*steps)

    async def _snapshot(self, scope: Scope, send: Send) -> None:
        if not self.guard.allows(scope):
            await _respond(send, 401, b'{"error": "Unauthorized"}')
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        try:
            since = int(query["since"][0]) if "since" in query else None
        except ValueError:
            await _respond(send, 400, b'{"error": "since takes a final_seq (an integer)"}')
            return
        try:
            snap = self.hub.snapshot()
            await asyncio.sleep(0)  # the loop runs between the assembly and the head's encoding
            pieces = encode(snap, since)
            first = next(pieces)
        except Exception as exc:
            self.hub.health.count_error("snapshot endpoint", exc)
            await _respond(send, 500, json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]})
        await send({"type": "http.response.body", "body": first, "more_body": True})
        for piece in pieces:
            await asyncio.sleep(0)  # the event loop runs between pieces
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


class _Body:
    """A chat request's body as vLLM reads it (up to :data:`MAX_BODY`: a larger one is let go as it grows past), and
    the iterator of :data:`vllm_hook.MESSAGES`: the body once, as vLLM adds the request (it has read it all by
    then), after which it is let go here."""

    __slots__ = ("_data", "_receive")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._data: bytearray | None = bytearray()

    async def receive(self) -> Message:
        message = await self._receive()
        data = self._data
        if data is not None and message.get("type") == "http.request":
            data += message.get("body", b"")
            if len(data) > MAX_BODY:
                self._data = None
        return message

    def __iter__(self) -> _Body:
        return self

    def __next__(self) -> bytes | None:
        data, self._data = self._data, None
        return bytes(data) if data else None

    def release(self) -> None:
        """Let go of the body (the request is over)."""
        self._data = None


async def _respond(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
