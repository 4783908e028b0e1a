"""The ``specscope evaluate`` command: its arguments (:func:`add_arguments`), the candidates they name, and the run
from the prompts file to the files written (:func:`main`). With ``--gate`` it compares one candidate draft with
the incumbent (``--incumbent``) class by class and decides promote / hold / reject
(:mod:`specscope.read.evaluate.gate`), its exit status the decision's (``gate.EXIT_CODES``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from specscope.core import classes
from specscope.core.bad_input import UsageError, fail
from specscope.read.evaluate import gate as gating
from specscope.read.evaluate.render import render_html, render_text, to_dict
from specscope.read.evaluate.results import Candidate, Evaluation, Gate, GateArm
from specscope.read.evaluate.runner import EngineStopped, Runner, gpu_memory_split
from specscope.read.figures import matplotlib_missing
from specscope.read.workload import InputError, Prompt, Workload, load_prompts, prepare

#: Candidates named by their method alone (no model path): n-gram lookup, and the target's own multi-token-prediction
#: layers.
BY_METHOD = ("ngram", "mtp")
#: Speculative heads, by vLLM's method name: they run with the target's tokenizer and read its hidden states.
HEADS = {"eagle3": "EAGLE-3", "eagle": "EAGLE-1"}
#: Exit status of an interrupted run (its partial results are written).
INTERRUPTED = 130
#: What ``--k``, ``--batch-sizes`` and ``--rounds`` default to: ranking candidates, and with ``--gate`` (one K, the
#: batch size served, and enough rounds for a t-interval to decide: with 3 its half-width is 4.3 standard errors).
DEFAULTS: dict[str, Any] = {"k": "1,2,4,6", "batch_sizes": "1,4,16", "rounds": 3}
GATE_DEFAULTS: dict[str, Any] = {"k": "4", "batch_sizes": "4", "rounds": 6}


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise InputError(f"{flag} takes positive integers like 1,4,16, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``evaluate`` subcommand's arguments."""
    parser.add_argument("target", help="target model (as for vllm.LLM)")
    parser.add_argument("--draft", action="append", default=[], metavar="MODEL",
                        help="a draft model to evaluate (draft_model speculation); repeatable")
    for method, name in HEADS.items():
        parser.add_argument(f"--{method}", action="append", default=[], metavar="HEAD",
                            help=f"an {name} head to evaluate (method {method}; it runs with the target's "
                            "tokenizer); repeatable")
    parser.add_argument("--method", action="append", default=[], choices=list(BY_METHOD),
                        help="a method to evaluate that needs no model path (ngram: prompt_lookup_min 2, max 4; mtp: "
                        "the target's own multi-token-prediction layers)")
    parser.add_argument("--k", help="comma-separated K to measure (default 1,2,4,6; with --gate one K, default 4)")
    parser.add_argument("--prompts", required=True, metavar="FILE",
                        help="JSON lines ({\"prompt\": ...} or {\"messages\": [...]}, optional \"class\" and "
                        "\"max_tokens\"), or ShareGPT JSON (each conversation's first human turn)")
    parser.add_argument("--batch-sizes", help="comma-separated batch sizes (default 1,4,16; with --gate 4: the gate "
                        "must pass at each one given)")
    parser.add_argument("--rounds", type=int, help="rounds per measurement; the median is kept (default 3; with "
                        "--gate 6, each round a window per class and draft, the interval from their spread)")
    parser.add_argument("--window-s", type=float, default=10.0,
                        help="seconds each measurement holds its batch full, counted once the batch turned over "
                             "once (default 10)")
    parser.add_argument("--max-tokens", type=int, default=128,
                        help="output tokens of a prompt without max_tokens, on average: each one's drawn from half "
                        "to 1.5 times it, as served lengths vary (default 128)")
    parser.add_argument("--data-parallel-size", type=int, default=1, metavar="N",
                        help="the server's data_parallel_size the advice is for: above 1 vLLM drops a per-batch-size "
                        "schedule, so the advice is one K (the engines here run one rank; default 1)")
    parser.add_argument("--engine-arg", action="append", metavar="NAME=VALUE",
                        help="a vllm.LLM argument for every engine; VALUE is JSON when it parses (e.g. "
                        "max_model_len=1024); prefix caching is off unless set here")
    parser.add_argument("-o", "--out", metavar="FILE", help="write the HTML report (plots embedded) to FILE")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
    parser.add_argument("--force", action="store_true", help="measure drafts whose tokenizer mismatches the target's")
    gate = parser.add_argument_group(
        "the promotion gate", "--gate compares one candidate (--draft, --eagle3 or --eagle, once) with the draft in "
        "production (--incumbent) on the same held-out prompts, class by class, and decides promote, hold or reject: "
        "promote where the traffic-weighted speedup of the candidate over the incumbent has its interval above 1 and "
        "no class loses more than --margin of its speedup; reject where that interval is below 1 or a class surely "
        "loses more; hold otherwise (not yet known: more rounds). Every prompt needs a \"class\". Exit status: 0 "
        "promote, 1 hold, 3 reject, 4 no decision (the incumbent's engine failed, or the plain one stopped), 2 bad "
        "input, 130 interrupted")
    gate.add_argument("--gate", action="store_true", help="decide promote / hold / reject (see above)")
    gate.add_argument("--incumbent", metavar="MODEL", help="the draft in production now, of the candidate's kind (a "
                      "draft model for --draft, a head for --eagle3 or --eagle)")
    gate.add_argument("--weak", metavar="CLASS", help="the class the candidate is meant to improve (the prompts file "
                      "must hold it); default: the class a --shares-from server's capture collects, else its lowest "
                      "acceptance, else the class with the incumbent's lowest acceptance measured")
    gate.add_argument("--shares-from", metavar="URL", help="weigh the classes by a live specscope endpoint's traffic "
                      "(each class's output tokens over the server's life) instead of the prompts file's")
    gate.add_argument("--margin", type=float, metavar="X", help=f"the largest loss of a class's speedup allowed, as "
                      f"a fraction of its speedup under the incumbent (default {gating.MARGIN})")
    from specscope.core.auth import add_key_arguments

    add_key_arguments(parser, "--shares-from")
    parser.epilog = ((parser.epilog + " " if parser.epilog else "") + "With --gate: 0 promote, 1 hold, 3 reject, 4 no "
                     "decision (the incumbent's engine failed or the plain one stopped; written, marked partial), 2 "
                     "bad input, 130 interrupted.")


def main(args: argparse.Namespace, engine_kw: dict[str, Any]) -> int:
    """Run ``specscope evaluate``: exit 0 done, 2 bad input, 1 the plain engine stopped and 130 interrupted (both
    with what was measured written, marked partial)."""
    defaults = GATE_DEFAULTS if args.gate else DEFAULTS
    args.k = args.k if args.k is not None else str(defaults["k"])
    args.batch_sizes = args.batch_sizes if args.batch_sizes is not None else str(defaults["batch_sizes"])
    args.rounds = args.rounds if args.rounds is not None else int(defaults["rounds"])
    plan: GatePlan | None = None
    try:
        ks, sizes = _ints(args.k, "--k"), _ints(args.batch_sizes, "--batch-sizes")
        if args.rounds < 1 or not args.window_s > 0 or args.max_tokens < 1 or args.data_parallel_size < 1:
            raise InputError("--rounds, --max-tokens and --data-parallel-size take positive integers, --window-s a "
                             "positive number")
        models = [*args.draft, *(h for m in HEADS for h in getattr(args, m))]
        if not models and not args.method:
            raise InputError("name at least one candidate: --draft MODEL, --eagle3 HEAD, --eagle HEAD or --method "
                             "ngram|mtp")
        if len(set(models)) < len(models) or len(set(args.method)) < len(args.method):
            raise InputError("each candidate once: a model or --method is named twice")
        if "speculative_config" in engine_kw:
            raise InputError("candidates come from --draft, --eagle3, --eagle and --method; drop speculative_config "
                             "from --engine-arg")
        if args.out and (missing := matplotlib_missing()):
            raise InputError(missing)
        for path in (args.out, args.json):
            if path and not Path(path).resolve().parent.is_dir():
                raise InputError(f"cannot write {path}: no such directory")
        _gate_flags(args, ks, engine_kw)
        prompts, no_human = load_prompts(args.prompts)
        if args.gate:
            plan = _gate_plan(args, prompts)
            candidates = [plan.candidate, plan.incumbent]
        else:
            candidates = _candidates(args)
    except (InputError, UsageError) as exc:
        return fail(str(exc))
    if all(c.status == "refused" for c in candidates):
        return fail("every draft's tokenizer mismatches the target's (see check-tokenizers); --force measures them")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # keep the progress lines readable
    engine_kw = {"enable_prefix_caching": False, **engine_kw}  # every round repeats the prompts
    if (share := gpu_memory_split(engine_kw)) is not None:
        engine_kw["gpu_memory_utilization"] = share
        print(f"specscope evaluate: two engines share the GPU (the target without speculation, one candidate): "
              f"gpu_memory_utilization {share} each (--engine-arg gpu_memory_utilization=X sets another)",
              file=sys.stderr)
    settings = {"k": ks, "batch_sizes": sizes, "rounds": args.rounds, "window_s": args.window_s,
                "max_tokens": args.max_tokens, "engine_args": engine_kw, "prompts_file": args.prompts,
                "data_parallel_size": args.data_parallel_size}
    if plan is not None:
        settings.update(gate=True, incumbent=plan.incumbent.name, shares_from=args.shares_from)
    ev = Evaluation(args.target, settings, candidates)
    for c in candidates:
        if c.status == "refused":
            print(f"specscope evaluate: {c.name}: {c.note}", file=sys.stderr)
    runner = Runner(args.target, engine_kw, args.rounds, args.window_s,
                    lambda line: print(f"specscope evaluate: {line}", file=sys.stderr, flush=True))
    t0 = time.monotonic()
    code = 0
    try:
        print(f"specscope evaluate: starting {args.target} without speculation", file=sys.stderr, flush=True)
        try:
            tokenizer, max_model_len, max_num_seqs = runner.start_plain()
        except Exception as exc:
            return fail(f"the engine did not start: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                        if str(exc) else f"the engine did not start: {type(exc).__name__}")
        try:
            work = prepare(prompts, tokenizer, max_model_len, args.max_tokens)
            if not work.prompts:
                raise InputError(f"no prompt fits: every prompt with its max_tokens is longer than max_model_len "
                                 f"{max_model_len}")
            if sizes[-1] > max_num_seqs:
                raise InputError(f"batch size {sizes[-1]} is above the engine's max_num_seqs {max_num_seqs}")
            if plan is not None:
                ev.gate = plan.gate(work, ks[0], sizes)
        except InputError as exc:
            return fail(str(exc))
        counts: dict[str, int] = {}
        for cls in work.classes:
            counts[cls or "(prompt-length bucket)"] = counts.get(cls or "(prompt-length bucket)", 0) + 1
        ev.prompts = {"used": len(work.prompts), "skipped_long": work.skipped_long,
                      "no_human_turn": no_human, "max_model_len": max_model_len, "classes": counts}
        if work.skipped_long:
            print(f"specscope evaluate: {work.skipped_long} prompts skipped: prompt + max_tokens longer than "
                  f"max_model_len {max_model_len}", file=sys.stderr)
        if ev.gate is not None:
            runner.run_gate(ev, work)
        else:
            runner.run(ev, work, max_num_seqs)
    except KeyboardInterrupt:
        ev.partial, ev.note, code = True, "interrupted (Ctrl-C)", INTERRUPTED
        print("specscope evaluate: interrupted; writing what was measured", file=sys.stderr)
    except EngineStopped as exc:
        ev.partial, ev.note = True, str(exc)
        code = gating.EXIT_CODES[gating.UNDECIDED] if ev.gate is not None else 1
        print(f"specscope evaluate: {exc}; writing what was measured", file=sys.stderr)
    finally:
        runner.close()
    if runner.ran:  # what the windows reached, which is what was measured
        ran = [work.classes[i] or "(prompt-length bucket)" for i in sorted(runner.ran)]
        ev.prompts["ran"] = len(ran)
        ev.prompts["classes_ran"] = {name: ran.count(name) for name in ev.prompts["classes"]}
    ev.seconds = time.monotonic() - t0
    if ev.gate is not None:
        _weak_measured(ev.gate)
        if ev.gate.incumbent.candidate.status == "failed":
            ev.partial, ev.note = True, ev.note or "the incumbent's engine failed: nothing to compare with"
        code = code or gating.decide(ev.gate).exit_code  # an interrupt or a stopped engine keeps its own
    return _write(ev, args) or code


def _checked(target: str, draft: str, force: bool) -> Candidate:
    """A draft model as a candidate, its tokenizer checked against the target's (a mismatch refused unless
    ``force``)."""
    from specscope.core.tokenizer_check import TokenizerCheckError, compare

    try:
        report = compare(target, draft)
    except TokenizerCheckError as exc:
        raise InputError(str(exc)) from None
    c = Candidate(draft, "draft_model", draft,
                  tokenizer={"verdict": report.verdict, "reasons": list(report.reasons),
                             "warnings": list(report.warnings)})
    if report.verdict == "mismatch" and not force:
        c.status = "refused"
        c.note = "tokenizer mismatch (" + "; ".join(report.reasons)[:300] + "); --force measures it anyway"
    return c


def _candidates(args: argparse.Namespace) -> list[Candidate]:
    """The candidates, drafts' tokenizers checked (a mismatch refused unless ``--force``; heads run with the
    target's)."""
    out = [_checked(args.target, draft, args.force) for draft in args.draft]
    out += [Candidate(head, m, head) for m in HEADS for head in getattr(args, m)]
    out += [Candidate(m, m) for m in args.method]
    return out


# -- the gate
def _gate_flags(args: argparse.Namespace, ks: list[int], engine_kw: dict[str, Any]) -> None:
    """The flags ``--gate`` needs, and those only it takes, checked before anything is read."""
    only = [flag for flag, value in (("--incumbent", args.incumbent), ("--weak", args.weak),
                                     ("--shares-from", args.shares_from), ("--margin", args.margin))
            if value is not None]
    if not args.gate:
        if only:
            raise InputError(f"{only[0]} goes with --gate (the promotion gate)")
        return
    if args.incumbent is None:
        raise InputError("--gate compares a candidate with the draft in production: name it with --incumbent MODEL")
    models = [*args.draft, *(h for m in HEADS for h in getattr(args, m))]
    if len(models) != 1 or args.method:
        raise InputError("--gate compares one candidate with the incumbent: name one --draft, --eagle3 or --eagle "
                         f"(got {len(models) + len(args.method)})")
    if args.incumbent == models[0]:
        raise InputError(f"the candidate and the incumbent are the same model ({args.incumbent})")
    if len(ks) != 1:
        raise InputError(f"--gate compares the drafts at one K, the one served: --k N (got {args.k})")
    if args.margin is not None and not 0.0 <= args.margin < 1.0:
        raise InputError(f"--margin takes a fraction from 0 to 1 (0.05: a class may lose 5% of its speedup), got "
                         f"{args.margin:g}")
    if engine_kw.get("enable_prefix_caching"):
        raise InputError("--gate keeps prefix caching off (no engine may be served a prompt from a cache): drop "
                         "enable_prefix_caching from --engine-arg")
    if args.weak is not None and classes.clean(args.weak) is None and args.weak not in classes.PROMPT_BUCKETS:
        raise InputError(f"--weak {args.weak[:60]!r} is not a class name")


class GatePlan:
    """What ``--gate`` knows before an engine starts: the two drafts (tokenizers checked), the weak class, and the
    live traffic's shares where ``--shares-from`` gives them."""

    def __init__(self, candidate: Candidate, incumbent: Candidate, margin: float, weak: str | None, weak_basis: str,
                 live: tuple[dict[str, float], float, str] | None) -> None:
        self.candidate, self.incumbent, self.margin = candidate, incumbent, margin
        self.weak, self.weak_basis, self.live = weak, weak_basis, live

    def gate(self, work: Workload, k: int, sizes: list[int]) -> Gate:
        """The gate over the prompts that fit: each class's share of their output tokens (or the live ones); bad
        input where the weak class or a class of the file has no prompt left."""
        tokens: dict[str, int] = {}
        for name, n in zip(work.classes, work.max_tokens, strict=True):
            tokens[name or ""] = tokens.get(name or "", 0) + n
        if self.weak is not None and self.weak not in tokens:
            raise InputError(f"no prompt of the weak class {self.weak} fits in max_model_len {work.max_model_len}")
        if self.live is not None:
            shares, coverage, source = self.live
            shares = {c: shares.get(c, 0.0) for c in tokens}
        else:
            total = sum(tokens.values())
            shares, coverage, source = {c: n / total for c, n in tokens.items()}, None, "prompts file (output tokens)"
        return Gate(k, sizes, GateArm(self.candidate), GateArm(self.incumbent), shares, source, coverage,
                    self.margin, self.weak, self.weak_basis)


def _gate_plan(args: argparse.Namespace, prompts: list[Prompt]) -> GatePlan:
    """Everything ``--gate`` checks before an engine starts (each failure one line, exit 2): every prompt has a class,
    the incumbent's tokenizer (and a candidate draft's) is the target's, the weak class is in the file, and
    ``--shares-from`` reads as a specscope endpoint with traffic in the file's classes."""
    unclassed = sum(p.traffic_class is None for p in prompts)
    if unclassed:
        raise InputError(f"--gate weighs traffic classes: {unclassed} of {len(prompts)} prompts in {args.prompts} "
                         "have no \"class\"")
    in_file = sorted({p.traffic_class for p in prompts if p.traffic_class is not None})
    kind = next(m for m in ("draft", *HEADS) if getattr(args, m))
    model = getattr(args, kind)[0]
    if kind == "draft":
        candidate, incumbent = _checked(args.target, model, args.force), _checked(args.target, args.incumbent,
                                                                                    args.force)
    else:  # heads run with the target's tokenizer
        candidate, incumbent = Candidate(model, kind, model), Candidate(args.incumbent, kind, args.incumbent)
    for role, c in (("incumbent", incumbent), ("candidate", candidate)):
        if c.status == "refused":
            why = "; ".join((c.tokenizer or {}).get("reasons", []))[:300]
            raise InputError(f"the {role}'s tokenizer mismatches the target's ({why}); --force compares it anyway")
    weak, basis = args.weak, "--weak" if args.weak else ""
    live = None
    if args.shares_from:
        snap = _live(args)
        try:
            shares, coverage = gating.shares_from_snapshot(snap, in_file)
        except ValueError as exc:
            raise InputError(f"--shares-from {args.shares_from}: {exc}") from None
        live = shares, coverage, f"{args.shares_from} (output tokens over the server's life)"
        if weak is None and (found := gating.weak_from_snapshot(snap)) is not None:
            weak, basis = found[0], f"{found[1]} at {args.shares_from}"
    if weak is not None and weak not in in_file:
        raise InputError(f"{args.prompts} has no prompt of the weak class {weak} ({basis}), the class the candidate "
                         f"is meant to improve; its classes: {', '.join(in_file)}")
    margin = gating.MARGIN if args.margin is None else args.margin
    return GatePlan(candidate, incumbent, margin, weak, basis, live)


def _live(args: argparse.Namespace) -> Any:
    """The snapshot at ``--shares-from`` (the API key sent where it may go); InputError where it cannot be read."""
    from specscope.core.auth import key_headers
    from specscope.read.scrape import EndpointSource, SourceError

    headers = key_headers([args.shares_from], args.api_key, args.api_key_host, "--shares-from")[0]
    try:
        return EndpointSource(args.shares_from, timeout=10.0, headers=headers).fetch()
    except SourceError as exc:
        raise InputError(f"--shares-from: cannot read a specscope snapshot: {exc}") from None


def _weak_measured(gate: Gate) -> None:
    """Without ``--weak`` or a live server's say, the weak class is the one the incumbent's acceptance is lowest on."""
    if gate.weak is not None:
        return
    rates = [(n.acceptance_rate, name) for name, n in gate.incumbent.acceptance.items()
             if n.acceptance_rate is not None]
    if rates:
        gate.weak, gate.weak_basis = min(rates)[1], "the incumbent's lowest acceptance measured"


def _write(ev: Evaluation, args: argparse.Namespace) -> int:
    """Print the summary and write the files asked for; 2 where one cannot be written."""
    sys.stdout.write(render_text(ev))
    try:
        if args.json:
            Path(args.json).write_text(json.dumps(to_dict(ev), indent=1) + "\n", encoding="utf-8")
            print(f"wrote {args.json}")
        if args.out:
            Path(args.out).write_text(render_html(ev), encoding="utf-8")
            print(f"wrote {args.out}")
    except OSError as exc:
        return fail(f"cannot write the results: {exc.strerror or exc}")
    return 0
