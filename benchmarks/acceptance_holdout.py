"""How well the verdict extends acceptance past the positions a run drafted, held out on the fresh runs' own data.

Past the running K the verdict has no measured acceptance: ``acceptance.tokens_per_step`` extends the last drafted
position's rate geometrically with α. Each fresh truth run's predicting snapshots (``truth_fresh_*.snapshot.json``,
one per pair and traffic, drafted at K = 4) hold the rates of positions 1-4. Here position 4 is held out: predicted
from positions 1-3 by the verdict's own extension (``acceptance.extended_last``: position 3's rate times α, α the
maximum-likelihood value of positions 1-3 alone, drafts shorter than three not counted as rejected), and set beside
the rate observed; the ratio, capped at 1.0, is what the verdict extends past the drafted positions by since
2026-12-07 (``acceptance.extension_check``). Engine-free: it reads saved results.

    python benchmarks/acceptance_holdout.py    # writes benchmarks/results/acceptance_holdout.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import RESULTS, write
from specscope.core import acceptance as acc
from specscope.core import codec
from specscope.core.model import SpecCounts
from specscope.verdict.speedup import spec_counts

#: The method families, by the pair's name in a fresh run (benchmarks/fresh.py).
FAMILIES = {"draft": "draft model", "eagle3": "EAGLE-3 head", "ngram": "n-gram lookup"}


def held_out(spec: SpecCounts) -> dict[str, float]:
    """The last drafted position's rate, observed and as the verdict extends it from the positions before it
    (``acceptance.extended_last``, whose ratio, capped at 1.0, the verdict extends past the drafted positions by)."""
    rates, k = spec.per_position, len(spec.per_position)
    predicted = acc.extended_last(spec.accepted_per_pos, spec.drafts, spec.draft_tokens_per_pos) or 0.0
    return {"position": k, "observed": round(rates[-1], 4), "extended": round(predicted, 4),
            "ratio": round(rates[-1] / predicted, 3) if predicted else None}


def main() -> None:
    rows: list[dict[str, Any]] = []
    for path in sorted(RESULTS.glob("truth_fresh_*.snapshot.json")):
        snap = codec.from_dict(json.loads(path.read_text()))
        spec = spec_counts(snap)
        if spec is None or len(spec.per_position) < 3:
            continue
        pair = path.name.removesuffix(".snapshot.json").rsplit("_", 1)[-1]  # e.g. "draft0-chat"
        family = next(f for prefix, f in FAMILIES.items() if pair.startswith(prefix))
        rows.append({"file": path.name, "family": family, **held_out(spec)})
    by_family: dict[str, dict[str, float]] = {}
    for family in FAMILIES.values():
        ratios = [float(r["ratio"]) for r in rows if r["family"] == family and r["ratio"] is not None]
        if ratios:
            by_family[family] = {"pair_traffics": len(ratios), "median_ratio": round(statistics.median(ratios), 3),
                                 "min_ratio": min(ratios), "max_ratio": max(ratios)}
    write("acceptance_holdout", {"what": __doc__.splitlines()[0], "by_family": by_family, "rows": rows})


if __name__ == "__main__":
    main()
