"""Thin a ``specscope top --record`` recording to one snapshot per target every few seconds, keeping every
request record (those of a dropped snapshot move to the next kept one), for fixtures and screenshots.

Run by hand: python scripts/thin_recording.py IN.jsonl OUT.jsonl.gz [--every 3]
(the README's dashboard and tests/fixtures/demo-recording.jsonl.gz come from a ``specscope demo --headless
--record`` run thinned so).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any


def thin(lines: list[str], every: float) -> list[str]:
    """The kept lines, in order: each target's first and last snapshot and one every ``every`` seconds."""
    rows = [json.loads(line) for line in lines if line.strip()]
    last_index = {r["target"]: i for i, r in enumerate(rows)}
    kept_at: dict[str, float] = {}
    carried: dict[str, list[Any]] = {}
    out = []
    for i, r in enumerate(rows):
        target, snap = r["target"], r["snapshot"]
        carried.setdefault(target, []).extend(snap.get("requests") or [])
        if target in kept_at and r["t"] - kept_at[target] < every and i != last_index[target]:
            continue
        kept_at[target] = r["t"]
        snap["requests"] = carried.pop(target)
        out.append(json.dumps(r, separators=(",", ":")) + "\n")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source")
    parser.add_argument("out")
    parser.add_argument("--every", type=float, default=3.0, help="seconds between a target's kept snapshots")
    args = parser.parse_args()
    try:
        lines = Path(args.source).read_text(encoding="utf-8").splitlines()
        out = thin(lines, args.every)
    except (OSError, ValueError, KeyError) as exc:
        print(f"thin_recording: {args.source}: {exc}", file=sys.stderr)
        return 2
    opener = gzip.open if args.out.endswith(".gz") else open
    with opener(args.out, "wt", encoding="utf-8") as f:
        f.writelines(out)
    print(f"kept {len(out)} of {len(lines)} snapshots in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
