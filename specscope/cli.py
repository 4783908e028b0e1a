"""The ``specscope`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from specscope._version import __version__
from specscope.core.bad_input import fail
from specscope.verdict.baseline import MAX_ROUNDS


def _models(args: argparse.Namespace) -> int:
    from specscope import tiny_models

    try:
        paths = tiny_models.build()
    except ImportError as exc:
        print(f"specscope: building the tiny models needs the 'cpu' or 'vllm' extra ({exc.name} missing)",
              file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({k: str(v) for k, v in paths.items()}))
    else:
        for name, path in paths.items():
            print(f"{name:<16} {path}  {tiny_models.MODELS[name]}")
    return 0


class _Parser(argparse.ArgumentParser):
    """Bad input: one clear line on stderr and exit code 2 (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        self.exit(fail(f"{message} (see {self.prog} --help)"))


def _check_export(args: argparse.Namespace) -> int:
    from specscope.export import exports
    from specscope.export.endpoint import Endpoint, EndpointError
    from specscope.export.otel_export import OtelConfigError, resolve_config
    from specscope.state.hub import Hub

    try:
        port, host, otlp = exports.settings_from_env(dict(os.environ))
        port = args.prometheus_port if args.prometheus_port is not None else port
        host = args.prometheus_host or host
        lines = []
        if port is not None:
            key = os.environ.get("SPECSCOPE_API_KEY") or None
            Endpoint(Hub().snapshot, host, port, api_key=key).close()  # the port can be bound
            lines.append(f"prometheus endpoint: http://{host}:{port}/metrics (and /snapshot), "
                         + ("behind SPECSCOPE_API_KEY (Authorization: Bearer)" if key else
                            f"open to anyone who can reach {host} (set SPECSCOPE_API_KEY to require a key)"))
        if otlp or args.otlp or args.otlp_endpoint or args.otlp_protocol:
            c = resolve_config(endpoint=args.otlp_endpoint, protocol=args.otlp_protocol)
            if c.disabled:
                lines.append("otlp: disabled by OTEL_SDK_DISABLED")
            elif otlp == "global":
                lines.append("otlp: through the process's global OpenTelemetry providers (their exporters and "
                             "intervals)")
            else:
                lines.append(f"otlp: {c.protocol} to {c.endpoint} ({len(c.headers)} headers), every "
                             f"{c.export_interval_ms} ms")
    except (exports.ExportConfigError, EndpointError, OtelConfigError) as exc:
        return fail(exc)
    print("\n".join(lines) or "no export configured (set SPECSCOPE_PROMETHEUS_PORT and/or SPECSCOPE_OTLP=1)")
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    from specscope.export.dashboards import render

    sys.stdout.write(render())
    return 0


def _metrics(args: argparse.Namespace) -> int:
    from specscope.export.catalogue import markdown_table

    sys.stdout.write(markdown_table())
    return 0


def _check_tokenizers(args: argparse.Namespace) -> int:
    from specscope.core.tokenizer_check import TokenizerCheckError, compare, render

    try:
        report = compare(args.target, args.draft)
    except TokenizerCheckError as exc:
        return fail(exc)
    print(json.dumps(report.to_dict(), indent=2) if args.json else render(report))
    return 1 if report.verdict == "mismatch" else 0


def _pairs(items: list[str] | None, flag: str) -> list[tuple[str, str]]:
    """``name=value`` options as pairs; ValueError naming ``flag`` for one without ``=``."""
    out = []
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{flag} takes name=value, got {item!r}")
        out.append((key.strip(), value))
    return out


def _thresholds(args: argparse.Namespace) -> Any:
    from specscope.export.alerts.rules import Thresholds, load_thresholds

    t = load_thresholds(args.thresholds) if args.thresholds else Thresholds()
    pairs = {}
    for key, value in _pairs(args.set, "--set"):
        try:
            pairs[key] = float(value)
        except ValueError:
            raise ValueError(f"--set {key}: {value!r} is not a number") from None
    return t.updated(pairs) if pairs else t


def _rules(args: argparse.Namespace) -> int:
    from specscope.export.alerts.prometheus_rules import render
    from specscope.export.alerts.rules import RuleConfigError

    if args.canary:
        from specscope.export.alerts import canary

        if args.vllm or args.thresholds or args.set:
            return fail("--canary renders the canary's rule alone; --vllm, --thresholds and --set do not apply")
        sys.stdout.write(canary.render())
        return 0
    try:
        thresholds = _thresholds(args)
    except (RuleConfigError, ValueError) as exc:
        return fail(exc)
    sys.stdout.write(render(thresholds, vllm_only=args.vllm))
    return 0


def _engine_args(items: list[str] | None) -> dict[str, Any]:
    """``--engine-arg name=value`` options as vllm.LLM arguments (a value is JSON where it parses)."""
    engine: dict[str, Any] = {}
    for key, value in _pairs(items, "--engine-arg"):
        try:
            engine[key] = json.loads(value)
        except ValueError:
            engine[key] = value
    return engine


def _calibrate(args: argparse.Namespace) -> int:
    from specscope.verdict import save_profile

    try:
        sizes = sorted({int(x) for x in args.batch_sizes.split(",")})
        if not sizes or sizes[0] < 1 or args.tokens < 2 or args.max_rounds < 1:
            raise ValueError
    except ValueError:
        return fail("--batch-sizes takes positive integers like 1,8, --tokens at least 2 and --max-rounds at least 1")
    try:
        engine = _engine_args(args.engine_arg)
    except ValueError as exc:
        return fail(exc)
    if engine.get("speculative_config"):
        return fail("the baseline is the target without speculation; drop speculative_config")
    from dataclasses import replace

    from specscope.engine.measure import measure_step_times, stop_engine
    from specscope.engine.wrapper import LLM
    from specscope.read.workload import InputError, load_prompts, prepare

    try:
        # Every prompt is calibrated with --tokens output tokens (its own max_tokens, or a drawn one, is not run).
        prompts = [replace(p, max_tokens=args.tokens) for p in load_prompts(args.prompts)[0]] if args.prompts else None
    except InputError as exc:
        return fail(exc)
    try:
        llm = LLM(args.model, **engine)
    except Exception as exc:
        return fail(f"the engine did not start: {type(exc).__name__}: {exc}")
    workload = None
    if prompts:
        try:
            workload = prepare(prompts, llm.get_tokenizer(), llm.llm_engine.vllm_config.model_config.max_model_len,
                               args.tokens)
        except InputError as exc:
            return fail(exc)
        if not workload.prompts:
            return fail(f"no prompt in {args.prompts} fits max_model_len with --tokens {args.tokens}")
    profile = measure_step_times(llm, sizes, args.tokens, prompts=workload.prompts if workload else None,
                                 max_rounds=args.max_rounds)
    stop_engine(llm)
    save_profile(profile, args.out)
    if workload:
        mean = sum(len(p["prompt_token_ids"]) for p in workload.prompts) / len(workload.prompts)
        print(f"on {len(workload.prompts)} prompts of {args.prompts} (mean {mean:.0f} prompt tokens)")
    for t in profile.times:
        print(f"batch {t.batch_size:>4}: {1e3 * t.mean_s:8.2f} ms per decode step ({t.steps} steps) at "
              f"{t.context:.0f} tokens of context, +{1e6 * t.context_slope:.1f} us per token more; rounds "
              f"{t.spread:.0%} apart")
    worst = max(profile.times, key=lambda t: t.spread)
    if worst.spread > 0.1:
        print(f"this machine's speed moved between rounds ({worst.spread:.0%} apart at batch {worst.batch_size}): "
              "the verdict's intervals widen with it; calibrate on a quieter machine for sharper ones")
    print(f"wrote {args.out} ({profile.source}); pass it as specscope.LLM(..., specscope_baseline=...) or "
          "SPECSCOPE_BASELINE")
    return 0


def _report(args: argparse.Namespace) -> int:
    from specscope.core.auth import KEY_WITHHELD
    from specscope.read.report import ReportError, SourceDown, load, render
    from specscope.verdict import load_profile

    if args.duration < 0 or args.interval <= 0 or args.window <= 0:
        return fail("--duration must be 0 or more, --interval and --window positive")
    from specscope.read.figures import matplotlib_missing

    if missing := matplotlib_missing():
        return fail(missing)
    try:
        baseline = load_profile(args.baseline) if args.baseline else None
        from specscope.core.auth import key_headers

        headers: dict[str, str] = {}
        if args.source.startswith(("http://", "https://")):
            headers = key_headers([args.source], args.api_key, args.api_key_host, "source")[0]
        rep = load(args.source, window_s=args.window, duration_s=args.duration, interval_s=args.interval,
                   baseline=baseline, headers=headers)
    except SourceDown as exc:
        withheld = args.api_key and not headers and str(exc).endswith("HTTP 401")
        print(f"specscope: {args.source}: {exc}" + (f" ({KEY_WITHHELD})" if withheld else ""), file=sys.stderr)
        return 1
    except (ReportError, ValueError) as exc:
        return fail(exc)
    page, figures = render(rep)
    try:
        Path(args.out).write_text(page, encoding="utf-8")
        if args.figures:
            Path(args.figures).mkdir(parents=True, exist_ok=True)
            for name, png in figures.items():
                (Path(args.figures) / f"{name}.png").write_bytes(png)
    except OSError as exc:
        return fail(f"cannot write the report: {exc.strerror or exc}")
    print(f"wrote {args.out} ({len(figures)} plots)")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from specscope.read import evaluate

    try:
        engine = _engine_args(args.engine_arg)
    except ValueError as exc:
        return fail(exc)
    return evaluate.main(args, engine)


def _compare(args: argparse.Namespace) -> int:
    from specscope.read import compare

    return compare.main(args)


def _top(args: argparse.Namespace) -> int:
    from specscope.read import tui

    return tui.main(args)


def _demo(args: argparse.Namespace) -> int:
    from specscope import demo

    return demo.main(args)


def build_parser() -> argparse.ArgumentParser:
    """The ``specscope`` argument parser."""
    parser = _Parser(prog="specscope", description="Observability for speculative decoding in vLLM.")
    parser.add_argument("--version", action="version", version=f"specscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    models = sub.add_parser("models", help="build (or find) the tiny local target and draft models")
    models.add_argument("--json", action="store_true", help="print {name: path} as JSON")
    models.set_defaults(func=_models)
    check = sub.add_parser("check-export", help="validate export settings (SPECSCOPE_*, OTEL_* and these flags)")
    check.add_argument("--prometheus-port", type=int, help="port of the /metrics endpoint")
    check.add_argument("--prometheus-host", help="address to bind (default 127.0.0.1)")
    check.add_argument("--otlp", action="store_true", help="check OTLP export settings too")
    check.add_argument("--otlp-endpoint", help="OTLP endpoint (default: OTEL_EXPORTER_OTLP_ENDPOINT)")
    check.add_argument("--otlp-protocol", help="http/protobuf or grpc (default: OTEL_EXPORTER_OTLP_PROTOCOL)")
    check.set_defaults(func=_check_export)
    dash = sub.add_parser("dashboard", help="print the Grafana dashboard JSON (deploy/grafana/)")
    dash.set_defaults(func=_dashboard)
    metrics = sub.add_parser("metrics", help="print the metric catalogue as a Markdown table (docs/metrics.md)")
    metrics.set_defaults(func=_metrics)
    tok = sub.add_parser(
        "check-tokenizers",
        help="compare a target's and a draft's tokenizers (local files only)",
        description="Compare the tokenizers of a target and a draft model: vocabulary, token ids, special and "
        "added tokens, normalizer/pre-tokenizer/decoder, and the ids of a probe corpus. Local directories or "
        "names already in the local Hugging Face cache; nothing is downloaded.",
        epilog="exit status, as diff(1): 0 identical, compatible (same ids; differences, if any, are cosmetic) or "
        "warning (every shared token keeps its id; added tokens, a padded vocabulary, special tokens or the chat "
        "template differ), 1 mismatch (shared tokens under other ids, probe texts encoding differently, or "
        "configured vocabulary sizes vLLM refuses), 2 trouble (a tokenizer could not be loaded, bad arguments).",
    )
    tok.add_argument("target", help="target model directory or cached model name")
    tok.add_argument("draft", help="draft model directory or cached model name")
    tok.add_argument("--json", action="store_true", help="print the full report as JSON")
    tok.set_defaults(func=_check_tokenizers)
    rules = sub.add_parser("rules", help="print the alert rules as Prometheus alerting rules (deploy/prometheus/)")
    rules.add_argument("--vllm", action="store_true", help="the variant over raw vllm:* metrics")
    rules.add_argument("--thresholds", help="JSON or YAML file of threshold overrides")
    rules.add_argument("--set", action="append", metavar="NAME=VALUE", help="override one threshold")
    rules.add_argument("--canary", action="store_true", help="the canary's rule over `specscope compare`'s gauges "
                       "(deploy/prometheus/specscope-canary-rules.yml)")
    rules.set_defaults(func=_rules)
    cal = sub.add_parser(
        "calibrate", help="measure the target's decode-step time by batch size, without speculation",
        description="Run the target model in vLLM without speculation at each batch size and write its "
        "decode-step times. With this baseline, specscope measures the draft's cost ratio c at every batch size "
        "instead of estimating it from parameter counts.")
    cal.add_argument("model", help="target model (as for vllm.LLM)")
    cal.add_argument("--batch-sizes", default="1,2,4,8,16", help="comma-separated batch sizes (default 1,2,4,8,16)")
    cal.add_argument("--tokens", type=int, default=64, help="tokens generated per request (default 64)")
    cal.add_argument("--max-rounds", type=int, default=MAX_ROUNDS,
                     help=f"time more rounds than the first 3 while they disagree, up to this many (default "
                          f"{MAX_ROUNDS})")
    cal.add_argument("--prompts", metavar="FILE",
                     help="calibrate on these prompts (the formats specscope evaluate takes) and a contrast set of "
                          "other lengths: a decode step's time grows with the context, and the verdict prices it at "
                          "the live engine's context (default: short generated prompts, and long ones)")
    cal.add_argument("--out", default="specscope-baseline.json", help="file to write")
    cal.add_argument("--engine-arg", action="append", metavar="NAME=VALUE",
                     help="a vllm.LLM argument; VALUE is JSON when it parses (e.g. max_model_len=512)")
    cal.set_defaults(func=_calibrate)
    ev = sub.add_parser(
        "evaluate", help="measure which draft and which K pay on your prompts, before deploying",
        description="Measure candidates (draft models, n-gram lookup) at each K beside the target without "
        "speculation, on your prompts with the batch held full at each batch size, engines alternating, medians of "
        "rounds: acceptance overall, by position and by traffic class, the measured and predicted speedup, the best "
        "K per batch size as vLLM's num_speculative_tokens_per_batch_size schedule, and that schedule measured.",
        epilog="exit status: 0 measured, 2 bad input, 1 the target without speculation stopped, 130 interrupted "
        "(these two write what was measured, marked partial).")
    from specscope.read.evaluate import add_arguments as add_evaluate_arguments

    add_evaluate_arguments(ev)
    ev.set_defaults(func=_evaluate)
    top = sub.add_parser("top", help="the terminal dashboard", description="The terminal dashboard over specscope "
                         "endpoints, vLLM or SGLang servers (a fleet when several are named), or a recording.")
    from specscope.read.tui import add_arguments

    add_arguments(top)
    top.set_defaults(func=_top)
    from specscope.read.compare import add_parser as add_compare

    add_compare(sub).set_defaults(func=_compare)
    rep = sub.add_parser(
        "report", help="one HTML page with plots, from an endpoint, a recording or the truth benchmark's results",
        description="Acceptance over time, by draft position and by output position, the expected speedup by K and "
        "the K table with vLLM's schedule, from a live specscope endpoint (polled for --duration), a recording "
        "(specscope top --record) or benchmarks/results/truth.json (predicted against measured speedup).",
        epilog="exit status: 0 written, 1 the endpoint is down, 2 bad input.")
    rep.add_argument("source", help="http(s)://... endpoint, a recording (JSON lines), or truth.json")
    rep.add_argument("-o", "--out", default="specscope-report.html", help="the page to write")
    rep.add_argument("--duration", type=float, default=30.0, help="seconds to poll an endpoint (default 30)")
    rep.add_argument("--interval", type=float, default=1.0, help="seconds between polls (default 1)")
    rep.add_argument("--window", type=float, default=30.0, help="window of the acceptance curve (default 30 s)")
    rep.add_argument("--baseline", metavar="FILE", help="step times without speculation (specscope calibrate)")
    rep.add_argument("--figures", metavar="DIR", help="also write each plot as a PNG into DIR")
    from specscope.core.auth import add_key_arguments

    add_key_arguments(rep, "the source")
    rep.set_defaults(func=_report)
    demo = sub.add_parser("demo", help="run a real engine through good and weak drafts with the dashboard open")
    demo.add_argument("--headless", action="store_true", help="no screen: run the scenarios, print what fired")
    demo.add_argument("--record", metavar="FILE", help="record the dashboard's snapshots to FILE")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``specscope`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # the reader went away (`specscope top --once | head`): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
