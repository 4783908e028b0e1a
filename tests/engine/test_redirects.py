"""The API key on a redirect: kept to the same scheme, host and port, dropped anywhere else (real local servers)."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Callable, Iterator
from http.client import HTTPMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specscope.core import auth, codec
from specscope.core.auth import auth_headers
from specscope.read.scrape import EndpointSource
from specscope.state.hub import Hub

SNAPSHOT = json.dumps(codec.to_dict(Hub().snapshot())).encode()


class Server:
    """A server on 127.0.0.1 that notes each request's path and credentials, and answers ``route(path)``: a URL to
    redirect to (302), else the snapshot."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, str | None]] = []
        self.route: Callable[[str], str | None] = lambda path: None
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.seen.append((self.path, self.headers.get("Authorization"),
                                    self.headers.get("Proxy-Authorization")))
                to = server.route(self.path)
                self.send_response(302 if to else 200)
                if to:
                    self.send_header("Location", to)
                self.send_header("Content-Length", "0" if to else str(len(SNAPSHOT)))
                self.end_headers()
                if not to:
                    self.wfile.write(SNAPSHOT)

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        self.thread = threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def servers() -> Iterator[tuple[Server, Server]]:
    pair = Server(), Server()
    yield pair
    for s in pair:
        s.close()


KEY = {**auth_headers("K"), "Proxy-Authorization": "Basic cHJveHk6c2VjcmV0"}


def test_a_redirect_to_another_port_or_host_does_not_carry_the_key(servers: tuple[Server, Server]) -> None:
    proxy, elsewhere = servers
    proxy.route = lambda path: f"http://127.0.0.1:{elsewhere.port}{path}"
    snap = EndpointSource(f"http://127.0.0.1:{proxy.port}/specscope", headers=KEY).fetch()
    assert snap.engine is not None  # the snapshot came from the other port...
    assert proxy.seen == [("/specscope/snapshot", "Bearer K", KEY["Proxy-Authorization"])]
    assert elsewhere.seen == [("/specscope/snapshot", None, None)]  # ...without the key
    # The same port under another host name.
    proxy.route = lambda path: None if path.startswith("/moved") else f"http://localhost:{proxy.port}/moved{path}"
    proxy.seen.clear()
    EndpointSource(f"http://127.0.0.1:{proxy.port}/specscope", headers=KEY).fetch()
    assert proxy.seen == [("/specscope/snapshot", "Bearer K", KEY["Proxy-Authorization"]),
                          ("/moved/specscope/snapshot", None, None)]


def test_a_redirect_within_the_same_origin_keeps_the_key(servers: tuple[Server, Server]) -> None:
    server, _ = servers
    server.route = lambda path: None if path.startswith("/b") else (
        "/b" + path if path.startswith("/a") else f"http://127.0.0.1:{server.port}/a{path}")
    EndpointSource(f"http://127.0.0.1:{server.port}/specscope", headers=auth_headers("K")).fetch()
    assert [(path, key) for path, key, _ in server.seen] == [
        ("/specscope/snapshot", "Bearer K"), ("/a/specscope/snapshot", "Bearer K"),
        ("/b/a/specscope/snapshot", "Bearer K")]


@pytest.mark.parametrize(("old", "new", "kept"), [
    ("http://gpu-3/x", "https://gpu-3/x", False),  # another scheme
    ("https://gpu-3/x", "https://gpu-3:443/y", True),  # the default port, said
    ("https://gpu-3:8443/x", "https://gpu-3/x", False),
    ("https://GPU-3/x", "https://gpu-3/y", True),
])
def test_the_origin_is_scheme_host_and_port(old: str, new: str, kept: bool) -> None:
    request = urllib.request.Request(old, headers=auth_headers("K"))
    followed = auth._SameOriginCredentials().redirect_request(request, None, 302, "Found", HTTPMessage(), new)
    assert followed is not None and followed.has_header("Authorization") is kept
