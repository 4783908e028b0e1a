"""The ``specscope evaluate`` command: its arguments (:func:`add_arguments`), the candidates they name, and the run
from the prompts file to the files written (:func:`main`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from specscope.core.bad_input import fail
from specscope.read.evaluate.render import render_html, render_text, to_dict
from specscope.read.evaluate.results import Candidate, Evaluation
from specscope.read.evaluate.runner import EngineStopped, Runner, gpu_memory_split
from specscope.read.evaluate.workload import InputError, load_prompts, prepare
from specscope.read.figures import matplotlib_missing

#: Candidates named by their method alone (no model path): n-gram lookup, and the target's own multi-token-prediction
#: layers.
BY_METHOD = ("ngram", "mtp")
#: Speculative heads, by vLLM's method name: they run with the target's tokenizer and read its hidden states.
HEADS = {"eagle3": "EAGLE-3", "eagle": "EAGLE-1"}
#: Exit status of an interrupted run (its partial results are written).
INTERRUPTED = 130


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
    parser.add_argument("--k", default="1,2,4,6", help="comma-separated K to measure (default 1,2,4,6)")
    parser.add_argument("--prompts", required=True, metavar="FILE",
                        help="JSON lines ({\"prompt\": ...} or {\"messages\": [...]}, optional \"class\" and "
                        "\"max_tokens\"), or ShareGPT JSON (each conversation's first human turn)")
    parser.add_argument("--batch-sizes", default="1,4,16", help="comma-separated batch sizes (default 1,4,16)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per measurement; the median is kept (default 3)")
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


def main(args: argparse.Namespace, engine_kw: dict[str, Any]) -> int:
    """Run ``specscope evaluate``: exit 0 done, 2 bad input, 1 the plain engine stopped and 130 interrupted (both
    with what was measured written, marked partial)."""
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
        prompts, no_human = load_prompts(args.prompts)
        candidates = _candidates(args)
    except InputError as exc:
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
        runner.run(ev, work, max_num_seqs)
    except KeyboardInterrupt:
        ev.partial, ev.note, code = True, "interrupted (Ctrl-C)", INTERRUPTED
        print("specscope evaluate: interrupted; writing what was measured", file=sys.stderr)
    except EngineStopped as exc:
        ev.partial, ev.note, code = True, str(exc), 1
        print(f"specscope evaluate: {exc}; writing what was measured", file=sys.stderr)
    finally:
        runner.close()
    if runner.ran:  # what the windows reached, which is what was measured
        ran = [work.classes[i] or "(prompt-length bucket)" for i in sorted(runner.ran)]
        ev.prompts["ran"] = len(ran)
        ev.prompts["classes_ran"] = {name: ran.count(name) for name in ev.prompts["classes"]}
    ev.seconds = time.monotonic() - t0
    return _write(ev, args) or code


def _candidates(args: argparse.Namespace) -> list[Candidate]:
    """The candidates, drafts' tokenizers checked (a mismatch refused unless ``--force``; heads run with the
    target's)."""
    from specscope.core.tokenizer_check import TokenizerCheckError, compare

    out = []
    for draft in args.draft:
        try:
            report = compare(args.target, draft)
        except TokenizerCheckError as exc:
            raise InputError(str(exc)) from None
        c = Candidate(draft, "draft_model", draft,
                      tokenizer={"verdict": report.verdict, "reasons": list(report.reasons),
                                 "warnings": list(report.warnings)})
        if report.verdict == "mismatch" and not args.force:
            c.status = "refused"
            c.note = "tokenizer mismatch (" + "; ".join(report.reasons)[:300] + "); --force measures it anyway"
        out.append(c)
    out += [Candidate(head, m, head) for m in HEADS for head in getattr(args, m)]
    out += [Candidate(m, m) for m in args.method]
    return out


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
