"""API keys: checking a bearer token (the endpoints), which hosts count as this machine, the one opener every
client request goes through (:func:`read_url`), which keeps the key from another host on a redirect, and the
client's policy: the ``--api-key`` options (:func:`add_key_arguments`) and which URLs the key goes to
(:func:`key_headers`).

The check hashes both sides and compares the digests with :func:`hmac.compare_digest`, so its time depends
neither on where a wrong token differs nor on its length. Keys are never logged.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import ipaddress
import os
import sys
import urllib.request
from collections.abc import Iterable, Sequence
from http.client import HTTPMessage
from typing import IO
from urllib.parse import urlsplit

from specscope.core.bad_input import UsageError

#: What a 401 carries (RFC 6750), so a client knows to send ``Authorization: Bearer <key>``.
CHALLENGE = 'Bearer realm="specscope"'
#: Request headers that carry a credential (urllib adds ``Proxy-Authorization`` for a proxy URL with a password):
#: a redirect keeps them only to the same scheme, host and port.
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization"})
_DEFAULT_PORTS = {"http": 80, "https": 443}
#: Why a client did not send its key to a URL (said where such a URL answers 401).
KEY_WITHHELD = "the API key goes only to loopback hosts and to those named with --api-key-host"


def digests(keys: Iterable[str]) -> list[bytes]:
    """The keys as :func:`allows` wants them (empty keys dropped)."""
    return [hashlib.sha256(k.encode()).digest() for k in keys if k]


def allows(authorization: str, keys: Sequence[bytes]) -> bool:
    """Whether an ``Authorization`` header value carries one of the keys (``digests``) as a bearer token."""
    scheme, _, token = authorization.partition(" ")
    digest = hashlib.sha256(token.strip().encode("utf-8", "replace")).digest()
    found = False
    for key in keys:  # every key is compared, found or not
        found |= hmac.compare_digest(digest, key)
    return scheme.lower() == "bearer" and found


def is_loopback(host: str) -> bool:
    """``localhost``, ``*.localhost``, 127.0.0.0/8 or ::1 (names are not resolved)."""
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def _origin(url: str) -> tuple[str, str, int | None] | None:
    """``(scheme, host, port)`` of a URL, the port defaulted; None where it cannot be read."""
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        return scheme, parts.hostname or "", parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:
        return None


class _SameOriginCredentials(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, less the credential headers on one to another scheme, host or port (urllib's own
    handler copies every header but the content ones, whatever the new URL)."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: HTTPMessage, newurl: str) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        old_origin = _origin(req.full_url)
        if new is not None and (old_origin is None or _origin(new.full_url) != old_origin):
            for name in [k for k in new.headers if k.lower() in CREDENTIAL_HEADERS]:
                new.remove_header(name)
        return new


_opener = urllib.request.build_opener(_SameOriginCredentials)


def read_url(request: urllib.request.Request, timeout: float) -> bytes:
    """The body of ``request``'s answer, redirects followed, its credentials sent to its own origin only; urllib's
    errors (HTTPError, URLError, OSError) as they come."""
    with _opener.open(request, timeout=timeout) as resp:
        return bytes(resp.read())


def base_url(url: str) -> str:
    """``url`` with ``http://`` where it names no scheme, and no trailing ``/``."""
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url.rstrip("/")


def add_key_arguments(p: argparse.ArgumentParser, where: str) -> None:
    """``--api-key`` and ``--api-key-host`` for the URLs ``where`` names (``top``'s --url, ``report``'s source)."""
    p.add_argument("--api-key", default=os.environ.get("SPECSCOPE_API_KEY") or os.environ.get("VLLM_API_KEY"),
                   metavar="KEY", help=f"bearer token for {where}: the server's --api-key (its /specscope) or the "
                   "endpoint's SPECSCOPE_API_KEY. Sent only to loopback hosts (127.0.0.1, ::1, localhost) and to the "
                   f"hosts named with --api-key-host, never elsewhere (default: $SPECSCOPE_API_KEY, else "
                   "$VLLM_API_KEY)")
    p.add_argument("--api-key-host", action="append", default=[], metavar="HOST[:PORT]",
                   help=f"also send --api-key to {where} on this host (repeatable, or comma-separated). Over plain "
                   "http:// the key crosses the network readable: specscope warns; prefer https:// or an SSH tunnel")


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The header a server started with ``--api-key`` wants."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def url_origin(url: str, flag: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of a target URL (``http://`` where it names no scheme, the port defaulted);
    UsageError, in a sentence, for one that is not a URL."""
    try:
        parts = urlsplit(base_url(url))
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        reason = "its port is not a number from 0 to 65535" if "port" in str(exc).lower() else str(exc)
        raise UsageError(f"{flag} {url!r} is not a URL ({reason[:1].lower() + reason[1:]})") from None
    if not host:
        raise UsageError(f"{flag} {url!r} names no host")
    return parts.scheme, host, port or (443 if parts.scheme == "https" else 80)


def _host_spec(spec: str) -> tuple[str, int | None]:
    """``--api-key-host`` HOST, HOST:PORT, [V6] or [V6]:PORT as ``(host, port or None)``."""
    host, port = spec.strip(), ""
    if host.startswith("["):
        host, _, port = host[1:].partition("]")
        port = port.removeprefix(":")
    elif host.count(":") == 1:
        host, _, port = host.partition(":")
    if not host or (port and not port.isdigit()):
        raise UsageError(f"--api-key-host takes HOST or HOST:PORT, got {spec!r}")
    return host.lower().rstrip("."), int(port) if port else None


def key_headers(urls: Sequence[str], api_key: str | None, key_hosts: Sequence[str],
                flag: str = "--url") -> list[dict[str, str]]:
    """Each URL's headers: the API key where it may go (a loopback host, or one named in ``key_hosts``), nothing
    elsewhere. Warns once on stderr when the key would cross the network over plain http; UsageError for a URL or
    host that is not one."""
    targets = [url_origin(u, flag) for u in urls]
    named = [_host_spec(h) for spec in key_hosts for h in spec.split(",") if h.strip()]
    if named and not api_key:
        raise UsageError("--api-key-host goes with --api-key (or $SPECSCOPE_API_KEY, $VLLM_API_KEY)")
    for host, port in named:
        if not any(host == h and port in (None, p) for _, h, p in targets):
            shown = f"[{host}]" if ":" in host else host
            raise UsageError(f"--api-key-host {shown}{'' if port is None else f':{port}'} matches no {flag} host")
    out, plain = [], []
    for scheme, host, port in targets:
        send = bool(api_key) and (is_loopback(host) or any(host == h and q in (None, port) for h, q in named))
        if send and scheme == "http" and not is_loopback(host) and host not in plain:
            plain.append(host)
        out.append(auth_headers(api_key) if send else {})
    if plain:
        print(f"specscope: warning: the API key goes to {', '.join(plain)} over plain http, readable by anyone on "
              "the way; prefer https:// or an SSH tunnel to 127.0.0.1", file=sys.stderr)
    return out
