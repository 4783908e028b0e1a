"""The one wire format: a :class:`~specscope.core.model.Snapshot` as JSON, and back.

Every writer uses it — the endpoint and the middleware (:func:`encode`, in pieces), the shared files of a
multi-process server, ``top --record`` and ``top --json`` (:func:`to_dict`) — and every reader (``top --url``,
``--replay``, ``specscope report``, the shared files) reads it with :func:`from_dict`. A document is the
dataclasses' fields by name, plus the derived values consumers read without specscope (acceptance rate, α,
fragmentation, ...; recomputed, not read back), and ``wire_version``. A reader refuses a document from a newer
wire version with one line; a document without one (written before versions were) is version 1.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, cast

from specscope.core.model import (
    ClassCounts,
    CostRatio,
    GpuDevice,
    GpuMemory,
    Health,
    Histogram,
    KVCache,
    PositionAcceptance,
    RequestRecord,
    Snapshot,
    SpecCounts,
    StepTime,
    Totals,
    TrafficClass,
)

#: Bumped when a document's meaning changes in a way an older reader would misread (not for added fields, which
#: older readers skip).
WIRE_VERSION = 1


def to_dict(snap: Snapshot) -> dict[str, Any]:
    """A JSON-ready dict: fields, derived values and ``wire_version``."""
    d = cast(dict[str, Any], _to_dict(snap))
    d["wire_version"] = WIRE_VERSION
    return d


def from_dict(d: dict[str, Any]) -> Snapshot:
    """The snapshot a document holds; ValueError (one line) on a malformed one or one from a newer wire version."""
    version = d.get("wire_version", 1) if isinstance(d, dict) else 1
    if not isinstance(version, int) or version > WIRE_VERSION:
        raise ValueError(f"written in wire version {version!r} by a newer specscope; this one reads up to "
                         f"{WIRE_VERSION}: upgrade it")
    try:
        return cast(Snapshot, _from_dict(Snapshot, d))
    except (TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"not a specscope snapshot: {exc}") from None


_DERIVED: dict[type, tuple[str, ...]] = {
    SpecCounts: (
        "acceptance_rate",
        "mean_acceptance_length",
        "per_position",
        "conditional_per_position",
        "alpha",
        "alpha_position0",
    ),
    Totals: ("generation_tokens_per_s", "drafted_tokens_per_s", "accepted_tokens_per_s", "prefix_cache_hit_rate"),
    RequestRecord: ("acceptance_rate", "mean_acceptance_length", "class_name"),
    ClassCounts: ("acceptance_rate", "mean_acceptance_length", "per_position", "alpha"),
    TrafficClass: ("kind",),
    KVCache: ("capacity_tokens", "blocks_used", "token_usage", "fragmentation"),
    GpuDevice: ("used_fraction",),
    GpuMemory: ("available",),
    CostRatio: ("draft_weight_share",),
    StepTime: ("tokens_per_request_step",),
    PositionAcceptance: ("rates",),
    Health: ("error_count",),
    Histogram: ("count",),
    Snapshot: ("uptime_s", "unattributed_draft_tokens"),
}


def _from_dict(cls: type, d: Any) -> Any:
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    return cls(**{k: _value(hints[k], v) for k, v in d.items() if k in names})


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _value(tp: Any, v: Any) -> Any:
    if v is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _value(inner[0], v) if len(inner) == 1 else v
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], x) for x in v)
        return tuple(_value(a, x) for a, x in zip(args, v, strict=True))
    if dataclasses.is_dataclass(tp):
        if not isinstance(v, dict):
            raise TypeError(f"{getattr(tp, '__name__', tp)} must be an object, got {type(v).__name__}")
        return _from_dict(tp, v)  # type: ignore[arg-type]
    if tp is float and isinstance(v, int | float):
        return float(v)
    if tp in (int, float, str, bool) and not isinstance(v, tp):
        raise TypeError(f"expected {tp.__name__}, got {v!r}")
    return v


@functools.cache
def _names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names, then its derived values' (what :func:`to_dict` writes)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.init) + _DERIVED.get(cls, ())


def _record_dict(r: RequestRecord) -> dict[str, Any]:
    """A request record's dict: its fields are scalars but one tuple (the hot path of every snapshot)."""
    d = {name: getattr(r, name) for name in _names(RequestRecord)}
    if r.acceptance_histogram is not None:
        d["acceptance_histogram"] = list(r.acceptance_histogram)
    if r.trace_context is not None:
        d["trace_context"] = [list(pair) for pair in r.trace_context]
    return d


def _to_dict(obj: Any) -> Any:
    if isinstance(obj, str | int | float | bool) or obj is None:
        return obj
    if type(obj) is RequestRecord:
        return _record_dict(obj)
    if isinstance(obj, tuple | list):
        return [_to_dict(x) for x in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {name: _to_dict(getattr(obj, name)) for name in _names(type(obj))}
    return obj


def encode(snap: Snapshot, since: int | None = None, chunk: int = 16) -> Iterator[bytes]:
    """``snap`` as JSON, in pieces a server can send between other work.

    ``since``: only the request records that became final after ``final_seq`` ``since`` (a poller's cursor); the
    document then says ``"requests_since": since``. A snapshot merged from several processes, whose records are
    numbered apart, is always whole. Request records are encoded ``chunk`` at a time, so no piece costs more than
    a fraction of a millisecond whatever the number of records.
    """
    if snap.processes > 1:
        since = None
    records = snap.requests if since is None else tuple(r for r in snap.requests if r.final_seq > since)
    head = to_dict(replace(snap, requests=()))
    head["requests"] = _PLACE
    if since is not None:
        head["requests_since"] = since
    before, after = json.dumps(head, separators=(",", ":")).split(json.dumps(_PLACE), 1)
    yield (before + "[").encode()
    for i in range(0, len(records), chunk):
        part = ",".join(json.dumps(_to_dict(r), separators=(",", ":")) for r in records[i:i + chunk])
        yield (("," if i else "") + part).encode()
    yield ("]" + after).encode()


#: Where the request records go in the encoded head (a string no field can hold).
_PLACE = "\x00specscope-requests\x00"
