"""API keys: checking a bearer token (the endpoints), which hosts count as this machine, and the one opener every
client request goes through (:func:`read_url`), which keeps the key from another host on a redirect.

The check hashes both sides and compares the digests with :func:`hmac.compare_digest`, so its time depends
neither on where a wrong token differs nor on its length. Keys are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import urllib.request
from collections.abc import Iterable, Sequence
from http.client import HTTPMessage
from typing import IO
from urllib.parse import urlsplit

#: What a 401 carries (RFC 6750), so a client knows to send ``Authorization: Bearer <key>``.
CHALLENGE = 'Bearer realm="specscope"'
#: Request headers that carry a credential (urllib adds ``Proxy-Authorization`` for a proxy URL with a password):
#: a redirect keeps them only to the same scheme, host and port.
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


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
