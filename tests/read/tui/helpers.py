"""Hubs with known numbers and small HTTP servers that misbehave on purpose."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from specscope.core.model import EngineInfo
from specscope.state.hub import Hub, StepStats


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def busy_hub(clock: Clock, requests: int = 30, accepted_of_4: int = 3, k: int = 4) -> Hub:
    """A hub that has seen ``requests`` finished requests, each accepting ``accepted_of_4`` of K drafts per step."""
    hub = Hub(clock=clock)
    hub.set_engine(EngineInfo(model="tiny-target", draft_model="tiny-draft", method="draft_model",
                              num_speculative_tokens=k, block_size=16, num_blocks=101))
    feed(hub, clock, requests, accepted_of_4, k)
    return hub


def feed(hub: Hub, clock: Clock, requests: int, accepted_of_4: int, k: int = 4, start: int = 0) -> None:
    """Record ``requests`` requests of 10 steps each, one second apart."""
    for i in range(start, start + requests):
        clock.t += 1.0
        per_pos = [1 if j < accepted_of_4 else 0 for j in range(k)]
        for _ in range(10):
            hub.record_step(StepStats(running=2, waiting=1, kv_usage=0.25 + 0.01 * (i % 10), generation_tokens=4,
                                      num_spec_tokens=k, drafts=1, draft_tokens=k, accepted=accepted_of_4,
                                      accepted_per_pos=per_pos, draft_tokens_per_pos=[1] * k))
        acc = accepted_of_4 if i % 7 else 0  # every seventh request accepts nothing: the worst rows
        hub.requests.record(f"req-{i:04d}", prompt_tokens=20 + i, generation_tokens=40, e2e_s=0.5 + i / 100,
                           ttft_s=0.05, finish_reason="length", num_spec_tokens=k, spec_steps=10,
                           draft_tokens=10 * k, accepted_tokens=10 * acc,
                           acceptance_histogram=tuple(10 if j == acc else 0 for j in range(k + 1)))


@contextmanager
def http_server(handler: Any) -> Iterator[str]:
    """Serve ``handler(request_handler)`` for GETs on 127.0.0.1; yields the base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            handler(self)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def reply(req: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str = "text/plain") -> None:
    try:
        req.send_response(status)
        req.send_header("Content-Type", content_type)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)
    except BrokenPipeError:  # the client gave up waiting: that is the point of the slow case
        pass
