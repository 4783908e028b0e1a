"""``specscope top``: a terminal dashboard over specscope endpoints, vLLM and SGLang servers, or a recording."""

from __future__ import annotations

import argparse
import json
import os
import sys

from specscope.alerts.rules import Thresholds
from specscope.collectors.scrape import EndpointSource, Source, sglang_source, vllm_source
from specscope.tui.state import Target, run_once


class UsageError(ValueError):
    """Bad arguments: one line, exit code 2."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``top`` command's options."""
    p.add_argument("--url", action="append", default=[], metavar="URL",
                   help="a specscope endpoint (http://127.0.0.1:9464, or a server's /specscope)")
    p.add_argument("--vllm", action="append", default=[], metavar="URL", help="an unmodified vLLM server")
    p.add_argument("--sglang", action="append", default=[], metavar="URL", help="an SGLang server (--enable-metrics)")
    p.add_argument("--prometheus", metavar="URL", help="a fleet from Prometheus-compatible storage: every replica "
                   "whose vllm:* series it holds, one query per refresh")
    p.add_argument("--selector", default="", metavar="LABELS",
                   help='with --prometheus: label matchers, e.g. job="vllm",env=~"prod.*"')
    p.add_argument("--replay", metavar="FILE", help="play a recording made with --record")
    p.add_argument("--record", metavar="FILE", help="record every snapshot to FILE (JSON lines)")
    p.add_argument("--record-max-mb", type=float, default=100.0, help="stop recording at this size (default 100)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between polls (default 1)")
    p.add_argument("--window", type=float, default=60.0, help="window length in seconds (default 60)")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for a target (default 2)")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"), metavar="KEY",
                   help="the server's --api-key, for --url on a server's /specscope (default: $VLLM_API_KEY)")
    p.add_argument("--thresholds", help="JSON or YAML file of alert threshold overrides")
    p.add_argument("--baseline", metavar="FILE", help="the target's step times without speculation (specscope "
                   "calibrate): measures c and the K table for engines started without one")
    p.add_argument("--once", action="store_true", help="print one snapshot as text and exit")
    p.add_argument("--json", action="store_true", help="with --once: print it as JSON")


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The header a server started with ``--api-key`` wants."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def sources(args: argparse.Namespace) -> list[Source]:
    """The targets the arguments name; UsageError when there are none or they conflict."""
    out: list[Source] = [EndpointSource(u, args.timeout, headers=auth_headers(args.api_key)) for u in args.url]
    out += [vllm_source(u, args.timeout) for u in args.vllm]
    out += [sglang_source(u, args.timeout) for u in args.sglang]
    if args.selector and not args.prometheus:
        raise UsageError("--selector goes with --prometheus")
    if args.prometheus:
        from specscope.collectors.prometheus_source import PrometheusFleet

        try:
            fleet = PrometheusFleet(args.prometheus, args.selector, args.timeout, max_age=args.interval / 2,
                                    window_s=args.window)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        out += fleet.sources()
    if args.replay and out:
        raise UsageError("--replay plays a recording; it does not mix with --url, --vllm, --sglang or --prometheus")
    if not out and not args.replay:
        raise UsageError("name a target: --url, --vllm, --sglang, --prometheus or --replay FILE (or run `specscope "
                         "demo`)")
    if args.interval <= 0 or args.window <= 0 or args.timeout <= 0 or args.record_max_mb <= 0:
        raise UsageError("--interval, --window, --timeout and --record-max-mb must be positive")
    if args.json and not args.once:
        raise UsageError("--json goes with --once")
    return out


def main(args: argparse.Namespace) -> int:
    """Run ``specscope top``; returns the exit code."""
    from specscope.alerts.rules import RuleConfigError, load_thresholds
    from specscope.diagnostics import load_profile
    from specscope.tui.record import Player, Recorder, ReplaySource

    try:
        srcs = sources(args)
        thresholds = load_thresholds(args.thresholds) if args.thresholds else Thresholds()
        baseline = load_profile(args.baseline) if args.baseline else None
        player = None
        if args.replay:
            player = Player(args.replay)
            srcs = [ReplaySource(player, name) for name in player.targets]
    except (UsageError, RuleConfigError, ValueError) as exc:
        print(f"specscope: error: {exc}", file=sys.stderr)
        return 2
    targets = [Target(s, thresholds, baseline=baseline) for s in srcs]
    if args.once:
        return _once(targets, args, player)
    try:
        recorder = Recorder(args.record, int(args.record_max_mb * (1 << 20))) if args.record else None
    except OSError as exc:
        print(f"specscope: error: cannot write {args.record}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    from specscope.tui.app import TopApp

    app = TopApp(targets, interval=args.interval, window_s=args.window, player=player, recorder=recorder,
                 thresholds=thresholds)
    try:
        app.run()
    finally:
        if recorder is not None:
            recorder.close()
    return 0


def _once(targets: list[Target], args: argparse.Namespace, player: object | None) -> int:
    from specscope.summary import request_table, summary
    from specscope.tui.record import Player

    if isinstance(player, Player):
        while not player.finished:  # play it all, so windows and alerts evolve as they did
            player.step()
            for t in targets:
                t.poll()
                t.evaluate(args.window)
    else:
        run_once(targets)
    failed = [t for t in targets if t.error or t.snapshot is None]
    for t in failed:
        print(f"specscope: {t.name}: {t.error or 'no snapshot'}", file=sys.stderr)
    good = [t for t in targets if t not in failed]
    refused = [t for t in good if args.baseline and t.snapshot and t.snapshot.baseline_problem]
    for t in refused:
        print(f"specscope: error: {t.name}: baseline refused: {t.snapshot.baseline_problem}",  # type: ignore[union-attr]
              file=sys.stderr)
    if refused:
        return 2
    if args.json:
        docs = {t.name: t.windowed(args.window).to_dict() for t in good}  # type: ignore[union-attr]
        print(json.dumps(next(iter(docs.values())) if len(targets) == 1 and docs else docs, indent=1))
    else:
        for t in good:
            snap = t.windowed(args.window)
            assert snap is not None
            alerts = t.evaluate(args.window)
            print(f"== {t.name}")
            print(summary(snap))
            if "requests" not in snap.unavailable and snap.requests:
                print(request_table(snap.requests[-10:]))
            for a in alerts:
                print(f"alert {a.state} {a.rule}: {a.summary}")
            for what in snap.unavailable:
                print(f"n/a from this source: {what}")
    return 1 if failed else 0
