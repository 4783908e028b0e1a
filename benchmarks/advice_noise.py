"""The advice goal's 5% bar beside the measurement's own noise: one K at one batch size, measured twice.

The advice is judged against the best fixed K measured (within 5%). Where it is a schedule, the fresh truth run
(``bench_truth_user.py --fresh``) measures it on an engine of its own, on the same sample-B prompts as the fixed
Ks' cells. Where that schedule runs, at a batch size, a K that was also measured as a fixed K, the two are the same
K served twice, minutes apart: their ratio is what the bar has to allow for before any advice is judged. Read from
the as-run results (no replay); engine-free.

    python benchmarks/advice_noise.py    # writes benchmarks/results/advice_noise.json
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import as_run_results, write
from specscope.verdict import scheduled_k


def rows_of(doc: dict[str, Any], file: str) -> list[dict[str, Any]]:
    """Each batch size where the advice's own engine ran a K that a fixed K's cell measured too."""
    out = []
    for name, pair in doc["pairs"].items():
        advice = pair.get("advice") or {}
        if advice.get("measured_as") != "its own engine":
            continue
        cells = {(c["k"], c["batch"]): c["measured"] for c in pair["cells"]}
        for b, row in advice["by_batch"].items():
            k = scheduled_k(advice["config"], int(b))
            if (k, int(b)) in cells:
                out.append({"file": file, "pair": name, "batch": int(b), "k": k, "advice_engine": row["measured"],
                            "fixed_k_cell": cells[(k, int(b))],
                            "ratio": round(row["measured"] / cells[(k, int(b))], 3)})
    return out


def main() -> None:
    rows = [r for stem, doc in as_run_results("truth_fresh_*.json") for r in rows_of(doc, f"{stem}.json")]
    ratios = sorted(r["ratio"] for r in rows)
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    write("advice_noise", {"what": __doc__.splitlines()[0], "pairs": len(ratios),
                           "median_ratio": round(statistics.median(ratios), 3), "quartiles": [round(q1, 3),
                                                                                             round(q3, 3)],
                           "under_95pct": sum(r < 0.95 for r in ratios), "over_105pct": sum(r > 1.05 for r in ratios),
                           "rows": rows})


if __name__ == "__main__":
    main()
