"""Baselines: the same target's step times without speculation, saved, loaded, merged, and checked against the
engine's setup before they are used."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from specscope.core import intervals
from specscope.core.model import (
    EngineSetup,
    Snapshot,
    StepProfile,
    StepTime,
)

#: The most rounds ``specscope calibrate`` times by default: more than the first three only while they disagree
#: (:func:`specscope.engine.measure.measure_step_times`'s ``max_rounds``).
MAX_ROUNDS = 9


def baseline_problem(baseline: StepProfile, setup: EngineSetup | None) -> str | None:
    """Why ``baseline`` cannot be used for an engine of ``setup``; None when it can (or either is unknown)."""
    if baseline.setup is None or setup is None:
        return None
    diff = baseline.setup.differences(setup)
    return f"{baseline.source} was measured on another setup ({'; '.join(diff)})" if diff else None


def with_baseline(snap: Snapshot, baseline: StepProfile) -> Snapshot:
    """``snap`` with ``baseline`` in place of its own (refused, with the reason, when the setups differ)."""
    return replace(snap, baseline=baseline, baseline_problem=baseline_problem(baseline, snap.engine.setup))


def usable_baseline(snap: Snapshot) -> StepProfile | None:
    """The baseline, unless it was measured on another setup."""
    return snap.baseline if snap.baseline is not None and snap.baseline_problem is None else None


def save_profile(profile: StepProfile, path: str | Path) -> None:
    """Write step times and the setup they were measured on as a baseline file (JSON) for :func:`load_profile`."""
    setup = profile.setup or EngineSetup()
    doc: dict[str, Any] = {
        "setup": asdict(setup),
        "step_times": [{"batch_size": t.batch_size, "steps": t.steps, "mean_s": t.mean_s, "context": t.context,
                        "context_slope": t.context_slope, "spread": t.spread, "rounds": t.readings}
                       | ({"forwards": t.forwards, "forward_s": t.forward_s, "forward_tokens": t.forward_tokens}
                          if t.forwards else {}) for t in profile.times]}
    if profile.forward_moments:
        doc["forward_moments"] = list(profile.forward_moments)
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def merge_profiles(profiles: list[StepProfile]) -> StepProfile:
    """One baseline from several calibrations of the same setup (step-weighted means by batch size)."""
    return functools.reduce(intervals.add, profiles) if profiles else StepProfile((), "no calibration")


def load_profile(path: str | Path) -> StepProfile:
    """Read a baseline file; ValueError with one line saying what is wrong."""
    try:
        doc = json.loads(Path(path).read_text())
        times = tuple(StepTime(int(t["batch_size"]), int(t["steps"]), float(t["mean_s"]),
                               context=float(t.get("context", 0.0)), context_slope=float(t.get("context_slope", 0.0)),
                               spread=float(t.get("spread", 0.0)), readings=int(t.get("rounds", 0)),
                               forwards=int(t.get("forwards", 0)),
                               forward_s=float(t.get("forward_s", 0.0)),
                               forward_tokens=float(t.get("forward_tokens", 0.0))) for t in doc["step_times"])
        moments = tuple(float(x) for x in doc.get("forward_moments", ()))
        raw = doc.get("setup") or {}
        setup = EngineSetup(**{k: v for k, v in raw.items() if k in EngineSetup.__dataclass_fields__}) if raw else None
    except OSError as exc:
        raise ValueError(f"cannot read baseline {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is not a specscope baseline (step_times by batch size): {exc}") from None
    if not times or any(t.batch_size < 1 or t.steps < 1 or t.mean_s <= 0 for t in times):
        raise ValueError(f"{path} is not a usable baseline: it needs positive batch sizes, steps and times")
    if any(min(t.context, t.context_slope, t.spread, t.readings, t.forwards, t.forward_s, t.forward_tokens) < 0
           for t in times):
        raise ValueError(f"{path} is not a usable baseline: context, context_slope, spread, rounds and the forward's "
                         "numbers cannot be negative")
    if moments and (len(moments) != 9 or not all(math.isfinite(x) for x in moments)):
        raise ValueError(f"{path} is not a usable baseline: forward_moments must be 9 finite numbers")
    name = setup.model if setup else doc.get("model")
    return StepProfile(times, f"baseline {Path(path).name}" + (f" of {name}" if name else ""), setup, moments)
