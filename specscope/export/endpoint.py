"""specscope's HTTP endpoint: ``/metrics`` for Prometheus and ``/snapshot`` (JSON) for the dashboard.

Binds 127.0.0.1 unless told otherwise. Serves from a daemon thread; every request reads one fresh snapshot.
``/snapshot?since=N`` carries only the request records that became final after ``final_seq`` N.

With an ``api_key`` (``SPECSCOPE_API_KEY`` for the endpoint the plugin starts), ``/metrics`` and ``/snapshot``
answer only requests carrying ``Authorization: Bearer <key>``; the others get 401 and ``WWW-Authenticate: Bearer``.
Without one, anyone who can reach the address reads both (request ids and trace context included).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from specscope.core import auth
from specscope.core.codec import encode
from specscope.core.model import Snapshot
from specscope.export.prometheus_export import SnapshotCollector

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464
#: How long :meth:`Endpoint.close` waits at most for the serving loop to notice (the standard library's 0.5 s made
#: every stop half a second long); an idle loop wakes this often, which costs nothing measurable.
POLL_S = 0.1


class EndpointError(RuntimeError):
    """The endpoint cannot start (the message is one line, fit for the user)."""


class Endpoint:
    """A running endpoint; :meth:`close` stops it."""

    def __init__(self, source: Callable[[], Snapshot], host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 api_key: str | None = None) -> None:
        """``api_key``: the bearer token ``/metrics`` and ``/snapshot`` require (none: they are open)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(source))
        handler = type("Handler", (_Handler,), {"registry": registry, "source": staticmethod(source),
                                                 "keys": auth.digests([api_key or ""])})
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            reason = "address in use" if exc.errno == 98 else (exc.strerror or str(exc))
            raise EndpointError(f"cannot listen on {host}:{port}: {reason}") from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": POLL_S},
                                        name="specscope-endpoint", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:9464``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    registry: CollectorRegistry
    source: Callable[[], Snapshot]
    keys: list[bytes]

    def do_GET(self) -> None:  # http.server calls do_<METHOD>
        try:
            self._get()
        except Exception as exc:  # one line to the scraper, no traceback per scrape
            self._send(500, "text/plain; charset=utf-8", f"specscope: {type(exc).__name__}: {exc}\n".encode())

    def _get(self) -> None:
        path, _, query = self.path.partition("?")
        if path in ("/metrics", "/snapshot") and self.keys and not auth.allows(
                self.headers.get("Authorization", ""), self.keys):
            self._send(401, "text/plain; charset=utf-8", b"specscope: send Authorization: Bearer <key>\n",
                       {"WWW-Authenticate": auth.CHALLENGE})
            return
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(200, content_type, encoder(self.registry))
        elif path == "/snapshot":
            since = parse_qs(query).get("since")
            try:
                cursor = int(since[0]) if since else None
            except ValueError:
                self._send(400, "application/json", b'{"error": "since takes a final_seq (an integer)"}')
                return
            self._send(200, "application/json", b"".join(encode(self.source(), cursor)))
        elif path == "/":
            self._send(200, "text/plain; charset=utf-8", b"specscope: /metrics (Prometheus), /snapshot (JSON)\n")
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found\n")

    def _send(self, status: int, content_type: str, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: scrapes are not worth a log line each."""
