"""Render the benchmark figures README.md and docs/*.md quote from benchmarks/results/*.json, or check them.

In the markdown a figure is written between markers: ``<!-- fig record.ratio -->0.145x<!-- /fig -->``. FIGURES
names each figure's results file and how its text is made from it. ``python scripts/figures.py`` rewrites the
marked spans; ``--check`` changes nothing and exits 1 naming each span whose text differs from its rendering.
An unknown figure, a missing results file or key, or a figure no document quotes is one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

def documents(root: Path) -> list[str]:
    """The documents figures may be quoted in: README.md and every page under docs/."""
    return ["README.md", *sorted(str(p.relative_to(root)) for p in (root / "docs").glob("*.md"))]

#: The fresh-seed truth runs the docs quote (``bench_truth_user.py --fresh``), as run: each one's figures are named
#: ``<prefix>.<figure>``.
FRESH = {"fresh": "truth_fresh_56479.json", "fresh2": "truth_fresh_282999.json", "fresh3": "truth_fresh_333557.json"}
DASH = "\u2013"  # the docs' range dash
MARK = re.compile(r"<!-- fig ([\w.-]+) -->([^<]*)<!-- /fig -->")


class FigureError(Exception):
    """A figure that cannot be rendered: unknown, or its results file or key missing."""


def num(doc: Any, *keys: str) -> float:
    """The number at ``keys`` in a results document."""
    for key in keys:
        doc = doc[key]
    if not isinstance(doc, int | float):
        raise KeyError("/".join(keys))
    return float(doc)


def times(v: float, digits: int = 2) -> str:
    """A ratio as the docs write it: 1.709 -> "1.71x"."""
    return f"{v:.{digits}f}x"


def span(values: list[float], fmt: Callable[[float], str]) -> str:
    """The range of ``values`` as "lo-hi" with an en dash (one value where both ends round alike)."""
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo.rstrip('x%')}{DASH}{hi}"


def pct(v: float, digits: int = 0) -> str:
    """A share as a percentage: 0.00158 -> "0.16%" at two digits."""
    return f"{100 * v:.{digits}f}%"


def _demo(d: Any, batch: int) -> str:
    return span([c["measured"] for r in d["runs"] for c in r["cells"] if c["batch"] == batch], times)


def _k0(d: Any, method: str, key: str) -> list[float]:
    return [num(d, "cells", method, b, key) for b in ("1", "4", "16")]


def _held(d: Any, way: str, stat: str) -> str:
    return f"{num(d, 'loop_held_per_poll', way, 'now', stat):.2f} ms"


def _forward_gauge(d: Any, keys: tuple[str, ...], digits: int) -> str:
    return span([num(b, k) for b in d["batches"].values() for k in keys], lambda v: pct(v, digits))


def _evaluate(d: Any, batch: str, schedule: bool = False) -> str:
    best = d["candidates"][0]["schedule"]
    return times(num(best, "measured", batch, "speedup") if schedule else num(best, "best", batch, "best_speedup"))


def _two(d: Any, *keys: str) -> str:
    return f"{num(d, *keys):.2f}"


def _of(d: Any, hit: str, total: str) -> str:
    """"X of N" from the fresh run's summary."""
    return f"{int(num(d, 'summary', hit))} of {int(num(d, 'summary', total))}"


def _misses(d: Any, key: str) -> str:
    """The fresh run's cells that missed ``key`` (within_10pct, inside_interval): "pair K=k batch b (error)"."""
    out = [f"{name} K={c['k']} batch {c['batch']} ({c['error']:+.1%})" for name, p in d["pairs"].items()
           for c in p["cells"] if c.get(key) is False]
    return "; ".join(out) or "none"


def _before_after(d: Any, cls: str) -> str:
    """A class's acceptance in evaluate with the old draft, then the fine-tuned one."""
    return " -> ".join(_two(d, "evaluate", "candidates", c, "acceptance_by_class", cls)
                       for c in ("noise10", "noise10-hard"))


FULL, INCREMENTAL = "plain, full", "plain, incremental (?since=, 20 new records)"
SERVER = "server (64 kept steps, 3 other processes), full"

# name: (results file under benchmarks/results, its text from the parsed file)
FIGURES: dict[str, tuple[str, Callable[[Any], str]]] = {
    "record.ratio": ("record.json", lambda d: times(num(d, "ratio_specscope_over_vllm"), 3)),
    "record.share": ("record.json", lambda d: pct(num(d, "specscope_share_of_a_decode_step"), 2)),
    "record.ratio_16": ("record.json", lambda d: times(num(d, "ratio_at_16_step_batches"))),
    "demo.batch1": ("demo_runs.json", lambda d: _demo(d, 1)),
    "demo.batch16": ("demo_runs.json", lambda d: _demo(d, 16)),
    "demo.runs": ("demo_runs.json", lambda d: str(int(num(d, "summary", "runs")))),
    "k0.draft.measured": ("k0.json", lambda d: ", ".join(times(v) for v in _k0(d, "draft", "k0_measured"))),
    "k0.draft.priced": ("k0.json", lambda d: span(_k0(d, "draft", "k0_predicted"), times)),
    "k0.eagle.measured": ("k0.json", lambda d: span(_k0(d, "eagle", "k0_measured"), times)),
    "k0.models.measured": ("k0.json", lambda d: span(
        [v for m in ("draft", "eagle3", "mtp", "eagle") for v in _k0(d, m, "k0_measured")], times)),
    "k0.eagle.priced": ("k0.json", lambda d: span(_k0(d, "eagle", "k0_predicted"), times)),
    "middleware.full": ("middleware.json", lambda d: _held(d, FULL, "median_cpu_ms")),
    "middleware.full_worst": ("middleware.json", lambda d: _held(d, FULL, "worst_cpu_ms")),
    "middleware.incremental": ("middleware.json", lambda d: _held(d, INCREMENTAL, "median_cpu_ms")),
    "middleware.server": ("middleware.json", lambda d: _held(d, SERVER, "median_cpu_ms")),
    "middleware.server_worst": ("middleware.json", lambda d: _held(d, SERVER, "worst_cpu_ms")),
    "fleet.cpu": ("prometheus_fleet.json", lambda d: times(num(d, "ratio_refresh_cpu"))),
    "fleet.wall": ("prometheus_fleet.json", lambda d: times(num(d, "ratio_refresh_wall"), 1)),
    "evaluate.best1": ("evaluate.json", lambda d: _evaluate(d, "1")),
    "evaluate.best8": ("evaluate.json", lambda d: _evaluate(d, "8")),
    "evaluate.schedule1": ("evaluate.json", lambda d: _evaluate(d, "1", schedule=True)),
    "evaluate.schedule8": ("evaluate.json", lambda d: _evaluate(d, "8", schedule=True)),
    "evaluate.ngram": ("evaluate.json", lambda d: times(num(d["candidates"][1], "score"), 1)),
    "loop.before_hard": ("weak_class_loop.json", lambda d: _two(d, "served_before", "classes", "hard", "acceptance")),
    "loop.before_engine": ("weak_class_loop.json", lambda d: _two(d, "served_before", "engine_acceptance")),
    "loop.rows": ("weak_class_loop.json", lambda d: str(int(num(d, "captured_rows", "rows")))),
    "loop.eval_hard": ("weak_class_loop.json", lambda d: _before_after(d, "hard")),
    "loop.eval_easy": ("weak_class_loop.json", lambda d: _before_after(d, "easy")),
    "loop.after_hard": ("weak_class_loop.json", lambda d: _two(d, "served_after", "classes", "hard", "acceptance")),
    "loop.after_engine": ("weak_class_loop.json", lambda d: _two(d, "served_after", "engine_acceptance")),
    "loop.speedup": ("weak_class_loop.json", lambda d: span(
        [num(d, "evaluate", "candidates", "noise10-hard", "speedup", b) for b in ("1", "8")], times)),
    "loop.minutes": ("weak_class_loop.json", lambda d: f"{num(d, 'minutes'):.0f}"),
    "gauge.ratio_sd": ("forward_gauge.json", lambda d: _forward_gauge(
        d, ("plain_step_over_forward_rel_sd", "spec_step_over_forward_rel_sd"), 1)),
    "gauge.step_sd": ("forward_gauge.json", lambda d: _forward_gauge(d, ("plain_step_rel_sd",), 0)),
    "quiet.anchored": ("truth_user_quiet.json", lambda d: "{} of {}".format(
        int(num(d, "summary", "within_10pct")), int(num(d, "summary", "cells")))),
    "quiet.unanchored": ("truth_user_quiet.json", lambda d: str(int(num(d, "summary", "within_10pct_unanchored")))),
    "r5.at_moment": ("truth_user_r5.json", lambda d: "{} of {}".format(
        int(num(d, "summary", "within_10pct_at_moment")), int(num(d, "summary", "cells")))),
    "r5.as_is": ("truth_user_r5.json", lambda d: str(int(num(d, "summary", "within_10pct")))),
    "r5.exact": ("truth_user_r5.json", lambda d: pct(num(d, "summary", "exact_prediction_within_10pct"), 1)),
}
FIGURES |= {f"{prefix}.{name}": (file, make) for prefix, file in FRESH.items() for name, make in {
    "seed": lambda d: str(int(num(d, "seed"))),
    "commit": lambda d: str(d["commit"])[:7] + (" (dirty)" if d["dirty"] else ""),
    "pairs": lambda d: ", ".join(d["drawn"]),
    "within": lambda d: _of(d, "within_10pct", "cells"),
    "unanchored": lambda d: _of(d, "within_10pct_unanchored", "cells"),
    "inside": lambda d: _of(d, "inside_interval", "with_interval"),
    "calls": lambda d: _of(d, "calls_right", "calls"),
    "wrong_not_paying": lambda d: str(int(num(d, "summary", "wrong_not_paying"))),
    "half": lambda d: _of(d, "half_width_within_15pct", "half_widths"),
    "advice": lambda d: _of(d, "advice_within_5pct", "advice_batches"),
    "rounds_over_5": lambda d: _of(d, "measured_rounds_over_5pct", "cells"),
    "rounds_over_10": lambda d: _of(d, "measured_rounds_over_10pct", "cells"),
    "exact": lambda d: pct(num(d, "summary", "exact_prediction_within_10pct")),
    "outside_10": lambda d: _misses(d, "within_10pct"),
    "outside_interval": lambda d: _misses(d, "inside_interval"),
}.items()}


def render(name: str, results: Path, cache: dict[str, Any]) -> str:
    """The text of figure ``name`` from the results in ``results``."""
    if name not in FIGURES:
        raise FigureError(f"unknown figure {name!r} (scripts/figures.py FIGURES)")
    file, make = FIGURES[name]
    if file not in cache:
        try:
            cache[file] = json.loads((results / file).read_text())
        except (OSError, ValueError) as e:
            raise FigureError(f"figure {name}: cannot read {results / file}: {e}") from e
    try:
        return make(cache[file])
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise FigureError(f"figure {name}: cannot be made from {results / file} ({e!r})") from e


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or with --check, compare) every marked figure; the exit code as the module docstring says."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a figure differs")
    ap.add_argument("--root", type=Path, default=ROOT, help="where README.md and docs/ are")
    ap.add_argument("--results", type=Path, help="the results directory (default ROOT/benchmarks/results)")
    args = ap.parse_args(argv)
    results = args.results or args.root / "benchmarks" / "results"
    cache: dict[str, Any] = {}
    used: set[str] = set()
    changes: list[str] = []
    texts: dict[Path, str] = {}
    try:
        for doc in documents(args.root):
            path = args.root / doc

            def sub(m: re.Match[str], doc: str = doc) -> str:
                name, found = m.group(1), m.group(2)
                used.add(name)
                rendered = render(name, results, cache)
                if found != rendered:
                    changes.append(f"{doc}: figure {name}: found {found!r}, rendered {rendered!r}")
                return f"<!-- fig {name} -->{rendered}<!-- /fig -->"

            texts[path] = MARK.sub(sub, path.read_text())
        if unused := sorted(set(FIGURES) - used):
            raise FigureError(f"figures no document quotes: {', '.join(unused)}")
    except (FigureError, OSError) as e:
        print(f"figures: {e}", file=sys.stderr)
        return 2
    for line in changes:
        print(line, file=sys.stderr if args.check else sys.stdout)
    if args.check:
        return 1 if changes else 0
    for path, text in texts.items():
        if text != path.read_text():
            path.write_text(text)
    return 0

if __name__ == "__main__":
    sys.exit(main())
