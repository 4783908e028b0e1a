"""Traffic classes: what a request's class is, and what a class name may be.

A request's class comes from the header the operator names (``SPECSCOPE_CLASS_HEADER``, which a gateway sets)
where the request has it, else from the W3C ``baggage`` header's ``traffic_class`` member (the client's say), else
the served model name when vLLM serves several (LoRA adapters, ``model:<name>``), or
``specscope.LLM.generate(..., specscope_class=...)`` offline; without one it is its prompt-length bucket. A class
is a metric label: at most :data:`MAX_LENGTH` characters of a safe set, anything else is refused (``None``); a
header cannot claim :data:`OTHER` or a name specscope gives (:data:`RESERVED_PREFIXES`).

At most ``SPECSCOPE_MAX_CLASSES`` classes have rows of their own (counts kept and reported under their names), the
prompt-length buckets among them, which are always kept; the requests of names without a row are counted as
:data:`OTHER`. Names take free rows as they come; once none is free, rows go to the names with the most recent
traffic (heavy hitters, as a merge of snapshots keeps the names with the most requests, :mod:`specscope.state.merge`). A
request counts with a weight that falls by a factor e every :data:`RANK_WINDOWS` windows; at most
:data:`TRACKED_PER_ROW` names a row are tracked (Space-Saving: memory is bounded however many names are invented);
a name without a row takes the row of the least busy name with one when it surely has more than :data:`TAKEOVER`
times that name's traffic, and a request more (hysteresis: names of about equal traffic do not trade rows). A name
that loses its row stops being reported, its counts with it (its exported counters' series end; should it take a
row again, they start from zero, a counter reset), and its later requests go to :data:`OTHER`.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
from collections.abc import Mapping

log = logging.getLogger("specscope")

#: The longest class name kept.
MAX_LENGTH = 48
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/+-]*")
#: Prompt-length buckets (tokens): every request without a class of its own falls in one.
PROMPT_BOUNDS = (256, 2048, 8192)
PROMPT_BUCKETS = ("prompt:<256", "prompt:256-2k", "prompt:2k-8k", "prompt:>=8k")
#: Where the requests of names without a row (past ``SPECSCOPE_MAX_CLASSES``, default :data:`MAX_CLASSES`) are
#: counted; the prompt-length buckets seen count toward the limit, and are always kept.
OTHER = "other"
MAX_CLASSES = 20
#: Prefixes of the classes specscope gives (prompt-length buckets, served models): no header may claim them.
RESERVED_PREFIXES = ("prompt:", "model:")
#: Windows (the hub's ``window_s``) over which a name's traffic is ranked for a row: a request's weight falls by a
#: factor e each time this many windows pass, so a name idle that long keeps a third of its claim.
RANK_WINDOWS = 10
#: Names whose traffic is tracked, per row: those with rows, and the busiest of the others (the rest forgotten).
TRACKED_PER_ROW = 4
#: How many times the traffic of the least busy name with a row another name needs (and a request more) to take it.
TAKEOVER = 3.0
#: The baggage member that names a request's class.
BAGGAGE_KEY = "traffic_class"


def max_classes() -> int:
    """``SPECSCOPE_MAX_CLASSES`` (a positive integer), else :data:`MAX_CLASSES`."""
    raw = os.environ.get("SPECSCOPE_MAX_CLASSES", "").strip()
    if not raw:
        return MAX_CLASSES
    try:
        value = int(raw)
        if value < 1:
            raise ValueError
    except ValueError:
        log.warning("specscope: SPECSCOPE_MAX_CLASSES=%r is not a positive integer; using %d", raw, MAX_CLASSES)
        return MAX_CLASSES
    return value


def clean(value: object) -> str | None:
    """``value`` as a class name, or None where it is empty, too long or not of the safe characters."""
    if not isinstance(value, str):
        return None
    value = value.strip()
    if not value or len(value) > MAX_LENGTH or not _SAFE.fullmatch(value):
        return None
    return value


def claimed(value: object) -> str | None:
    """The class a request's header claims: :func:`clean`, and None for :data:`OTHER` or a reserved prefix."""
    name = clean(value)
    if name is None or name.lower() == OTHER or name.lower().startswith(RESERVED_PREFIXES):
        return None
    return name


def prompt_bucket(prompt_tokens: int | None) -> str | None:
    """The prompt-length bucket of a request of ``prompt_tokens`` (None where that is unknown)."""
    if prompt_tokens is None:
        return None
    return PROMPT_BUCKETS[bisect.bisect_right(PROMPT_BOUNDS, prompt_tokens)]


def from_baggage(header: str) -> str | None:
    """The ``traffic_class`` member of a W3C ``baggage`` header (``k=v;prop,k2=v2``), as :func:`claimed`."""
    from urllib.parse import unquote

    for member in header.split(","):
        key, sep, rest = member.partition("=")
        if sep and key.strip() == BAGGAGE_KEY:
            return claimed(unquote(rest.split(";", 1)[0].strip()))
    return None


def from_headers(headers: Mapping[str, str], named: str | None) -> str | None:
    """A request's class from its headers (lower-case names): the operator's ``named`` one where the request has it
    (the client's baggage cannot override it), else baggage; :func:`claimed` either way."""
    if named and named.lower() in headers:
        return claimed(headers[named.lower()])
    return from_baggage(headers["baggage"]) if "baggage" in headers else None
