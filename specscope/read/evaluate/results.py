"""What ``specscope evaluate`` measured: each :class:`Candidate`'s runs by K (:class:`KRun`, a :class:`Cell` per batch
size), the :class:`Schedule` chosen from them (:mod:`specscope.read.evaluate.choose`), and with ``--gate`` the two
drafts compared class by class (:class:`Gate`, :class:`GateArm`; decided in :mod:`specscope.read.evaluate.gate`),
all held by an :class:`Evaluation`."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from specscope.core.model import ClassCounts

#: n-gram lookup's settings as a candidate.
NGRAM = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}


@dataclass
class Cell:
    """One engine at one batch size: output tokens/s of each round, with speculation and without."""

    plain: list[float] = field(default_factory=list)
    spec: list[float] = field(default_factory=list)
    #: specscope's prediction of this cell made before it was measured (:class:`Forecast`, from the candidate's first
    #: K), and its interval where one was drawn; None for the first K's own cells, which it was made from.
    predicted: float | None = None
    interval: tuple[float, float] | None = None
    #: specscope's estimate from this cell's own windows (against the plain engine's steps in them): how the verdict
    #: explains what was measured here, not how well it predicts.
    explained: float | None = None

    @property
    def ratios(self) -> list[float]:
        """Each round's speculative / plain throughput."""
        return [s / p for s, p in zip(self.spec, self.plain, strict=True) if p > 0]

    @property
    def speedup(self) -> float | None:
        """The median over rounds; None before any."""
        return statistics.median(self.ratios) if self.ratios else None

    @property
    def spread(self) -> tuple[float, float] | None:
        """The lowest and highest round."""
        return (min(self.ratios), max(self.ratios)) if self.ratios else None


@dataclass(frozen=True)
class Forecast:
    """What the live verdict said of every K at one batch size from a candidate's first measured K (its windows and
    the plain engine's steps in them), before any other K was measured."""

    by_k: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    #: Its price of a K = 0 range in vLLM's schedule.
    k0: float

    def at(self, k: int) -> tuple[float, tuple[float, float] | None]:
        """The predicted speedup at K = ``k`` (0: a K = 0 range) and its interval, where one was drawn."""
        if k == 0:
            return self.k0, None
        return self.by_k[k], (self.low[k], self.high[k]) if self.high else None

    def predict(self, cell: Cell, k: int) -> None:
        """Set ``cell``'s prediction at K = ``k`` (before it is measured)."""
        cell.predicted, cell.interval = self.at(k)


class Judged(NamedTuple):
    """A cell predicted before it was measured, and its measurement."""

    k: int
    batch_size: int
    predicted: float
    measured: float
    interval: tuple[float, float] | None


@dataclass
class KRun:
    """A candidate at one K: measured cells by batch size, and the acceptance its measured runs saw."""

    k: int
    cells: dict[int, Cell] = field(default_factory=dict)
    acceptance: float | None = None
    alpha: float | None = None
    per_position: tuple[float, ...] = ()
    #: Each traffic class's counts over the measured runs (the hub's, from the finished requests).
    by_class: dict[str, ClassCounts] = field(default_factory=dict)
    #: specscope's price of a K = 0 range in vLLM's schedule, by batch size (``SpeedupEstimate.k0_speedup``).
    k0_price: dict[int, float] = field(default_factory=dict)


@dataclass
class Choice:
    """What to run at one batch size."""

    batch_size: int
    #: The best K measured there, 0 where none beats plain decoding (remove ``speculative_config``).
    best_k: int
    best_speedup: float
    #: The K for vLLM's schedule: a K = 0 range priced at what it costs (the draft still runs a pass a step).
    k: int
    expected: float
    #: specscope's price of a K = 0 range here; None where it has none, and the schedule keeps the best K measured.
    k0_price: float | None = None


@dataclass
class Schedule:
    """The best K by batch size as vLLM's schedule, and that schedule measured as configured."""

    choices: list[Choice]
    ranges: list[tuple[int, int, int]]
    #: The speculative-config keys to set (one K throughout: ``num_speculative_tokens`` alone); None: run without
    #: speculation (nothing pays at any batch size).
    config: dict[str, Any] | None
    cells: dict[int, Cell] = field(default_factory=dict)
    #: The schedule is this one K throughout: its measurement is that K's.
    same_as_k: int | None = None


@dataclass
class Candidate:
    """A draft model, a head, the target's MTP layers or n-gram lookup, and what was measured of it."""

    name: str
    method: str
    draft: str | None = None
    #: pending, measured, refused (tokenizer mismatch), failed (the engine did not start), or interrupted.
    status: str = "pending"
    note: str | None = None
    tokenizer: dict[str, Any] | None = None
    runs: dict[int, KRun] = field(default_factory=dict)
    schedule: Schedule | None = None
    draft_kv: dict[str, Any] | None = None
    #: The K measured first, and what the verdict predicted from it at each batch size for every other K and the
    #: schedule, before they were measured.
    forecast_k: int | None = None
    forecast: dict[int, Forecast] = field(default_factory=dict)

    @property
    def short(self) -> str:
        """Its name without the directories (for labels)."""
        return Path(self.name).name or self.name

    def config(self, k: int) -> dict[str, Any]:
        """Its ``speculative_config`` at K = ``k``."""
        if self.method == "ngram":
            base: dict[str, Any] = dict(NGRAM)
        elif self.draft is None:
            base = {"method": self.method}
        else:
            base = {"method": self.method, "model": self.draft}
        return {**base, "num_speculative_tokens": k}

    def cross_k(self) -> list[Judged]:
        """Every measured cell that was predicted before it was measured (the schedule's as K = -1)."""
        cells = [(k, b, cell) for k, run in sorted(self.runs.items()) for b, cell in sorted(run.cells.items())]
        if self.schedule is not None and self.schedule.same_as_k is None:
            cells += [(-1, b, cell) for b, cell in sorted(self.schedule.cells.items())]
        return [Judged(k, b, cell.predicted, measured, cell.interval) for k, b, cell in cells
                if cell.predicted is not None and (measured := cell.speedup) is not None]

    def best(self, b: int) -> tuple[int, float] | None:
        """The K measured fastest at batch ``b`` and its speedup; None where nothing was measured there."""
        found = [(x, -k) for k, run in self.runs.items() if b in run.cells and (x := run.cells[b].speedup) is not None]
        if not found:
            return None
        speedup, k = max(found)
        return -k, speedup


@dataclass
class GateArm:
    """One draft as ``--gate`` measured it, at the gate's K: by batch size and traffic class a :class:`Cell` (each
    round's plain and speculative tokens/s, on that class's prompts alone, the same prompts for both drafts in the
    same round), and by class the acceptance over its requests with its interval."""

    candidate: Candidate
    #: batch size -> class -> the rounds.
    cells: dict[int, dict[str, Cell]] = field(default_factory=dict)
    #: class -> the speculative engine's counts of that class's finished requests.
    acceptance: dict[str, ClassCounts] = field(default_factory=dict)
    #: class -> the acceptance's interval (:func:`specscope.read.evaluate.gate.acceptance_interval`).
    acceptance_interval: dict[str, tuple[float, float]] = field(default_factory=dict)


@dataclass
class Gate:
    """What ``specscope evaluate --gate`` compares: a candidate draft against the incumbent, on the same held-out
    traffic, class by class, with the shares that weigh the classes and the margin no class may lose."""

    k: int
    batch_sizes: list[int]
    candidate: GateArm
    incumbent: GateArm
    #: Each class's share of the traffic's output tokens (they sum to 1 over the classes measured).
    shares: dict[str, float]
    #: Where the shares came from (the prompts file, or a live snapshot's URL).
    shares_source: str = "prompts file"
    #: The share of the live traffic's output tokens in the classes the file holds (None: shares from the file).
    coverage: float | None = None
    #: The largest loss of a class's speedup, as a fraction of the incumbent's, that the gate allows.
    margin: float = 0.05
    #: The class the candidate is meant to improve, and how it was named.
    weak: str | None = None
    weak_basis: str = ""
    confidence: float = 0.95


@dataclass
class Evaluation:
    """Everything measured, in the order it was."""

    target: str
    settings: dict[str, Any]
    candidates: list[Candidate]
    prompts: dict[str, Any] = field(default_factory=dict)
    partial: bool = False
    note: str | None = None
    seconds: float = 0.0
    #: With ``--gate``: the two drafts compared (``candidates`` then holds them, candidate first).
    gate: Gate | None = None


def ran_text(p: dict[str, Any]) -> str:
    """How many distinct prompts the windows ran, and of which classes: what the numbers are about."""
    if "ran" not in p:
        return "no window ran"
    return (f"{p['ran']} distinct prompts run (" + ", ".join(f"{k} {v}" for k, v in p["classes_ran"].items())
            + ")")
