"""API keys: checking a bearer token (the endpoints) and which hosts count as this machine (the clients).

The check hashes both sides and compares the digests with :func:`hmac.compare_digest`, so its time depends
neither on where a wrong token differs nor on its length. Keys are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable, Sequence

#: What a 401 carries (RFC 6750), so a client knows to send ``Authorization: Bearer <key>``.
CHALLENGE = 'Bearer realm="specscope"'


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
