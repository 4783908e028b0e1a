"""``specscope compare INCUMBENT CANDIDATE``: the live canary. Two replicas of one target serve the same traffic mix,
the candidate with the draft under trial; their specscope endpoints' finished requests are read as they finish
(``/snapshot?since=``) and compared per class and overall by :mod:`specscope.read.canary`, whose decisions hold at
every refresh. Each refresh evaluates ``SpecscopeCanaryWorse`` (:mod:`specscope.export.alerts.canary`), notifies, and
with ``--metrics-port`` exposes the decisions as gauges for Prometheus' copy of the rule.

Exit status: 0 compared (better or not yet known), 1 ``SpecscopeCanaryWorse`` fires at the last refresh, 2 bad input
(an unreachable replica at the start, replicas serving different targets, bad flags).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from specscope.core.auth import add_key_arguments, key_headers
from specscope.core.bad_input import UsageError, fail
from specscope.core.model import RequestRecord
from specscope.export.alerts import canary as rule
from specscope.export.alerts.evaluate import Alert, Notifier
from specscope.read.canary import (
    ALPHA,
    MAX_CLASSES,
    PLANNED_N,
    REPLICAS,
    Canary,
    Replica,
    Row,
    different_targets,
)
from specscope.read.scrape import EndpointSource, NotAnEndpoint, SourceError
from specscope.verdict.traffic import TrafficSpeedup, traffic_speedup

#: What the method is, in the JSON document and under the table.
METHOD = ("per-request acceptance; predictable plug-in empirical-Bernstein confidence sequences (Waudby-Smith & "
          "Ramdas, JRSS-B 2024), Bonferroni over rows and replicas: valid at every refresh")
#: Seconds between refreshes by default.
INTERVAL_S = 5.0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``compare`` command in ``specscope``'s subcommands (``sub``), with its options."""
    p = sub.add_parser(
        "compare", help="the live canary: a candidate draft's replica against the incumbent's, on the same traffic",
        description="Compare two replicas of one target serving the same traffic mix, the candidate with the draft "
        "under trial: each finished request's acceptance, per traffic class and overall, with confidence sequences "
        "that stay valid however often they are looked at, and the decision (better, worse, not yet known) only "
        "when the evidence is enough. Each replica's own speedup estimate is shown beside. SpecscopeCanaryWorse "
        "fires when the candidate is worse outside the noise.",
        epilog="exit status: 0 compared (better or not yet known), 1 SpecscopeCanaryWorse fires at the last refresh, "
        "2 bad input (an unreachable replica at the start, replicas serving different targets).")
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``compare`` command's options."""
    p.add_argument("incumbent", help="the replica serving the current draft: its specscope endpoint "
                   "(http://127.0.0.1:9464, or a server's /specscope)")
    p.add_argument("candidate", help="the replica serving the draft under trial, same target, same traffic mix")
    p.add_argument("--once", action="store_true", help="read the requests each endpoint holds, print one table and "
                   "exit")
    p.add_argument("--json", action="store_true", help="print JSON (one document per refresh: JSON lines)")
    p.add_argument("--interval", type=float, default=INTERVAL_S, help=f"seconds between refreshes (default "
                   f"{INTERVAL_S:g})")
    p.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (default 0: until "
                   "interrupted)")
    p.add_argument("--until-decided", action="store_true", help="stop once all traffic is decided (better or worse)")
    p.add_argument("--fresh", action="store_true", help="count only requests that finish after the start (default: "
                   "also those the endpoints still hold)")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for a replica (default 2)")
    p.add_argument("--alpha", type=float, default=ALPHA, help=f"the chance that any decision shown is wrong, all rows "
                   f"and refreshes together (default {ALPHA:g})")
    p.add_argument("--classes", type=int, default=MAX_CLASSES, help=f"traffic classes judged; half of alpha is split "
                   f"among them, the other half goes to all traffic (default {MAX_CLASSES})")
    p.add_argument("--alert-min-share", type=float, default=rule.MIN_CLASS_SHARE,
                   help=f"a class this share of the requests or more fires {rule.ALERT} when worse (default "
                        f"{rule.MIN_CLASS_SHARE:g}; all traffic always does)")
    p.add_argument("--alerts-jsonl", metavar="FILE", help=f"append {rule.ALERT}'s transitions to FILE (JSON lines)")
    p.add_argument("--alertmanager", metavar="URL", help=f"send {rule.ALERT} to Alertmanager (API v2) at URL")
    p.add_argument("--metrics-port", type=int, help="serve the decisions as Prometheus gauges on this port "
                   "(deploy/prometheus/specscope-canary-rules.yml alerts on them)")
    p.add_argument("--metrics-host", default="127.0.0.1", help="address the gauges bind (default 127.0.0.1)")
    add_key_arguments(p, "the replicas")


class Comparison:
    """The two replicas and the canary between them, refreshed by :meth:`refresh`."""

    def __init__(self, replicas: tuple[Replica, Replica], alpha: float = ALPHA, max_classes: int = MAX_CLASSES,
                 alerts: rule.CanaryAlerts | None = None, planned_n: int = PLANNED_N) -> None:
        self.replicas = replicas
        self.alpha, self.max_classes, self.planned_n = alpha, max_classes, planned_n
        self.canary = Canary(alpha, max_classes, planned_n)
        self.alerts = alerts or rule.CanaryAlerts()
        self.rows: list[Row] = self.canary.rows()
        self.transitions: list[Alert] = []
        self.notes: list[str] = []
        self.counted = [0, 0]
        self._keys: list[tuple[Any, ...] | None] = [None, None]
        self.started = time.time()
        self._lock = threading.Lock()

    def start(self, fresh: bool = False) -> str | None:
        """The first poll of both: the line of bad input (unreachable, not an endpoint, different targets), or None."""
        got = []
        for i, rep in enumerate(self.replicas):
            try:
                got.append(rep.poll(skip=fresh))
            except NotAnEndpoint as exc:
                return f"{rep.role}: {exc}"
            except SourceError as exc:
                return f"{rep.role} {rep.url} cannot be read: {exc}"
            self._keys[i] = rep.engine_key()
        a, b = (r.snapshot for r in self.replicas)
        assert a is not None and b is not None
        if (line := different_targets(a, b)) is not None:
            return line
        self._feed(got)
        return None

    def refresh(self) -> str | None:
        """Poll both, count their new requests, evaluate the alert; the line of bad input (the replicas now serve
        different targets) or None. A replica that cannot be read keeps its error for the screen."""
        got: list[list[RequestRecord]] = []
        for i, rep in enumerate(self.replicas):
            try:
                new = rep.poll()
            except SourceError:
                got.append([])
                continue
            key = rep.engine_key()
            if self._keys[i] is not None and key != self._keys[i]:
                was, now = self._keys[i], key
                self.notes.append(f"{datetime.now():%H:%M:%S} the {rep.role}'s engine changed ({_engine(was)} -> "
                                  f"{_engine(now)}): the comparison restarted")
                self.canary = Canary(self.alpha, self.max_classes, self.planned_n)
                self.counted = [0, 0]
                got = [[] for _ in got]
            self._keys[i] = key
            got.append(new)
        a, b = (r.snapshot for r in self.replicas)
        if a is not None and b is not None and (line := different_targets(a, b)) is not None:
            return line
        self._feed(got)
        return None

    def _feed(self, got: Sequence[list[RequestRecord]]) -> None:
        for i, records in enumerate(got):
            self.counted[i] += self.canary.add(i, records)
        rows = self.canary.rows()
        transitions = self.alerts.evaluate([r.reading() for r in rows])
        with self._lock:
            self.rows, self.transitions = rows, transitions

    def readings(self) -> tuple[dict[str, str], list[rule.Reading]]:
        """What the gauges show: the replicas' labels and each row's reading."""
        with self._lock:
            rows = self.rows
        return self.labels(), [r.reading() for r in rows]

    def labels(self) -> dict[str, str]:
        """``incumbent`` and ``candidate``: the replicas' URLs."""
        return {rep.role: rep.url for rep in self.replicas}

    @property
    def firing(self) -> bool:
        """Whether the alert fires now."""
        return bool(self.alerts.active())

    def speedups(self) -> list[TrafficSpeedup | None]:
        """Each replica's own traffic-weighted speedup estimate (None where it has none)."""
        return [traffic_speedup(r.snapshot) if r.snapshot is not None else None for r in self.replicas]


def _engine(key: tuple[Any, ...] | None) -> str:
    if key is None:
        return "unknown"
    _, draft, method, k = key
    return f"draft {draft or method or 'none'}" + (f" K={k}" if k is not None else "")


# ----------------------------------------------------------------------------------------------------- rendering
def _iv(lo: float, hi: float, signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"[{f.format(lo)}, {f.format(hi)}]"


def _side(n: int, mean: float | None, iv: tuple[float, float], judged: bool) -> str:
    if mean is None:
        return "n/a"
    return f"{mean:.3f} {_iv(*iv)}" if judged else f"{mean:.3f}"


def _speedup(s: TrafficSpeedup | None) -> str:
    if s is None:
        return "n/a (no estimate measured against a baseline: `specscope calibrate`)"
    iv = f" [{s.interval[0]:.2f}-{s.interval[1]:.2f}]" if s.interval else " (no interval yet)"
    return f"{s.speedup:.2f}x{iv}, {s.call}"


def speedup_dict(s: TrafficSpeedup | None) -> dict[str, Any] | None:
    """A replica's own speedup estimate in the JSON document."""
    if s is None:
        return None
    return {"speedup": s.speedup, "interval": list(s.interval) if s.interval else None, "call": s.call,
            "coverage": s.coverage}


def render_text(c: Comparison) -> str:
    """The table: per class and overall, each replica's mean and interval, the difference and its interval, the
    decision; each replica's own speedup; the alert."""
    a, b = c.replicas
    target = next((r.snapshot.engine.model for r in c.replicas if r.snapshot and r.snapshot.engine.model), None)
    out = [f"specscope compare {datetime.now():%Y-%m-%d %H:%M:%S}  target {target or 'unknown'}",
           f"  incumbent {a.described()}", f"  candidate {b.described()}",
           "per-request acceptance (accepted / drafted draft tokens); the intervals are confidence sequences, valid "
           "at every refresh:", f"every decision shown, at any refresh, is wrong with chance at most {c.alpha:.0%}",
           f"{'class':<20} {'share':>5} {'requests':>11}  {'incumbent':<22} {'candidate':<22} "
           f"{'candidate - incumbent':<26} decision"]
    for r in c.rows:
        judged = r.alpha is not None
        name = "all traffic" if r.traffic_class is None else r.traffic_class
        diff = "n/a" if r.difference is None else (f"{r.difference:+.3f} {_iv(*r.interval, signed=True)}" if judged
                                                  else f"{r.difference:+.3f}")
        decision = r.decision + (" (a replica's acceptance moved during the run)" if r.crossed else "")
        out.append(f"{name[:20]:<20} {r.share:>5.0%} {f'{r.incumbent.requests}/{r.candidate.requests}':>11}  "
                   f"{_side(r.incumbent.requests, r.incumbent.mean, r.incumbent.interval, judged):<22} "
                   f"{_side(r.candidate.requests, r.candidate.mean, r.candidate.interval, judged):<22} "
                   f"{diff:<26} {decision}")
    alphas = f"all traffic at α={c.canary.overall_alpha:.2%}" + (
        f", each of the first {c.max_classes} classes at α={c.canary.class_alpha:.2%}" if c.canary.class_alpha else "")
    out.append(f"  ({alphas}; each replica's mean at half its row's α)")
    s_a, s_b = c.speedups()
    out.append("speedup for this traffic, each replica's own estimate (not a comparison):")
    out.append(f"  incumbent {_speedup(s_a)}")
    out.append(f"  candidate {_speedup(s_b)}")
    for rep in c.replicas:
        if rep.error:
            out.append(f"  {rep.role} unreadable: {rep.error} (its last numbers stand)")
        if rep.missed:
            out.append(f"  {rep.role}: {rep.missed} requests finished unread (more than the endpoint keeps between "
                       "refreshes: refresh more often)")
    out += [f"  {note}" for note in c.notes]
    active = c.alerts.active()
    if active:
        out += [f"alert {rule.ALERT} FIRING: {a.summary}" for a in active]
    else:
        out.append(f"alert {rule.ALERT}: quiet (fires when the candidate is worse for all traffic, or for a class of "
                   f"{c.alerts.min_class_share:.0%} of the requests or more)")
    out += [f"alert {t.rule} {t.state}: {t.summary}" for t in c.transitions if t.state == "resolved"]
    return "\n".join(out)


def render_json(c: Comparison) -> dict[str, Any]:
    """The JSON document (schema: docs/runbook.md, "A draft change on one replica first: the canary")."""
    speedups = c.speedups()
    target = next((r.snapshot.engine.model for r in c.replicas if r.snapshot and r.snapshot.engine.model), None)

    def replica(i: int) -> dict[str, Any]:
        rep = c.replicas[i]
        e = rep.snapshot.engine if rep.snapshot else None
        return {"url": rep.url, "draft_model": e.draft_model if e else None, "method": e.method if e else None,
                "k": e.num_speculative_tokens if e else None, "requests": c.counted[i], "missed": rep.missed,
                "error": rep.error, "speedup": speedup_dict(speedups[i])}

    active = c.alerts.active()
    return {"time": time.time(), "target": target, "alpha": c.alpha, "method": METHOD,
            "overall_alpha": c.canary.overall_alpha, "class_alpha": c.canary.class_alpha,
            "incumbent": replica(0), "candidate": replica(1),
            "decision": c.rows[0].decision, "rows": [r.to_dict() for r in c.rows],
            "alert": {"name": rule.ALERT, "firing": bool(active), "min_class_share": c.alerts.min_class_share,
                      "classes": [dict(a.labels).get("traffic_class") for a in active]},
            "notes": c.notes}


# ------------------------------------------------------------------------------------------------------ command
def _check(args: argparse.Namespace) -> None:
    if args.interval <= 0 or args.timeout <= 0 or args.duration < 0:
        raise UsageError("--interval and --timeout must be positive, --duration 0 or more")
    if not 0 < args.alpha < 1:
        raise UsageError(f"--alpha is a probability between 0 and 1, got {args.alpha:g}")
    if args.classes < 0:
        raise UsageError("--classes must be 0 or more")
    if not 0 <= args.alert_min_share <= 1:
        raise UsageError(f"--alert-min-share is a fraction between 0 and 1, got {args.alert_min_share:g}")
    if args.once and (args.fresh or args.until_decided or args.duration or args.metrics_port is not None):
        raise UsageError("--once reads what the endpoints hold now; --fresh, --until-decided, --duration and "
                         "--metrics-port go with the live view")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise UsageError(f"--metrics-port {args.metrics_port} is not a port number")


def _replicas(args: argparse.Namespace) -> tuple[Replica, Replica]:
    urls = [args.incumbent, args.candidate]
    headers = key_headers(urls, args.api_key, args.api_key_host, "replica")
    reps = [Replica(role, EndpointSource(u, args.timeout, headers=h), key_withheld=bool(args.api_key) and not h)
            for role, u, h in zip(REPLICAS, urls, headers, strict=True)]
    if reps[0].source.url == reps[1].source.url:
        raise UsageError(f"the incumbent and the candidate are the same endpoint ({reps[0].source.url})")
    return reps[0], reps[1]


def _notifiers(args: argparse.Namespace) -> list[Notifier]:
    from specscope.export.alerts.notify import AlertmanagerNotifier, JsonLinesNotifier

    out: list[Notifier] = []
    if args.alerts_jsonl:
        out.append(JsonLinesNotifier(args.alerts_jsonl))
    if args.alertmanager:
        out.append(AlertmanagerNotifier(args.alertmanager))
    return out


def _serve_metrics(c: Comparison, host: str, port: int) -> Any:
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(rule.CanaryCollector(c.readings))
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server


def _print(c: Comparison, as_json: bool) -> None:
    print(json.dumps(render_json(c)) if as_json else render_text(c), flush=True)


def main(args: argparse.Namespace) -> int:
    """Run ``specscope compare``; returns the exit code."""
    try:
        _check(args)
        replicas = _replicas(args)
        alerts = rule.CanaryAlerts(_notifiers(args), args.alert_min_share)
    except (UsageError, ValueError) as exc:
        return fail(exc)
    c = Comparison(replicas, args.alpha, args.classes, alerts)
    alerts.labels = c.labels()
    if (line := c.start(fresh=args.fresh)) is not None:
        return fail(line)
    if args.once:
        if args.json:
            print(json.dumps(render_json(c), indent=1))
        else:
            print(render_text(c))
        return 1 if c.firing else 0
    server = None
    if args.metrics_port is not None:
        try:
            server = _serve_metrics(c, args.metrics_host, args.metrics_port)
        except OSError as exc:
            reason = "address in use" if exc.errno == 98 else (exc.strerror or str(exc))
            return fail(f"cannot listen on {args.metrics_host}:{args.metrics_port}: {reason}")
        print(f"specscope compare: gauges on http://{args.metrics_host}:{server.server_address[1]}/metrics",
              file=sys.stderr, flush=True)
    try:
        return _loop(c, args)
    except KeyboardInterrupt:
        return 1 if c.firing else 0
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


def _loop(c: Comparison, args: argparse.Namespace) -> int:
    end = time.monotonic() + args.duration if args.duration else None
    _print(c, args.json)
    while True:
        if args.until_decided and c.rows[0].decision in (rule.BETTER, rule.WORSE):
            break
        now = time.monotonic()
        if end is not None and now >= end:
            break
        time.sleep(args.interval if end is None else max(0.0, min(args.interval, end - now)))
        if (line := c.refresh()) is not None:
            return fail(line)
        if not args.json:
            print()
        _print(c, args.json)
    return 1 if c.firing else 0
