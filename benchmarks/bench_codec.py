"""specscope's hand-rolled JSON codec against msgspec's, on a snapshot with 1,000 request records (issue 20).

Today: ``b"".join(codec.encode(snap))`` (the bytes the endpoint and the middleware send) and
``codec.from_dict(json.loads(body))`` (what ``top --url``, the recorder and the shared files read back).
msgspec (a vLLM dependency) encodes and decodes the frozen dataclasses from their type hints:
``msgspec.json.Encoder().encode(snap)`` and ``msgspec.json.Decoder(Snapshot).decode(body)``. Its native document
has the fields only: the derived values today's document carries (acceptance rate, α, KV fragmentation, ...) are
properties, which msgspec does not write. So two more ways are timed: msgspec writing today's document
(``encode(codec.to_dict(snap))``, same bytes) and msgspec reading today's document (it skips the derived keys), and,
for the readers that hold a parsed dict (report, recorder), ``msgspec.convert(d, Snapshot)`` against
``codec.from_dict(d)``.

The snapshot is bench_scrape's hub (1,000 requests) with every optional part filled in (GPU, tokenizer, cost,
baseline with its setup, K schedule, draft memory, per-position acceptance, health, records with trace contexts,
classes and operations), so every type of the model is on the wire. Every way must give back a snapshot equal
(``==``) to the one encoded. Times are medians of alternating rounds (``paired_ns``); ratios are msgspec's time
over today's in the same rounds (below 1: msgspec faster). Run: python benchmarks/bench_codec.py

Decision (results/codec.json): not adopted. msgspec reads today's document 33x faster (1.3 vs 43 ms for 1,000
records) and writes it 2.7x faster, byte for byte, but it would be a second codec, not a shorter one: its native
document drops the derived values every consumer of the endpoint reads, so the hand-rolled writer stays; it writes
an infinite histogram total as null and cannot read it back; it refuses a bool where the model has an int. And no
decode is on a hot path: ``top --url`` fetches only the records new since its last poll, and shared snapshots are
read on a background thread. Reading with msgspec becomes worth its dependency where a reader decodes full
snapshots per poll.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec

from benchmarks._common import paired_ns, write
from specscope.core import codec, model
from specscope.core.model import (
    OUTPUT_POSITION_BOUNDS,
    AllocatorStats,
    CostRatio,
    DraftMemory,
    EngineInfo,
    EngineSetup,
    GpuDevice,
    GpuMemory,
    GpuProcess,
    Health,
    Histogram,
    PositionAcceptance,
    RequestRecord,
    Snapshot,
    StepProfile,
    StepTime,
    TokenizerStatus,
)
from specscope.state.hub import Hub, StepStats

CODEC_PY = Path(codec.__file__)
#: The codec (specscope/core/codec.py): what builds the JSON document and what reads it back.
DECODE_PARTS = ("from_dict", "_from_dict", "_hints", "_value")
ENCODE_PARTS = ("WIRE_VERSION", "to_dict", "_DERIVED", "_names", "_record_dict", "_to_dict", "encode", "_PLACE")


def busy_snapshot(n: int = 1000) -> Snapshot:
    """bench_scrape's hub after ``n`` requests, with every optional part of the snapshot filled in."""
    hub = Hub(max_requests=n)
    setup = EngineSetup(model="target", architecture="LlamaForCausalLM", dtype="bfloat16", device="NVIDIA H100",
                        engine_version="0.32.0", max_num_seqs=256, tensor_parallel_size=1, enforce_eager=False,
                        model_runner="v1")
    hub.set_engine(EngineInfo(model="target", draft_model="draft", method="draft_model", num_speculative_tokens=4,
                              block_size=16, num_blocks=4096, engine_version="0.32.0",
                              k_schedule=((1, 8, 4), (9, 32, 3), (33, 256, 2)), setup=setup,
                              draft_memory=DraftMemory(2_000_000_000, 131_072, 16_384)))
    hub.set_tokenizer(TokenizerStatus("compatible", ("draft adds 2 special tokens",), 0.998))
    hub.set_cost_ratio(CostRatio(0.12, "parameter counts", 8_000_000_000, 1_000_000_000))
    hub.set_baseline(StepProfile(tuple(StepTime(b, 200, 0.011 + b / 10_000, 200 * b, 5, 0.2, 40, 5)
                                       for b in (1, 2, 4, 8, 16)), "baseline", setup))
    for i in range(n):
        hub.record_step(StepStats(running=8, waiting=0, kv_usage=0.4, num_spec_tokens=4, drafts=8, draft_tokens=32,
                                  accepted=20, accepted_per_pos=[7, 6, 4, 3], draft_tokens_per_pos=[8] * 4,
                                  generation_tokens=28, finished=1, finished_tokens=178, prompt_tokens=50))
        hub.requests.record(f"cmpl-{i}", prompt_tokens=50, generation_tokens=128, e2e_s=1.0 + i % 7, ttft_s=0.05,
                           tpot_s=0.007, num_spec_tokens=4, spec_steps=32, draft_tokens=128, accepted_tokens=80,
                           acceptance_histogram=(4, 4, 8, 8, 8))
    hub.wait_idle()
    snap = hub.snapshot()
    assert len(snap.requests) == n
    return dataclasses.replace(
        snap,
        requests=tuple(_filled(r, i) for i, r in enumerate(snap.requests)),
        gpu=GpuMemory("ok", (GpuDevice(0, "NVIDIA H100 80GB HBM3", 71_000_000_000, 85_899_345_920),),
                      (GpuProcess(4242, 0, 70_000_000_000, "self"), GpuProcess(4243, 0, None, "worker")),
                      (AllocatorStats(0, 60_000_000_000, 66_000_000_000, 120_000_000),), "ok"),
        decode_batch=8,
        acceptance_by_output_position=PositionAcceptance(
            OUTPUT_POSITION_BOUNDS, tuple(3200 - 300 * j for j in range(10)), tuple(2000 - 150 * j for j in range(10))),
        health=Health((("scrape", 2), ("gpu", 1)), 3, "ConnectionError: refused"),
        unavailable=("cached_tokens",),
        reported=(("acceptance_rate", 0.625), ("mean_acceptance_length", 3.5)),
    )


def _filled(r: RequestRecord, i: int) -> RequestRecord:
    """A record with the optional fields a server fills in: half chat, a quarter with a trace context and a class."""
    chat = i % 2 == 0
    traced = i % 4 == 0
    return dataclasses.replace(
        r, request_id=f"chatcmpl-{i}" if chat else r.request_id, finish_reason="stop" if i % 3 else "length",
        cached_tokens=16 * (i % 3), preemptions=1 if i % 50 == 0 else 0, queued_s=0.002 + i / 1e6,
        prefill_s=0.03 + i / 1e5, decode_s=0.9 + i / 1e4, engine=0, operation="chat" if chat else "text_completion",
        trace_context=((("traceparent", f"00-{i:032x}-{i:016x}-01"), ("tracestate", "vendor=1"))
                       if traced else None),
        vllm_span=f"00-{i + 7:032x}-{i + 7:016x}-01" if traced else None,
        traffic_class="tenant-a" if traced else None)


def today_encode(snap: Snapshot) -> bytes:
    return b"".join(codec.encode(snap))


def today_decode(body: bytes) -> Snapshot:
    return codec.from_dict(json.loads(body))


def missing_keys(ours: Any, theirs: Any, path: str = "") -> set[str]:
    """Keys of ``ours`` (a parsed document) that ``theirs`` lacks at the same place, as ``Type.key``-like paths."""
    out: set[str] = set()
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for k, v in ours.items():
            if k not in theirs:
                out.add(f"{path}.{k}" if path else k)
            else:
                out |= missing_keys(v, theirs[k], f"{path}.{k}" if path else k)
    elif isinstance(ours, list) and isinstance(theirs, list):
        for a, b in zip(ours, theirs, strict=False):
            out |= missing_keys(a, b, f"{path}[]")
    return out


def codec_lines() -> dict[str, Any]:
    """Lines of the codec (each part from its first decorator to its last line; blank lines not counted)."""
    source = CODEC_PY.read_text()
    lines = source.splitlines()
    spans: dict[str, tuple[int, int]] = {}

    def take(name: str, node: ast.AST) -> None:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])  # type: ignore[attr-defined]
        spans[name] = (first, node.end_lineno or node.lineno)  # type: ignore[attr-defined]

    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            take(node.name, node)
        elif isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            for t in targets:
                if isinstance(t, ast.Name):
                    take(t.id, node)

    def count(names: tuple[str, ...]) -> int:
        return sum(1 for n in names for i in range(spans[n][0] - 1, spans[n][1]) if lines[i].strip())

    return {"decode": count(DECODE_PARTS), "encode": count(ENCODE_PARTS),
            "total": count(DECODE_PARTS) + count(ENCODE_PARTS),
            "parts": {n: count((n,)) for n in DECODE_PARTS + ENCODE_PARTS}}


def hint_obstacles() -> dict[str, list[str]]:
    """Field types of the model's dataclasses that msgspec could not take as they are."""
    dicts, unions = [], []
    for cls in vars(model).values():
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == model.__name__):
            continue
        for name, tp in typing.get_type_hints(cls).items():
            if typing.get_origin(tp) is dict or tp is dict:
                dicts.append(f"{cls.__name__}.{name}: {tp}")
            if typing.get_origin(tp) in (types.UnionType, typing.Union):
                inner = [a for a in typing.get_args(tp) if a is not type(None)]
                if sum(dataclasses.is_dataclass(a) for a in inner) > 1 or len(inner) > 1:
                    unions.append(f"{cls.__name__}.{name}: {tp}")
    return {"dict_fields": dicts, "unions_of_several_types": unions}


def probe(fn: Any) -> str:
    try:
        return f"ok: {fn()!r}"[:160]
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:200]


def main() -> None:
    snap = busy_snapshot()
    enc = msgspec.json.Encoder()
    dec = msgspec.json.Decoder(Snapshot)

    ours = today_encode(snap)
    theirs = enc.encode(snap)
    same_wire = enc.encode(codec.to_dict(snap))
    parsed = json.loads(ours)

    back = today_decode(ours)
    assert back == snap, "today's codec does not round-trip"
    equal = {
        "msgspec_native_round_trip_equals_today": dec.decode(theirs) == back,
        "msgspec_reads_today_document_equals_today": dec.decode(ours) == back,
        "msgspec_convert_dict_equals_today": msgspec.convert(parsed, Snapshot) == back,
    }
    assert all(equal.values()), equal
    equal["msgspec_writes_today_document_byte_identical"] = same_wire == ours

    calls, repeats = 5, 21
    timings: dict[str, dict[str, float]] = {}
    for name, base, alt in (
        ("encode: today vs msgspec native", lambda: today_encode(snap), lambda: enc.encode(snap)),
        ("encode: today vs msgspec writing today's document", lambda: today_encode(snap),
         lambda: enc.encode(codec.to_dict(snap))),
        ("decode: today vs msgspec native", lambda: today_decode(ours), lambda: dec.decode(theirs)),
        ("decode: today vs msgspec reading today's document", lambda: today_decode(ours), lambda: dec.decode(ours)),
        ("dict to snapshot: from_dict vs msgspec.convert", lambda: codec.from_dict(parsed),
         lambda: msgspec.convert(parsed, Snapshot)),
    ):
        a, b, ratio = paired_ns(base, alt, calls, repeats)
        timings[name] = {"today_ms": round(a / 1e6, 3), "msgspec_ms": round(b / 1e6, 3),
                         "msgspec_over_today": round(ratio, 3)}

    # What msgspec does with the model as it is.
    dropped = sorted(missing_keys(parsed, json.loads(theirs)))
    inf_hist = Histogram((1.0,), (1, 2), float("inf"))
    obstacles = {
        "derived_values_not_written": {
            "keys_in_today_document_not_in_msgspec": len(dropped),
            "distinct_names": sorted({k.rsplit(".", 1)[-1] for k in dropped}),
        },
        "infinity": {
            "today_encode": probe(lambda: json.dumps(codec._to_dict(inf_hist))),
            "today_round_trip_equal": probe(
                lambda: codec._from_dict(Histogram, json.loads(json.dumps(codec._to_dict(inf_hist)))) == inf_hist),
            "msgspec_encode": probe(lambda: enc.encode(inf_hist)),
            "msgspec_round_trip": probe(lambda: msgspec.json.decode(enc.encode(inf_hist), type=Histogram)),
        },
        "strictness": {
            "today_bool_as_int": probe(lambda: today_decode(ours.replace(b'"processes":1', b'"processes":true'))
                                       .processes),
            "msgspec_bool_as_int": probe(lambda: dec.decode(ours.replace(b'"processes":1', b'"processes":true'))
                                         .processes),
        },
        **hint_obstacles(),
    }
    write("codec", {
        "requests": len(snap.requests),
        "calls_per_round": calls,
        "rounds": repeats,
        "bytes": {"today": len(ours), "msgspec_native": len(theirs), "msgspec_writing_today_document": len(same_wire)},
        "equal": equal,
        "timings": timings,
        "obstacles": obstacles,
        "codec_lines_in_model_py": codec_lines(),
        "msgspec": msgspec.__version__,
    })


if __name__ == "__main__":
    main()
